//! `attach-detach-controller`: flags in, `attach_detach::run` until SIGTERM/SIGINT.

use std::sync::Arc;

use attach_detach::Flags;
use clap::Parser;
use component_runtime::{RuntimeShape, normalize_go_args, run_component};

/// EC2 for the in-tree aws-ebs plugin (`--cloud-provider=aws`), as the EBS driver builds it.
#[cfg(feature = "aws")]
async fn aws_cloud(flags: &Flags) -> anyhow::Result<Option<Arc<dyn ebs_cloud::Cloud>>> {
    use anyhow::Context as _;
    if !flags.wants_aws_cloud()? {
        return Ok(None);
    }
    let cloud = ebs_cloud_aws::in_tree_cloud(
        "attach-detach-controller",
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
            "--cloud-provider=aws: this attach-detach-controller was built without the `aws` feature (no EC2 client); rebuild with default features, or leave CSIMigrationAWS on (the default) so the EBS CSI driver serves in-tree volumes"
        );
    }
    Ok(None)
}

fn main() -> anyhow::Result<()> {
    let flags = Flags::parse_from(normalize_go_args(std::env::args_os()));
    run_component(
        flags.telemetry.v,
        RuntimeShape::PerCore,
        |shutdown| async move {
            let cloud = aws_cloud(&flags).await?;
            let config = flags.config(cloud)?;
            attach_detach::run(config, shutdown).await?;
            Ok(())
        },
    )
}
