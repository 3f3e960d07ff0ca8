//! The node side's benchmark (docs/csi-bench/node.md). Per scenario it starts an in-process
//! control plane (apiserver-lite, the attach/detach controller, csi-attacher when the scenario
//! needs one, ec2-sim and the EBS controller process for `ebs`) and, per node, the real
//! processes a node runs: the CSI driver's node plugin, `csi-node-driver-registrar` and
//! `csi-node-agent`, each with its own root dir under a temp dir. Volumes are created and
//! PVs/PVCs bound before the clock starts; then the pods (already scheduled, one PVC each) are
//! created all at once, round robin over the nodes, and a pods watch times each pod from just
//! before its create call until the agent posts it Ready. Then every pod is deleted and timed
//! until it is gone (unpublished, unstaged and the deletion confirmed by the agent). The
//! agents' memory (VmRSS, VmHWM) is read once every pod is Ready. `--background N` first
//! fills the cluster with N PVs, bound PVCs and pods of other nodes, to show what the agents'
//! memory owes to cluster-wide objects.
//!
//! [`run_scenario`] runs one scenario and returns a [`ScenarioReport`]; `csi-bench node`
//! prints a table or JSON. `docs/csi-bench/node.md` has usage and what each number means.

pub mod cli;
mod env;
mod pods;
pub mod report;
mod run_objects;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

pub use crate::harness::cli::Named;

use crate::harness::ebs;

pub use env::CpuSplit;

use crate::Error;
pub use report::ScenarioReport;

/// The User-Agent of the benchmark's own API requests.
pub const USER_AGENT: &str = concat!("csi-bench-node/", env!("CARGO_PKG_VERSION"));

/// What runs and how the CSIDriver and the attach/detach path are set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// Hostpath driver, CSIDriver attachRequired true: VolumeAttachments, marked attached by
    /// csi-attacher's trivial handler (the driver has no ControllerPublish).
    HostpathAttachRequired,
    /// Hostpath driver, attachRequired false, `--skip-attach=bypass-adc` (today's Kubernetes).
    HostpathBypass,
    /// Hostpath driver, attachRequired false, `--skip-attach=through-adc` (the skip-attach
    /// design as written in 2018, docs/design/skip-attach.md: listed in volumesAttached by the
    /// ADC, no VolumeAttachment).
    HostpathThroughAdc,
    /// The EBS CSI driver against ec2-sim (loop devices): attach-required, real attach, mkfs.
    Ebs,
}

impl Named for Scenario {
    const ALL: &'static [Self] = &[
        Scenario::HostpathAttachRequired,
        Scenario::HostpathBypass,
        Scenario::HostpathThroughAdc,
        Scenario::Ebs,
    ];

    fn name(self) -> &'static str {
        match self {
            Scenario::HostpathAttachRequired => "hostpath-attach-required",
            Scenario::HostpathBypass => "hostpath-bypass",
            Scenario::HostpathThroughAdc => "hostpath-through-adc",
            Scenario::Ebs => "ebs",
        }
    }
}

crate::harness::cli::display_by_name!(Scenario);

impl Scenario {
    pub(crate) fn attach_required(self) -> bool {
        matches!(self, Scenario::HostpathAttachRequired | Scenario::Ebs)
    }

    pub(crate) fn skip_attach(self) -> volume_plugins::SkipAttachMode {
        match self {
            Scenario::HostpathThroughAdc => volume_plugins::SkipAttachMode::ThroughAdc,
            _ => volume_plugins::SkipAttachMode::BypassAdc,
        }
    }

    pub(crate) fn skip_attach_flag(self) -> &'static str {
        match self.skip_attach() {
            volume_plugins::SkipAttachMode::ThroughAdc => "through-adc",
            volume_plugins::SkipAttachMode::BypassAdc => "bypass-adc",
        }
    }

    pub(crate) fn is_ebs(self) -> bool {
        self == Scenario::Ebs
    }

    pub(crate) fn driver_name(self) -> &'static str {
        if self.is_ebs() {
            ebs::DRIVER
        } else {
            HOSTPATH_DRIVER
        }
    }
}

/// The hostpath driver's default name (`hostpath-csi-driver --drivername`).
pub const HOSTPATH_DRIVER: &str = "hostpath.csi.k8s.io";

/// The binaries each node runs.
#[derive(Debug, Clone)]
pub struct Binaries {
    pub node_agent: PathBuf,
    pub registrar: PathBuf,
    pub hostpath_driver: PathBuf,
    /// Only for the `ebs` scenario.
    pub ebs_driver: PathBuf,
}

impl Binaries {
    /// `csi-node-agent`, `csi-node-driver-registrar`, `hostpath-csi-driver` and
    /// `ebs-csi-driver` in `dir`.
    pub fn in_dir(dir: &Path) -> Self {
        Self {
            node_agent: dir.join("csi-node-agent"),
            registrar: dir.join("csi-node-driver-registrar"),
            hostpath_driver: dir.join("hostpath-csi-driver"),
            ebs_driver: dir.join("ebs-csi-driver"),
        }
    }

    /// The binaries a scenario needs that do not exist.
    pub fn missing(&self, scenario: Scenario) -> Vec<PathBuf> {
        let mut need = vec![&self.node_agent, &self.registrar];
        need.push(if scenario.is_ebs() {
            &self.ebs_driver
        } else {
            &self.hostpath_driver
        });
        need.into_iter().filter(|p| !p.is_file()).cloned().collect()
    }
}

/// One run of one scenario: the `csi-bench node` flags but the scenarios and binaries.
#[derive(Debug, Clone, clap::Args)]
pub struct LoadConfig {
    #[arg(skip = Binaries::in_dir(Path::new(".")))]
    pub binaries: Binaries,
    /// Nodes (each: driver, registrar, agent); pod i runs on node-(i % N).
    #[arg(long, default_value_t = 5)]
    pub nodes: usize,
    /// Pods, one PVC + PV + volume each.
    #[arg(long, default_value_t = 200)]
    pub pods: usize,
    /// The benchmark's own creates and deletes in flight.
    #[arg(long, default_value_t = 32)]
    pub parallelism: usize,
    /// Limit for each phase: setup, ready, delete (Go duration: 90s, 10m).
    #[arg(long, default_value = "10m", value_parser = component_runtime::parse_go_duration)]
    pub timeout: Duration,
    /// An extra csi-node-agent argument (repeat for more), e.g. --agent-arg=--kube-api-qps=-1;
    /// after the benchmark's own.
    #[arg(long = "agent-arg", allow_hyphen_values = true, value_name = "ARG")]
    pub agent_args: Vec<String>,
    /// csi-attacher's workers (its --worker-threads; the Go sidecar's default is 10).
    #[arg(long, default_value_t = 10)]
    pub attacher_workers: usize,
    /// Create one pod at a time, each once the one before is Ready: the latency of one pod on
    /// idle nodes, without queueing behind the others.
    #[arg(long)]
    pub sequential: bool,
    /// Before the measured pods, create N background PVs (the scenario's driver, a made-up
    /// volume handle), PVCs bound to them and pods using them on nodes elsewhere-0..9, where no
    /// agent runs: the rest of a big cluster, which a node agent must not pay for. Deleted
    /// after the measured pods.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub background: usize,
    /// Keep every process's log in DIR/SCENARIO/ (default: in the temp dir, removed with it).
    #[arg(long, value_name = "DIR")]
    pub log_dir: Option<PathBuf>,
    /// Where the temp dir goes (default: the system's).
    #[arg(skip)]
    pub temp_parent: Option<PathBuf>,
}

impl Default for LoadConfig {
    fn default() -> Self {
        crate::harness::cli::defaults(&[])
    }
}

/// Runs one scenario: sets everything up, times the pods, tears everything down.
pub async fn run_scenario(
    config: &LoadConfig,
    scenario: Scenario,
) -> Result<ScenarioReport, Error> {
    if config.nodes == 0 || config.pods == 0 || config.parallelism == 0 {
        return Err(Error::Config(
            "--nodes, --pods and --parallelism must be at least 1".into(),
        ));
    }
    if config.attacher_workers == 0 {
        return Err(Error::Config(
            "--attacher-workers must be at least 1".into(),
        ));
    }
    let missing = config.binaries.missing(scenario);
    if !missing.is_empty() {
        let list: Vec<String> = missing.iter().map(|p| p.display().to_string()).collect();
        return Err(Error::Config(format!(
            "{}: missing binaries: {} (build them: see docs/csi-bench/node.md)",
            scenario.name(),
            list.join(", ")
        )));
    }
    let mut env = env::Env::start(config, scenario).await?;
    let result = pods::measure(&mut env, config, scenario).await;
    let teardown = env.shutdown().await;
    let mut report = result?;
    report.mounts_left_at_end = teardown.mounts_left;
    Ok(report)
}
