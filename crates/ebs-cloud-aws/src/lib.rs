//! `AwsCloud`: the `aws-sdk-ec2` + `aws-config` implementation of [`ebs_cloud::Cloud`].
//!
//! - region from the config (a flag), else `aws-config`'s chain: `AWS_REGION`, the profile,
//!   instance metadata (IMDS);
//! - endpoint override (`--ec2-endpoint` / `AWS_EC2_ENDPOINT`) for ec2-sim, moto or a VPC
//!   endpoint;
//! - retries: the SDK's own retry is off and [`ec2::Ec2`] retries throttled and transient
//!   failures itself with jittered exponential backoff, so that every attempt (and every
//!   throttle) is counted per action in [`ebs_cloud::CloudMetrics`];
//! - DescribeVolumes / DescribeInstances by ID go through [`ebs_cloud::Batcher`]s.

mod cloud;
mod convert;
mod ec2;
mod imds;

use std::time::Duration;

pub use cloud::AwsCloud;
pub use ebs_cloud::{BatchConfig, Cloud, CloudError, CloudMetrics};
pub use imds::{IMDS_ENDPOINT_ENV, instance_identity};

/// Everything [`AwsCloud::new`] needs.
#[derive(Debug, Clone)]
pub struct AwsConfig {
    /// Region; `None` asks `aws-config`'s default chain (env, profile, IMDS).
    pub region: Option<String>,
    /// EC2 endpoint URL override (`http://127.0.0.1:PORT` for ec2-sim).
    pub endpoint: Option<String>,
    /// Fixed credentials (the embedded simulator, tests); `None` uses the default chain.
    pub static_credentials: Option<(String, String)>,
    /// Appended to the SDK's User-Agent as its app name (`--user-agent-extra`).
    pub app_name: Option<String>,
    pub batching: BatchConfig,
    pub retry: RetryPolicy,
    /// Bound on one HTTP attempt, so a hung endpoint becomes a retryable failure.
    pub attempt_timeout: Duration,
    /// How waits poll: first delay, growth factor 1.5, at most `poll_max`.
    pub poll_initial: Duration,
    pub poll_max: Duration,
    /// How long CreateVolume waits for `available` (a volume from a large snapshot is slow).
    pub create_timeout: Duration,
}

impl Default for AwsConfig {
    fn default() -> Self {
        Self {
            region: None,
            endpoint: None,
            static_credentials: None,
            app_name: None,
            batching: BatchConfig::default(),
            retry: RetryPolicy::default(),
            attempt_timeout: Duration::from_secs(30),
            poll_initial: Duration::from_millis(100),
            poll_max: Duration::from_secs(2),
            create_timeout: Duration::from_secs(300),
        }
    }
}

/// Retries of throttled (RequestLimitExceeded...) and transient (5xx, connection) failures.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Attempts per call, the first included.
    pub max_attempts: u32,
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 8,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
        }
    }
}

/// EC2 for Kubernetes' in-tree aws-ebs plugin when `wanted` (`--cloud-provider=aws` of the
/// attach/detach and PV controllers), built as the EBS driver builds its own: `app_name` in
/// the SDK's User-Agent; an empty or absent `region`/`endpoint` leaves them to `aws-config`'s
/// chain.
pub async fn in_tree_cloud(
    wanted: bool,
    app_name: &str,
    region: Option<&str>,
    endpoint: Option<&str>,
) -> Result<Option<std::sync::Arc<dyn Cloud>>, Error> {
    if !wanted {
        return Ok(None);
    }
    let given = |v: Option<&str>| v.filter(|v| !v.is_empty()).map(str::to_owned);
    let config = AwsConfig {
        region: given(region),
        endpoint: given(endpoint),
        app_name: Some(app_name.to_owned()),
        ..AwsConfig::default()
    };
    let cloud = AwsCloud::new(config, CloudMetrics::default()).await?;
    Ok(Some(std::sync::Arc::new(cloud)))
}

/// Errors building the client.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "no AWS region: pass --region, set AWS_REGION, or run on EC2 where instance metadata has it"
    )]
    NoRegion,
    #[error("invalid {field}: {reason}")]
    Invalid { field: &'static str, reason: String },
    /// Instance metadata (IMDS) did not answer or answered nonsense.
    #[error("instance metadata: {0}")]
    Metadata(String),
    #[error(transparent)]
    Cloud(#[from] CloudError),
}
