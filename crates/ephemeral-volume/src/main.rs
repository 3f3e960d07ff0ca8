//! `csi-ephemeral-volume-controller`: flags in, `ephemeral_volume::run` until SIGTERM/SIGINT.

use clap::Parser;
use component_runtime::{RuntimeShape, normalize_go_args, run_component};
use ephemeral_volume::Flags;

fn main() -> anyhow::Result<()> {
    let flags = Flags::parse_from(normalize_go_args(std::env::args_os()));
    run_component(
        flags.controller.telemetry.v,
        RuntimeShape::PerCore,
        |shutdown| async move {
            let config = flags.config();
            let client = flags
                .controller
                .client
                .client(&ephemeral_volume::user_agent())
                .await?;
            ephemeral_volume::run(client, config, shutdown).await?;
            Ok(())
        },
    )
}
