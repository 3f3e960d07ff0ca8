//! `pv-controller`: flags in, `pv_controller::run` until SIGTERM/SIGINT.

use anyhow::Context as _;
use clap::Parser;
use component_runtime::{RuntimeShape, normalize_go_args, run_component};
use pv_controller::Flags;

// EC2 for the in-tree aws-ebs plugin (`--cloud-provider=aws`); built without the `aws`
// feature, this binary links no EC2 client and refuses the flag.
#[cfg(not(feature = "aws"))]
use ebs_cloud::in_tree_cloud_without_ec2 as in_tree_cloud;
#[cfg(feature = "aws")]
use ebs_cloud_aws::in_tree_cloud;

fn main() -> anyhow::Result<()> {
    let flags = Flags::parse_from(normalize_go_args(std::env::args_os()));
    run_component(
        flags.controller.telemetry.v,
        RuntimeShape::PerCore,
        |shutdown| async move {
            let c = &flags.cloud;
            let (region, endpoint) = (c.region.as_deref(), c.ec2_endpoint.as_deref());
            let cloud = in_tree_cloud(c.wants_aws()?, "pv-controller", region, endpoint)
                .await
                .context("--cloud-provider=aws")?;
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
