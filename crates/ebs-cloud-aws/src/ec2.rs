//! The SDK client, one place that sends every request (retries, metrics) and turns EC2's error
//! codes into [`CloudError`]s.

use std::future::Future;
use std::time::{Duration, Instant};

use aws_sdk_ec2::config::retry::RetryConfig;
use aws_sdk_ec2::config::timeout::TimeoutConfig;
use aws_sdk_ec2::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_ec2::error::{ProvideErrorMetadata, SdkError};
use ebs_cloud::{CloudError, CloudMetrics};

use crate::{AwsConfig, Error, RetryPolicy};

/// Builds the SDK client the way production does: `aws-config`'s chains for region and
/// credentials, with the overrides from the config.
pub(crate) async fn build_client(config: &AwsConfig) -> Result<aws_sdk_ec2::Client, Error> {
    let mut loader = aws_config::defaults(BehaviorVersion::latest())
        // Ec2::call retries, and counts each attempt.
        .retry_config(RetryConfig::disabled())
        .timeout_config(
            TimeoutConfig::builder()
                .operation_attempt_timeout(config.attempt_timeout)
                .build(),
        );
    if let Some(region) = &config.region {
        if region.is_empty() {
            return Err(Error::Invalid {
                field: "region",
                reason: "must not be empty".into(),
            });
        }
        loader = loader.region(Region::new(region.clone()));
    }
    if let Some(endpoint) = &config.endpoint {
        if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
            return Err(Error::Invalid {
                field: "ec2_endpoint",
                reason: format!("'{endpoint}' is not an http:// or https:// URL"),
            });
        }
        loader = loader.endpoint_url(endpoint.clone());
    }
    if let Some(name) = &config.app_name {
        let app = aws_config::AppName::new(name.clone()).map_err(|e| Error::Invalid {
            field: "user_agent_extra",
            reason: format!("'{name}': {e}"),
        })?;
        loader = loader.app_name(app);
    }
    if let Some((key, secret)) = &config.static_credentials {
        loader = loader.credentials_provider(Credentials::new(
            key.clone(),
            secret.clone(),
            None,
            None,
            "ebs-csi-driver-static",
        ));
    }
    let sdk = loader.load().await;
    if sdk.region().is_none() {
        return Err(Error::NoRegion);
    }
    Ok(aws_sdk_ec2::Client::new(&sdk))
}

/// One failed EC2 call: the action, EC2's error code and message.
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    pub(crate) action: &'static str,
    pub(crate) code: String,
    pub(crate) message: String,
}

const THROTTLE_CODES: &[&str] = &[
    "RequestLimitExceeded",
    "Throttling",
    "ThrottlingException",
    "RequestThrottled",
    "RequestThrottledException",
    "TooManyRequestsException",
    "SlowDown",
];
const TRANSIENT_CODES: &[&str] = &[
    "InternalError",
    "InternalFailure",
    "ServiceUnavailable",
    "Unavailable",
    "DispatchFailure",
    "Timeout",
    "ResponseError",
];
const INVALID_CODES: &[&str] = &[
    "InvalidParameterValue",
    "InvalidParameter",
    "InvalidParameterCombination",
    "InvalidParameterDependency",
    "MissingParameter",
    "InvalidZone.NotFound",
    "UnknownVolumeType",
    "InvalidSnapshot.InUse",
    "VolumeTypeNotAvailableInZone",
];

impl Failure {
    pub(crate) fn is(&self, code: &str) -> bool {
        self.code == code
    }

    pub(crate) fn is_not_found(&self) -> bool {
        (self.code.ends_with(".NotFound") && self.code != "InvalidZone.NotFound")
            || self.code.ends_with(".Malformed")
    }

    fn throttled(&self) -> bool {
        THROTTLE_CODES.contains(&self.code.as_str())
    }

    fn transient(&self) -> bool {
        TRANSIENT_CODES.contains(&self.code.as_str())
    }

    /// The EC2 code as a [`CloudError`]; `id` names the object for NotFound.
    pub(crate) fn into_cloud(self, id: &str) -> CloudError {
        let kind = match self.code.split('.').next().unwrap_or("") {
            "InvalidVolume" | "InvalidVolumeID" => "volume",
            "InvalidInstanceID" => "instance",
            "InvalidSnapshot" | "InvalidSnapshotID" => "snapshot",
            "InvalidAttachment" => "attachment",
            _ => "object",
        };
        if self.is_not_found() {
            return CloudError::not_found(kind, id);
        }
        if self.throttled() {
            return CloudError::Throttled {
                action: self.action,
                message: self.message,
            };
        }
        match self.code.as_str() {
            "IdempotentParameterMismatch" => CloudError::IdempotentParameterMismatch {
                what: "volume",
                name: id.to_string(),
            },
            "VolumeInUse" => CloudError::VolumeInUse {
                volume_id: id.to_string(),
                message: self.message,
            },
            "AttachmentLimitExceeded" => CloudError::AttachmentLimit {
                instance_id: id.to_string(),
                message: self.message,
            },
            c if INVALID_CODES.contains(&c) => CloudError::InvalidArgument {
                action: self.action,
                code: self.code,
                message: self.message,
            },
            _ => CloudError::Other {
                action: self.action,
                code: self.code,
                message: self.message,
            },
        }
    }
}

fn classify<E: ProvideErrorMetadata>(action: &'static str, e: &SdkError<E>) -> Failure {
    let (code, message) = match e {
        SdkError::ServiceError(_) => (
            e.code().unwrap_or("Unknown").to_string(),
            e.message().unwrap_or("").to_string(),
        ),
        SdkError::TimeoutError(_) => ("Timeout".to_string(), "the request timed out".into()),
        SdkError::DispatchFailure(d) => ("DispatchFailure".to_string(), format!("{d:?}")),
        SdkError::ResponseError(r) => ("ResponseError".to_string(), format!("{r:?}")),
        _ => (
            "ConstructionFailure".to_string(),
            "the request could not be built".to_string(),
        ),
    };
    Failure {
        action,
        code,
        message,
    }
}

/// The client plus the retry policy and metrics. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Ec2 {
    pub(crate) client: aws_sdk_ec2::Client,
    pub(crate) metrics: CloudMetrics,
    pub(crate) retry: RetryPolicy,
}

impl Ec2 {
    /// Sends one logical request: `send` builds and sends it, and is called again for each
    /// retry of a throttled or transient failure, with jittered exponential backoff.
    pub(crate) async fn call<T, E, Fut>(
        &self,
        action: &'static str,
        mut send: impl FnMut() -> Fut,
    ) -> Result<T, Failure>
    where
        Fut: Future<Output = Result<T, SdkError<E>>>,
        E: ProvideErrorMetadata,
    {
        let mut backoff = self.retry.initial_backoff;
        let mut attempt = 1;
        loop {
            let started = Instant::now();
            let result = send().await;
            let elapsed = started.elapsed();
            let failure = match result {
                Ok(v) => {
                    self.metrics.record(action, None, elapsed, false);
                    return Ok(v);
                }
                Err(e) => classify(action, &e),
            };
            let throttled = failure.throttled();
            self.metrics
                .record(action, Some(&failure.code), elapsed, throttled);
            if !(throttled || failure.transient()) || attempt >= self.retry.max_attempts {
                tracing::debug!(action, code = %failure.code, message = %failure.message, attempt, "EC2 call failed");
                return Err(failure);
            }
            tracing::debug!(action, code = %failure.code, attempt, ?backoff, "EC2 call will be retried");
            tokio::time::sleep(jitter(backoff)).await;
            backoff = (backoff * 2).min(self.retry.max_backoff);
            attempt += 1;
        }
    }
}

/// "Equal jitter": half the backoff fixed, half random, so that many throttled callers spread
/// out instead of retrying in lockstep.
fn jitter(d: Duration) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|t| t.subsec_nanos())
        .unwrap_or(0);
    let half = d / 2;
    half + half.mul_f64(f64::from(nanos % 1000) / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(code: &str) -> Failure {
        Failure {
            action: "X",
            code: code.into(),
            message: "m".into(),
        }
    }

    #[test]
    fn codes_map_to_cloud_errors() {
        assert!(
            f("InvalidVolume.NotFound")
                .into_cloud("vol-1")
                .is_not_found()
        );
        assert!(
            f("InvalidVolumeID.Malformed")
                .into_cloud("x")
                .is_not_found()
        );
        assert!(matches!(
            f("InvalidZone.NotFound").into_cloud("z"),
            CloudError::InvalidArgument { .. }
        ));
        assert!(matches!(
            f("RequestLimitExceeded").into_cloud("v"),
            CloudError::Throttled { .. }
        ));
        assert!(matches!(
            f("IdempotentParameterMismatch").into_cloud("pvc-1"),
            CloudError::IdempotentParameterMismatch { .. }
        ));
        assert!(matches!(
            f("AttachmentLimitExceeded").into_cloud("i-1"),
            CloudError::AttachmentLimit { .. }
        ));
        assert!(matches!(
            f("IncorrectState").into_cloud("v"),
            CloudError::Other { .. }
        ));
    }

    #[test]
    fn jitter_stays_within_half_and_full() {
        let d = Duration::from_millis(100);
        for _ in 0..20 {
            let j = jitter(d);
            assert!(j >= d / 2 && j <= d, "{j:?}");
        }
    }
}
