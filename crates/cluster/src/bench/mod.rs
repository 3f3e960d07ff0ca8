//! `csi-cluster bench`: pod-volume-ready latency, API writes per pod, provisioning throughput
//! and each component's memory, per scenario, on throw-away clusters.

use crate::Error;

/// `csi-cluster bench` flags.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchFlags {
    /// text or json.
    #[arg(long, short = 'o', default_value = "text", value_name = "text|json")]
    pub output: String,
}

/// Runs the benchmark.
pub async fn run(_flags: BenchFlags) -> Result<(), Error> {
    Err(Error::Config("csi-cluster bench is being built".into()))
}
