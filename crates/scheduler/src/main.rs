//! `csi-scheduler`: flags in, `scheduler::run` until SIGTERM/SIGINT.

use clap::Parser;
use component_runtime::{RuntimeShape, normalize_go_args, run_component};
use scheduler::Flags;

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
                .client(&scheduler::user_agent())
                .await?;
            scheduler::run(client, config, shutdown).await?;
            Ok(())
        },
    )
}
