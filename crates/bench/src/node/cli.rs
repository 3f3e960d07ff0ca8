//! `csi-bench node`: the node side's benchmark (pod-volume-ready latency, teardown, agent memory).

use std::path::PathBuf;

use crate::harness::cli::{Named as _, select};
use crate::harness::output::ReportFlags;
use crate::node::{Binaries, LoadConfig, Scenario, ScenarioReport};
use anyhow::Context as _;
use clap::Parser;

/// Pod volume to Ready on real node processes (driver, registrar, node agent).
///
/// Measures pod-volume-ready latency on real node processes: per node the CSI driver's node
/// plugin, csi-node-driver-registrar and csi-node-agent run as child processes (each with its
/// own root dir under a temp dir) against an in-process apiserver-lite, attach/detach
/// controller and, where needed, csi-attacher (and ec2-sim + the EBS controller for `ebs`).
/// Volumes are created and PVs/PVCs bound first; then --pods pods (spec.nodeName set, one PVC
/// each) are created at once, round robin over --nodes nodes, and each is timed from just
/// before its create call until a pods watch sees Ready=True (posted by the agent). Then all
/// pods are deleted and timed until gone and until nothing is mounted. The agents' VmRSS and
/// VmHWM are read once every pod is Ready.
///
/// Scenarios: hostpath-attach-required, hostpath-bypass, hostpath-through-adc, ebs, or all.
///
///   csi-bench node --scenario all --nodes 5 --pods 200
///   csi-bench node --scenario hostpath-bypass --nodes 1 --pods 200 --json
///   csi-bench node --scenario hostpath-bypass --nodes 1 --pods 100 --background 10000
#[derive(Debug, Parser)]
#[command(verbatim_doc_comment)]
pub struct Flags {
    /// Scenario to run (a comma list or the flag repeated for more, or `all`):
    /// hostpath-attach-required, hostpath-bypass, hostpath-through-adc, ebs.
    #[arg(
        long = "scenario",
        default_value = "all",
        value_name = "SCENARIO[,...]"
    )]
    scenarios: Vec<String>,

    /// Directory with csi-node-agent, csi-node-driver-registrar, hostpath-csi-driver and
    /// ebs-csi-driver (default: the directory of this binary).
    #[arg(long, value_name = "DIR")]
    bin_dir: Option<PathBuf>,

    /// csi-node-agent binary (default: BIN_DIR/csi-node-agent).
    #[arg(long, value_name = "PATH")]
    node_agent_bin: Option<PathBuf>,

    /// csi-node-driver-registrar binary (default: BIN_DIR/csi-node-driver-registrar).
    #[arg(long, value_name = "PATH")]
    registrar_bin: Option<PathBuf>,

    /// hostpath-csi-driver binary (default: BIN_DIR/hostpath-csi-driver).
    #[arg(long, value_name = "PATH")]
    hostpath_driver_bin: Option<PathBuf>,

    /// ebs-csi-driver binary (default: BIN_DIR/ebs-csi-driver).
    #[arg(long, value_name = "PATH")]
    ebs_driver_bin: Option<PathBuf>,

    #[command(flatten)]
    config: LoadConfig,

    #[command(flatten)]
    report: ReportFlags,
}

async fn run_all(config: LoadConfig, list: Vec<Scenario>) -> anyhow::Result<Vec<ScenarioReport>> {
    let mut reports = Vec::new();
    for sc in list {
        eprintln!(
            "csi-bench node: {} with {} pods on {} nodes ({} background pods elsewhere)...",
            sc.name(),
            config.pods,
            config.nodes,
            config.background
        );
        let r = crate::node::run_scenario(&config, sc)
            .await
            .with_context(|| format!("scenario {}", sc.name()))?;
        reports.push(r);
    }
    Ok(reports)
}

/// Runs the benchmark and prints its report.
pub async fn run(f: Flags) -> anyhow::Result<()> {
    let (list, _) = select(&f.scenarios).map_err(anyhow::Error::msg)?;
    let bin_dir = match f.bin_dir {
        Some(d) => d,
        None => crate::harness::child::default_bin_dir()?,
    };
    let mut binaries = Binaries::in_dir(&bin_dir);
    if let Some(p) = f.node_agent_bin {
        binaries.node_agent = p;
    }
    if let Some(p) = f.registrar_bin {
        binaries.registrar = p;
    }
    if let Some(p) = f.hostpath_driver_bin {
        binaries.hostpath_driver = p;
    }
    if let Some(p) = f.ebs_driver_bin {
        binaries.ebs_driver = p;
    }
    let config = LoadConfig {
        binaries,
        ..f.config
    };
    let reports = run_all(config, list).await?;
    f.report.emit(&reports, |r| crate::node::report::table(r))?;
    Ok(())
}
