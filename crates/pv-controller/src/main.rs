//! `pv-controller`: flags in, `pv_controller::run` until SIGTERM/SIGINT.

use std::sync::Arc;

use clap::Parser;
use component_runtime::{CloudFlags, RuntimeShape, normalize_go_args, run_component};
use pv_controller::Flags;

const BINARY: &str = "pv-controller";

/// What to do instead of `--cloud-provider=aws` with a binary built without EC2.
#[cfg(not(feature = "aws"))]
const WITHOUT_AWS: &str = "leave CSIMigrationAWS on (the default) so the EBS CSI driver's provisioner serves kubernetes.io/aws-ebs classes";

/// EC2 for the in-tree aws-ebs plugin (`--cloud-provider=aws`); a binary built without the
/// `aws` feature has no EC2 client and refuses the flag.
async fn cloud(flags: &CloudFlags) -> anyhow::Result<Option<Arc<dyn ebs_cloud::Cloud>>> {
    #[cfg(not(feature = "aws"))]
    return Ok(flags.refuse_aws(BINARY, WITHOUT_AWS).map(|()| None)?);
    #[cfg(feature = "aws")]
    {
        use anyhow::Context as _;
        let (region, endpoint) = (flags.region.as_deref(), flags.ec2_endpoint.as_deref());
        let cloud = ebs_cloud_aws::in_tree_cloud(flags.wants_aws()?, BINARY, region, endpoint);
        cloud
            .await
            .context("--cloud-provider=aws: setting up EC2 access")
    }
}

fn main() -> anyhow::Result<()> {
    let flags = Flags::parse_from(normalize_go_args(std::env::args_os()));
    run_component(
        flags.controller.telemetry.v,
        RuntimeShape::PerCore,
        |shutdown| async move {
            let config = flags.config(cloud(&flags.cloud).await?)?;
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
