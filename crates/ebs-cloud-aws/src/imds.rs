//! This instance's identity from EC2 instance metadata (IMDSv2), for the node side started
//! without `--node-id`, as the Go driver's node DaemonSet is: the Helm chart and kustomize
//! manifests pass no node ID. Needs no credentials.

use std::time::Duration;

use aws_config::imds::Client;

use crate::Error;

/// The endpoint override the AWS SDKs read (`http://169.254.169.254` by default).
pub const IMDS_ENDPOINT_ENV: &str = "AWS_EC2_METADATA_SERVICE_ENDPOINT";

/// The instance ID and availability zone, from `endpoint` or else the SDK's default
/// (`AWS_EC2_METADATA_SERVICE_ENDPOINT`, else the link-local address).
pub async fn instance_identity(endpoint: Option<&str>) -> Result<(String, String), Error> {
    let mut builder = Client::builder()
        .max_attempts(2)
        .connect_timeout(Duration::from_secs(1))
        .read_timeout(Duration::from_secs(2));
    let from_env = std::env::var(IMDS_ENDPOINT_ENV).ok();
    if let Some(url) = endpoint.or(from_env.as_deref()) {
        builder = builder.endpoint(url).map_err(|e| Error::Invalid {
            field: "instance metadata endpoint",
            reason: format!("'{url}': {e}"),
        })?;
    }
    let client = builder.build();
    let get = |path: &'static str| {
        let client = client.clone();
        async move {
            client
                .get(path)
                .await
                .map(|v| v.as_ref().trim().to_string())
                .map_err(|e| Error::Metadata(format!("{path}: {e}")))
        }
    };
    let instance_id = get("/latest/meta-data/instance-id").await?;
    let zone = get("/latest/meta-data/placement/availability-zone").await?;
    if instance_id.is_empty() || zone.is_empty() {
        return Err(Error::Metadata(
            "instance metadata returned an empty instance ID or zone".into(),
        ));
    }
    Ok((instance_id, zone))
}
