//! `csi-attacher`: flags in, `attacher::run` until SIGTERM/SIGINT.

use clap::Parser;
use component_runtime::{RuntimeShape, normalize_go_args, run_component};

/// One thread unless `TOKIO_WORKER_THREADS` says otherwise. The attacher waits on the API
/// server and the driver; one thread keeps up with 1,000 VolumeAttachments at unlimited QPS
/// (faster than two: nothing crosses threads; docs/benchmarks.md), while tokio's default (one
/// per core) gives a 64-core node 64 threads, each with its own stack and malloc arena.
fn runtime_shape() -> RuntimeShape {
    match std::env::var("TOKIO_WORKER_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        Some(workers) if workers > 1 => RuntimeShape::Fixed {
            workers,
            max_blocking: None,
        },
        _ => RuntimeShape::CurrentThread,
    }
}

fn main() -> anyhow::Result<()> {
    let config = attacher::Config::parse_from(normalize_go_args(std::env::args_os()));
    run_component(config.common.v, runtime_shape(), |shutdown| async move {
        attacher::run(config, shutdown).await?;
        Ok(())
    })
}
