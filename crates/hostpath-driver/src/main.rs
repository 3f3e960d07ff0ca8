//! `hostpath-csi-driver`: flags into a config ([`hostpath_driver::flags`]), then the
//! library's `run`.

use anyhow::Context;
use hostpath_driver::flags::Flags;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let flags = Flags::from_args();
    flags.init_logging();
    // SIGTERM (kubelet, systemd) or SIGINT: stop serving and remove the socket.
    let shutdown = telemetry::shutdown_on_signals();
    hostpath_driver::run(flags.into_config(), shutdown.cancelled_owned())
        .await
        .context("hostpath-csi-driver")
}
