//! `csi-provisioner`: flags in, `provisioner::run` until SIGTERM/SIGINT.

use anyhow::Context as _;
use clap::Parser;

fn main() -> anyhow::Result<()> {
    let config = provisioner::Config::parse_from(sidecar::normalize_go_args(std::env::args_os()));
    sidecar::init_logging(config.common.v);
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?
        .block_on(async {
            let shutdown = sidecar::shutdown_on_signals();
            provisioner::run(config, shutdown).await
        })?;
    Ok(())
}
