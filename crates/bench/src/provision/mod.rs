//! The benchmark of `csi-provisioner` (docs/csi-bench/provision.md). Per scenario it
//! starts, on a fresh temp dir:
//!
//! - in-process: apiserver-lite (127.0.0.1:0, audit on), the PV controller
//!   (`pv_controller::run`, kube-controller-manager's binder) and, for `ebs`, ec2-sim with fast
//!   timing;
//! - as child processes, so that their memory and CPU are their own: `csi-provisioner` (the Go
//!   sidecar's flags) and the CSI driver's controller: `hostpath-csi-driver`, or
//!   `ebs-csi-driver --mode=controller` against ec2-sim.
//!
//! A StorageClass (Immediate, reclaim Delete) of the driver, one Node with its CSINode (the
//! provisioner's topology comes from them), then N PVCs created at once (bounded client
//! parallelism), each timed from just before its create call until a PVC watch sees it
//! `Bound`. Then every PVC is deleted and each timed until a PV watch sees its volume gone
//! (DeleteVolume done, finalizers removed). The API writes of each phase are split by
//! component from the API server's audit trail (User-Agent: the provisioner's binary name, or
//! `pv-controller/`), and the provisioner's and the driver's VmRSS/VmHWM and CPU time are read
//! from `/proc`.
//!
//! [`run`] runs the configured scenarios `runs` times (interleaved) and returns a [`Report`];
//! [`run_scenario`] runs one. `csi-bench provision` prints a table (median (min-max) over
//! the runs) or JSON. `docs/csi-bench/provision.md` has usage and what each number means.

pub mod cli;
mod env;
mod measure;
pub mod report;
mod run_objects;
mod table;
mod watch;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

pub use crate::harness::cli::Named;

pub use report::{Report, ScenarioReport};

use crate::Error;
use crate::harness::writes::Parties;

/// Who writes besides the benchmark. The provisioner is known by its binary's file name, the PV
/// controller by `pv-controller/` (`pv_controller::user_agent`); anything else should not
/// exist, and the report lists its User-Agents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Party {
    Provisioner,
    PvController,
    Other,
}

/// The parties of a run with the provisioner binary `provisioner_bin`.
pub(crate) fn parties(provisioner_bin: &Path) -> Parties<Party> {
    let pv_controller = pv_controller::user_agent();
    let pv_controller_name = pv_controller.split('/').next().unwrap_or("pv-controller");
    let provisioner = match provisioner_bin.file_name() {
        Some(_) => provisioner_bin,
        None => Path::new("csi-provisioner"),
    };
    Parties::new(USER_AGENT, Party::Other)
        .with_binary(provisioner, Party::Provisioner)
        .with_prefix(format!("{pv_controller_name}/"), Party::PvController)
}

/// The User-Agent of the benchmark's own API requests.
pub const USER_AGENT: &str = concat!("csi-bench-provision/", env!("CARGO_PKG_VERSION"));

/// Which driver provisions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// `hostpath-csi-driver` (controller and node in one process): CreateVolume makes a
    /// directory.
    Hostpath,
    /// `ebs-csi-driver --mode=controller` against ec2-sim (fast timing): CreateVolume is
    /// EC2 CreateVolume plus the describe calls until the volume is available.
    Ebs,
}

impl Named for Scenario {
    const ALL: &'static [Self] = &[Scenario::Hostpath, Scenario::Ebs];

    fn name(self) -> &'static str {
        match self {
            Scenario::Hostpath => "hostpath",
            Scenario::Ebs => "ebs",
        }
    }
}

crate::harness::cli::display_by_name!(Scenario);

impl Scenario {
    /// The PVCs of a run unless `--pvcs` says otherwise (the sizes the provisioner's benchmark
    /// was specified with: 1,000 hostpath PVCs, 100 EBS PVCs).
    pub fn default_pvcs(self) -> usize {
        match self {
            Scenario::Hostpath => 1000,
            Scenario::Ebs => 100,
        }
    }

    /// The CSI driver name (the StorageClass's provisioner).
    pub fn driver_name(self) -> &'static str {
        match self {
            Scenario::Hostpath => "hostpath.csi.k8s.io",
            Scenario::Ebs => "ebs.csi.aws.com",
        }
    }
}

/// The binaries that run as child processes.
#[derive(Debug, Clone)]
pub struct Binaries {
    pub provisioner: PathBuf,
    pub hostpath_driver: PathBuf,
    pub ebs_driver: PathBuf,
}

impl Binaries {
    /// `csi-provisioner`, `hostpath-csi-driver` and `ebs-csi-driver` in `dir`.
    pub fn in_dir(dir: &Path) -> Self {
        Self {
            provisioner: dir.join("csi-provisioner"),
            hostpath_driver: dir.join("hostpath-csi-driver"),
            ebs_driver: dir.join("ebs-csi-driver"),
        }
    }

    pub fn driver(&self, scenario: Scenario) -> &Path {
        match scenario {
            Scenario::Hostpath => &self.hostpath_driver,
            Scenario::Ebs => &self.ebs_driver,
        }
    }

    /// The binaries a scenario needs that are not files.
    pub fn missing(&self, scenario: Scenario) -> Vec<PathBuf> {
        [self.provisioner.as_path(), self.driver(scenario)]
            .into_iter()
            .filter(|p| !p.is_file())
            .map(Path::to_path_buf)
            .collect()
    }
}

/// What to run.
#[derive(Debug, Clone, clap::Args)]
pub struct LoadConfig {
    #[arg(skip = Binaries::in_dir(Path::new(".")))]
    pub binaries: Binaries,
    /// Run in this order, each run on a fresh API server with fresh processes (the CLI's
    /// --scenario).
    #[arg(skip = Scenario::ALL.to_vec())]
    pub scenarios: Vec<Scenario>,
    /// Run the scenario(s) this many times, in turn; the table shows median (min-max).
    #[arg(long, default_value_t = 1)]
    pub runs: usize,
    /// PVCs per run (default: hostpath 1000, ebs 100).
    #[arg(long)]
    pub pvcs: Option<usize>,
    /// The benchmark's own creates and deletes in flight.
    #[arg(long, default_value_t = 32)]
    pub parallelism: usize,
    /// The provisioner's --worker-threads (the Go sidecar's default: 100).
    #[arg(long, default_value_t = 100)]
    pub worker_threads: usize,
    /// The provisioner's --kube-api-qps (-1: unlimited, so the benchmark measures the work and
    /// not the Go sidecar's default token bucket of 5/10).
    #[arg(long, default_value_t = -1.0, allow_negative_numbers = true)]
    pub kube_api_qps: f32,
    /// The provisioner's --kube-api-burst (the Go sidecar's default: 10).
    #[arg(long, default_value_t = 10)]
    pub kube_api_burst: u32,
    /// An extra provisioner argument (repeat for more), e.g. --provisioner-arg=--v=2; after the
    /// benchmark's own.
    #[arg(
        long = "provisioner-arg",
        allow_hyphen_values = true,
        value_name = "ARG"
    )]
    pub provisioner_args: Vec<String>,
    /// Limit for each phase: start-up, all Bound, all deleted (Go duration: 90s, 10m).
    #[arg(long, default_value = "10m", value_parser = component_runtime::parse_go_duration)]
    pub timeout: Duration,
    /// How long the processes run on after all Bound and after all deleted before that
    /// phase's writes are counted, so that late writes (the pv-protection finalizer, Events)
    /// land in the phase that caused them. Not part of any time in the report.
    #[arg(long, default_value = "3s", value_parser = component_runtime::parse_go_duration)]
    pub settle: Duration,
    /// Keep the processes' logs in DIR/SCENARIO-RUN/ (default: in the temp dir, removed).
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

impl LoadConfig {
    /// The PVCs of one run of `scenario`.
    pub fn pvcs_of(&self, scenario: Scenario) -> usize {
        self.pvcs.unwrap_or_else(|| scenario.default_pvcs())
    }

    fn validate(&self) -> Result<(), Error> {
        if self.runs == 0 || self.parallelism == 0 || self.worker_threads == 0 {
            return Err(Error::Config(
                "--runs, --parallelism and --worker-threads must be at least 1".into(),
            ));
        }
        if self.pvcs == Some(0) {
            return Err(Error::Config("--pvcs must be at least 1".into()));
        }
        if self.scenarios.is_empty() {
            return Err(Error::Config("no scenario to run".into()));
        }
        for &s in &self.scenarios {
            let missing = self.binaries.missing(s);
            if !missing.is_empty() {
                let list: Vec<String> = missing.iter().map(|p| p.display().to_string()).collect();
                return Err(Error::Config(format!(
                    "{s}: missing binaries: {} (build them: see docs/csi-bench/provision.md)",
                    list.join(", ")
                )));
            }
        }
        Ok(())
    }
}

/// Runs every configured scenario `runs` times, interleaved (so a load that comes and goes on
/// the machine spreads over every scenario). Processes, servers and temp dirs are stopped and
/// removed on every way out, errors included.
pub async fn run(config: LoadConfig) -> Result<Report, Error> {
    config.validate()?;
    let mut scenarios = Vec::with_capacity(config.scenarios.len() * config.runs);
    for run in 1..=config.runs {
        for &s in &config.scenarios {
            tracing::info!(scenario = %s, run, pvcs = config.pvcs_of(s), "scenario starts");
            scenarios.push(run_scenario(&config, s, run).await?);
        }
    }
    Ok(Report {
        runs: config.runs,
        settle_s: config.settle.as_secs_f64(),
        scenarios,
    })
}

/// One run of one scenario: sets everything up, measures, tears everything down.
pub async fn run_scenario(
    config: &LoadConfig,
    scenario: Scenario,
    run: usize,
) -> Result<ScenarioReport, Error> {
    config.validate()?;
    let started = std::time::Instant::now();
    let mut env = env::Env::start(config, scenario, run).await?;
    let result = measure::measure(&mut env, config, scenario, run, started).await;
    env.shutdown().await;
    result
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn scenarios_parse_and_default_their_size() {
        use crate::harness::cli::parse;
        assert_eq!(parse::<Scenario>("ebs"), Ok(Scenario::Ebs));
        assert!(
            parse::<Scenario>("nfs")
                .unwrap_err()
                .contains("hostpath, ebs")
        );
        let c = LoadConfig::default();
        assert_eq!(c.pvcs_of(Scenario::Hostpath), 1000);
        assert_eq!(c.pvcs_of(Scenario::Ebs), 100);
        let c = LoadConfig {
            pvcs: Some(5),
            ..LoadConfig::default()
        };
        assert_eq!(c.pvcs_of(Scenario::Ebs), 5);
        assert_eq!(serde_json::to_value(Scenario::Ebs).unwrap(), "ebs");
    }

    #[test]
    fn missing_binaries_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let config = LoadConfig {
            binaries: Binaries::in_dir(dir.path()),
            ..LoadConfig::default()
        };
        let err = config.validate().unwrap_err().to_string();
        assert!(
            err.contains("csi-provisioner") && err.contains("hostpath-csi-driver"),
            "{err}"
        );
        let zero = LoadConfig {
            runs: 0,
            ..LoadConfig::default()
        };
        assert!(matches!(zero.validate(), Err(Error::Config(_))));
    }
}
