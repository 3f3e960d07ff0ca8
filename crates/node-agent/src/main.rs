//! `csi-node-agent`: flags in, `node_agent::run` until SIGTERM/SIGINT.

use anyhow::Context as _;
use clap::Parser;
use node_agent::Flags;

fn main() -> anyhow::Result<()> {
    let flags = Flags::parse_from(sidecar::normalize_go_args(std::env::args_os()));
    sidecar::init_logging(flags.v);
    let config = flags.config()?;
    tokio::runtime::Builder::new_multi_thread()
        // File and mount-table reads go to the blocking pool; a burst of 200 mounts would
        // otherwise grow it to hundreds of threads (and megabytes of stacks) for a moment's
        // work. Eight is plenty for what is mostly waiting on the kernel and the drivers.
        .max_blocking_threads(8)
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
