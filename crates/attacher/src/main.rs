//! `csi-attacher`: flags in, `attacher::run` until SIGTERM/SIGINT.

use anyhow::Context as _;
use clap::Parser;

/// Runtime worker threads unless `TOKIO_WORKER_THREADS` says otherwise. The attacher waits on
/// the API server and the driver; two threads keep up with 1,000 VolumeAttachments at unlimited
/// QPS (docs/benchmarks.md), while tokio's default (one per core) would give a 64-core node 64
/// threads, each with its own stack and malloc arena.
const WORKER_THREADS: usize = 2;

fn worker_threads() -> usize {
    std::env::var("TOKIO_WORKER_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|n| *n > 0)
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map_or(1, usize::from)
                .min(WORKER_THREADS)
        })
}

fn main() -> anyhow::Result<()> {
    let config = attacher::Config::parse_from(sidecar::normalize_go_args(std::env::args_os()));
    sidecar::init_logging(config.common.v);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(worker_threads())
        .enable_all()
        .build()
        .context("starting the tokio runtime")?
        .block_on(async {
            let shutdown = sidecar::shutdown_on_signals();
            attacher::run(config, shutdown).await
        })?;
    Ok(())
}
