//! `csi-node-agent`: flags in, `node_agent::run` until SIGTERM/SIGINT.

use clap::Parser;
use component_runtime::{RuntimeShape, normalize_go_args, run_component};
use node_agent::Flags;

/// Few threads on purpose: the agent mostly waits on the API server, the drivers and the
/// kernel, and every thread that allocates gets its own malloc arena (about 1 MiB each once a
/// burst of mounts went through). File and mount-table reads go to the blocking pool, which
/// would otherwise grow to hundreds of threads in a burst.
const RUNTIME: RuntimeShape = RuntimeShape::Fixed {
    workers: 1,
    max_blocking: Some(2),
};

fn main() -> anyhow::Result<()> {
    let flags = Flags::parse_from(normalize_go_args(std::env::args_os()));
    let config = flags.config()?;
    run_component(flags.telemetry.v, RUNTIME, |shutdown| async move {
        node_agent::run(config, shutdown).await?;
        Ok(())
    })
}
