//! `pv-controller`: flags in, `pv_controller::run` until SIGTERM/SIGINT.

use std::sync::Arc;

use clap::Parser;
use component_runtime::{RuntimeShape, normalize_go_args, run_component};
use pv_controller::Flags;

/// EC2 for the in-tree aws-ebs provisioner (`--cloud-provider=aws`), as the EBS driver builds it.
#[cfg(feature = "aws")]
async fn aws_cloud(flags: &Flags) -> anyhow::Result<Option<Arc<dyn ebs_cloud::Cloud>>> {
    use anyhow::Context as _;
    if !flags.wants_aws_cloud()? {
        return Ok(None);
    }
    let cloud = ebs_cloud_aws::in_tree_cloud(
        "pv-controller",
        flags.region.as_deref(),
        flags.ec2_endpoint.as_deref(),
    )
    .await
    .context("--cloud-provider=aws: setting up EC2 access (--region, --ec2-endpoint)")?;
    Ok(Some(cloud))
}

/// Built without the `aws` feature: no EC2 client in this binary.
#[cfg(not(feature = "aws"))]
async fn aws_cloud(flags: &Flags) -> anyhow::Result<Option<Arc<dyn ebs_cloud::Cloud>>> {
    if flags.wants_aws_cloud()? {
        anyhow::bail!(
            "--cloud-provider=aws: this pv-controller was built without the `aws` feature (no EC2 client); rebuild with default features, or leave CSIMigrationAWS on (the default) so the EBS CSI driver's provisioner serves kubernetes.io/aws-ebs classes"
        );
    }
    Ok(None)
}

fn main() -> anyhow::Result<()> {
    let flags = Flags::parse_from(normalize_go_args(std::env::args_os()));
    run_component(
        flags.controller.telemetry.v,
        RuntimeShape::PerCore,
        |shutdown| async move {
            let cloud = aws_cloud(&flags).await?;
            let config = flags.config(cloud)?;
            let client = flags
                .controller
                .client
                .client(&pv_controller::user_agent())
                .await?;
            pv_controller::run(client, config, shutdown).await?;
            Ok(())
        },
    )
}
