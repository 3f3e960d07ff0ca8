//! Reading the EC2 error code the SDK parsed out of an error response.

use aws_sdk_ec2::error::{ProvideErrorMetadata, SdkError};

/// What a failed SDK call looked like on the wire, as the SDK parsed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ec2Failure {
    /// The `<Code>` of the EC2 error XML, if the SDK got one.
    pub code: Option<String>,
    pub message: Option<String>,
    /// The HTTP status of the response, if there was a response.
    pub status: Option<u16>,
    /// The SDK's own description (connector or timeout errors have no code).
    pub display: String,
}

/// The code, message and HTTP status of an SDK error.
pub fn failure<E, R>(err: &SdkError<E, R>) -> Ec2Failure
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug + HttpStatus,
{
    Ec2Failure {
        code: err.code().map(str::to_string),
        message: err.message().map(str::to_string),
        status: err.raw_response().map(HttpStatus::status_code),
        display: aws_sdk_ec2::error::DisplayErrorContext(err).to_string(),
    }
}

/// The error code of a result that is expected to fail; `Err` with a description of the
/// response when the call unexpectedly succeeded.
pub fn expect_code<T: std::fmt::Debug, E, R>(
    result: Result<T, SdkError<E, R>>,
) -> Result<Ec2Failure, String>
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug + HttpStatus,
{
    match result {
        Ok(output) => Err(format!(
            "expected an EC2 error, the call succeeded: {output:?}"
        )),
        Err(err) => Ok(failure(&err)),
    }
}

/// The HTTP status of a raw response (implemented for the SDK's response type).
pub trait HttpStatus {
    fn status_code(&self) -> u16;
}

impl HttpStatus for aws_sdk_ec2::config::http::HttpResponse {
    fn status_code(&self) -> u16 {
        self.status().as_u16()
    }
}
