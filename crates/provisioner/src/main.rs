//! `csi-provisioner`: flags in, `provisioner::run` until SIGTERM/SIGINT.

use clap::Parser;
use component_runtime::{RuntimeShape, normalize_go_args, run_component};

fn main() -> anyhow::Result<()> {
    let config = provisioner::Config::parse_from(normalize_go_args(std::env::args_os()));
    run_component(
        config.common.v,
        RuntimeShape::PerCore,
        |shutdown| async move {
            provisioner::run(config, shutdown).await?;
            Ok(())
        },
    )
}
