//! `csi-attacher`: flags in, `attacher::run` until SIGTERM/SIGINT.

use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = attacher::Config::parse_from(sidecar::normalize_go_args(std::env::args_os()));
    sidecar::init_logging(config.common.v);
    let shutdown = sidecar::shutdown_on_signals();
    attacher::run(config, shutdown).await?;
    Ok(())
}
