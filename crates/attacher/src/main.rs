//! `csi-attacher`: flags in, `attacher::run` until SIGTERM/SIGINT.

use anyhow::Context as _;
use clap::Parser;

/// Runtime threads unless `TOKIO_WORKER_THREADS` says otherwise. The attacher waits on the API
/// server and the driver; one thread keeps up with 1,000 VolumeAttachments at unlimited QPS
/// (faster than two: nothing crosses threads; docs/benchmarks.md), while tokio's default (one
/// per core) gives a 64-core node 64 threads, each with its own stack and malloc arena.
const DEFAULT_THREADS: usize = 1;

fn runtime_threads() -> usize {
    std::env::var("TOKIO_WORKER_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|n| *n > 0)
        .unwrap_or(DEFAULT_THREADS)
}

fn main() -> anyhow::Result<()> {
    let config = attacher::Config::parse_from(sidecar::normalize_go_args(std::env::args_os()));
    sidecar::init_logging(config.common.v);
    let threads = runtime_threads();
    let mut builder = if threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(threads);
        b
    };
    builder
        .enable_all()
        .build()
        .context("starting the tokio runtime")?
        .block_on(async {
            let shutdown = sidecar::shutdown_on_signals();
            attacher::run(config, shutdown).await
        })?;
    Ok(())
}
