//! Builds the real `aws-sdk-ec2` client the way a production caller would, pointed at a local
//! endpoint (ec2-sim or moto_server) with static test credentials.

use std::time::Duration;

use aws_sdk_ec2::config::retry::RetryConfig;
use aws_sdk_ec2::config::timeout::TimeoutConfig;
use aws_sdk_ec2::config::{BehaviorVersion, Credentials, Region};

/// How the SDK retries. Error-code tests turn retries off so that a throttled or failed call
/// surfaces as the exact error the endpoint sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retries {
    /// One attempt per call.
    Off,
    /// The SDK's standard retry mode with this many attempts and a short backoff, so that tests
    /// which retry through throttling stay quick.
    Standard { max_attempts: u32 },
}

/// Options for [`client_with`].
#[derive(Clone, Debug)]
pub struct ClientOptions {
    pub region: String,
    pub retries: Retries,
    /// Bound on one whole operation (all attempts), so a hung endpoint fails a test instead of
    /// hanging it.
    pub operation_timeout: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            region: crate::REGION.to_string(),
            retries: Retries::Off,
            operation_timeout: Duration::from_secs(30),
        }
    }
}

/// The key pair every client here signs with (and [`crate::SimServer`] accepts).
pub const CREDENTIALS: (&str, &str) = ("AKIDCONFORMANCE", "conformance-secret");

/// A client for `endpoint` in [`crate::REGION`] with retries off.
pub fn client(endpoint: &str) -> aws_sdk_ec2::Client {
    client_with(endpoint, &ClientOptions::default())
}

/// A client for `endpoint` with explicit options.
pub fn client_with(endpoint: &str, options: &ClientOptions) -> aws_sdk_ec2::Client {
    let retry = match options.retries {
        Retries::Off => RetryConfig::disabled(),
        Retries::Standard { max_attempts } => RetryConfig::standard()
            .with_max_attempts(max_attempts)
            .with_initial_backoff(Duration::from_millis(20))
            .with_max_backoff(Duration::from_millis(200)),
    };
    let config = aws_sdk_ec2::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(options.region.clone()))
        .credentials_provider(Credentials::new(
            CREDENTIALS.0,
            CREDENTIALS.1,
            None,
            None,
            "ec2-conformance",
        ))
        .endpoint_url(endpoint)
        .retry_config(retry)
        .timeout_config(
            TimeoutConfig::builder()
                .operation_timeout(options.operation_timeout)
                .build(),
        )
        .build();
    aws_sdk_ec2::Client::from_conf(config)
}
