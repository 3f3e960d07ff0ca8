//! `csi-node-agent`: flags in, `node_agent::run` until SIGTERM/SIGINT.

use anyhow::Context as _;
use clap::Parser;
use node_agent::Flags;

fn main() -> anyhow::Result<()> {
    let flags = Flags::parse_from(sidecar::normalize_go_args(std::env::args_os()));
    sidecar::init_logging(flags.v);
    let config = flags.config()?;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?
        .block_on(async {
            sidecar::install_crypto_provider();
            let shutdown = sidecar::shutdown_on_signals();
            node_agent::run(config, shutdown).await?;
            Ok(())
        })
}
