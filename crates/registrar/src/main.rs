//! `csi-node-driver-registrar`: flags in, `registrar::run` until SIGTERM/SIGINT.

use anyhow::Context as _;
use clap::Parser;

fn main() -> anyhow::Result<()> {
    let config = registrar::Config::parse_from(telemetry::normalize_go_args(std::env::args_os()));
    telemetry::init_logging(config.v);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?
        .block_on(async {
            let shutdown = telemetry::shutdown_on_signals();
            registrar::run(config, shutdown).await
        })?;
    Ok(())
}
