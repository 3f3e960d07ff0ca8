//! `ebs-csi-driver`: flags into a config ([`ebs_driver::flags`]), then the library's `run`.

use anyhow::Context;
use ebs_driver::flags::{Command, Flags};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let flags = Flags::from_args();
    flags.init_logging();
    let config = match flags.into_command()? {
        Command::Serve(config) => *config,
        Command::PreStopHook => {
            tracing::info!("pre-stop-hook: nothing to wait for");
            return Ok(());
        }
    };
    // SIGTERM (kubelet, systemd) or SIGINT (Ctrl-C).
    let shutdown = telemetry::shutdown_on_signals();
    ebs_driver::run(config, shutdown.cancelled_owned())
        .await
        .context("ebs-csi-driver")
}
