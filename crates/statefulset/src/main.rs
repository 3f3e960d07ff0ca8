//! `statefulset-controller`: flags in, `statefulset::run` until SIGTERM/SIGINT.

use clap::Parser;
use component_runtime::{RuntimeShape, normalize_go_args, run_component};
use statefulset::Flags;

fn main() -> anyhow::Result<()> {
    let flags = Flags::parse_from(normalize_go_args(std::env::args_os()));
    run_component(
        flags.controller.telemetry.v,
        RuntimeShape::PerCore,
        |shutdown| async move {
            let config = flags.config()?;
            let client = flags
                .controller
                .client
                .client(&statefulset::user_agent())
                .await?;
            statefulset::run(client, config, shutdown).await?;
            Ok(())
        },
    )
}
