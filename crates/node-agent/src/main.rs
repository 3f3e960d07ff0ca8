//! `csi-node-agent`: flags in, `node_agent::run` until SIGTERM/SIGINT.

use anyhow::Context as _;
use clap::Parser;
use node_agent::Flags;

fn main() -> anyhow::Result<()> {
    let flags = Flags::parse_from(sidecar::normalize_go_args(std::env::args_os()));
    sidecar::init_logging(flags.v);
    let config = flags.config()?;
    tokio::runtime::Builder::new_multi_thread()
        // Few threads on purpose: the agent mostly waits on the API server, the drivers and
        // the kernel, and every thread that allocates gets its own malloc arena (about
        // 1 MiB each once a burst of mounts went through). File and mount-table reads go to
        // the blocking pool, which would otherwise grow to hundreds of threads in a burst.
        .worker_threads(1)
        .max_blocking_threads(2)
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
