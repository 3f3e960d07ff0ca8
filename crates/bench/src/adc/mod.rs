//! Load for the attach/detach controller (its benchmark, docs/csi-bench/adc.md): N pods with one CSI
//! volume each on M nodes, on the embedded API server, with the `attach-detach-controller` binary
//! (and, when VolumeAttachments must be fulfilled, an attacher binary against a built-in csi-mock),
//! in three scenarios:
//!
//! - [`Scenario::AttachRequired`]: the CSIDriver says `attachRequired: true`; the ADC creates
//!   VolumeAttachments, the attacher fulfils them, the ADC lists them in
//!   `node.status.volumesAttached`.
//! - [`Scenario::ThroughAdc`]: `attachRequired: false`, ADC with `--skip-attach=through-adc`
//!   (the skip-attach design as written in 2018, docs/design/skip-attach.md: a no-op attach, no
//!   VolumeAttachment, still listed in `volumesAttached`).
//! - [`Scenario::BypassAdc`]: `attachRequired: false`, ADC with `--skip-attach=bypass-adc`
//!   (today's Kubernetes: the ADC leaves the volume alone). Nothing to wait for: the run gives
//!   the ADC `settle` time and counts what it wrote (should be nothing).
//!
//! Measured per scenario: the time from the first pod create until every volume is in its
//! node's `status.volumesAttached` (seen through a watch on Nodes); the API writes of the ADC
//! and of the attacher, per volume, from the API server's audit trail by User-Agent; each
//! process's peak RSS (VmHWM) and CPU time. [`run`] returns a [`Report`]; `csi-bench adc`
//! prints it as a table or JSON. `docs/csi-bench/adc.md` has usage and what each number means.

pub mod cli;
mod metrics;
mod nodes;
mod report;
mod run_objects;
mod scenario;
mod table;

use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

pub use crate::harness::cli::Named;

pub use report::{Component, Report, ScenarioReport};

use crate::Error;

/// The User-Agent of the benchmark's own API requests (setup and pod creation).
pub const USER_AGENT: &str = concat!("csi-bench-adc/", env!("CARGO_PKG_VERSION"));

/// One way of running the load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// CSIDriver attachRequired true: VolumeAttachments, fulfilled by the attacher.
    AttachRequired,
    /// attachRequired false, `--skip-attach=through-adc` (the skip-attach design as
    /// written in 2018).
    ThroughAdc,
    /// attachRequired false, `--skip-attach=bypass-adc` (today's Kubernetes, the ADC's default).
    BypassAdc,
}

impl Named for Scenario {
    const ALL: &'static [Self] = &[
        Scenario::AttachRequired,
        Scenario::ThroughAdc,
        Scenario::BypassAdc,
    ];

    fn name(self) -> &'static str {
        match self {
            Scenario::AttachRequired => "attach-required",
            Scenario::ThroughAdc => "through-adc",
            Scenario::BypassAdc => "bypass-adc",
        }
    }
}

crate::harness::cli::display_by_name!(Scenario);

impl Scenario {
    /// The CSIDriver's `spec.attachRequired`.
    pub fn attach_required(self) -> bool {
        self == Scenario::AttachRequired
    }

    /// The ADC's `--skip-attach` value. With attachRequired true the mode does not matter; the
    /// run passes the default so every command line says what it ran.
    pub fn skip_attach(self) -> &'static str {
        match self {
            Scenario::ThroughAdc => "through-adc",
            Scenario::AttachRequired | Scenario::BypassAdc => "bypass-adc",
        }
    }

    /// Whether the volumes are expected in `node.status.volumesAttached` (bypass-adc: never).
    pub fn lists_volumes(self) -> bool {
        self != Scenario::BypassAdc
    }
}

/// What to run: the `csi-bench adc` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct LoadConfig {
    /// The attach/detach controller binary. It gets --kubeconfig, --skip-attach,
    /// --reconciler-sync-period=100ms and --http-endpoint, then every --adc-arg.
    #[arg(long)]
    pub adc_bin: PathBuf,
    /// An extra argument for the ADC (repeat for more), e.g. --adc-arg=--kube-api-qps=-1.
    #[arg(long = "adc-arg", allow_hyphen_values = true)]
    pub adc_args: Vec<String>,
    /// The attacher for attach-required (gets --kubeconfig, --csi-address, --v=2, then every
    /// --attacher-arg).
    #[arg(long)]
    pub attacher_bin: Option<PathBuf>,
    /// An extra argument for the attacher (repeat for more), e.g. --attacher-arg=--kube-api-qps=-1.
    #[arg(long = "attacher-arg", allow_hyphen_values = true)]
    pub attacher_args: Vec<String>,
    /// Run in this order, each on a fresh API server with fresh processes (the CLI's
    /// --scenario).
    #[arg(skip = Scenario::ALL.to_vec())]
    pub scenarios: Vec<Scenario>,
    /// Run the scenario(s) this many times, in turn; the table shows median (min-max).
    #[arg(long, default_value_t = 1)]
    pub runs: usize,
    /// Pods, each with one PVC and its pre-bound CSI PV.
    #[arg(long, default_value_t = 1000)]
    pub pods: usize,
    /// Nodes; pod i runs on node i % nodes.
    #[arg(long, default_value_t = 10)]
    pub nodes: usize,
    /// The benchmark's own API creates in flight at once.
    #[arg(long, default_value_t = 32)]
    pub parallelism: usize,
    /// Limit for each phase (setup, start-up, attach), e.g. 10m, 90s.
    #[arg(long, default_value = "10m", value_parser = component_runtime::parse_go_duration)]
    pub timeout: Duration,
    /// How long the processes run on after the goal (bypass-adc: after the last pod create)
    /// so that late writes (Events, retries) are counted.
    #[arg(long, default_value = "3s", value_parser = component_runtime::parse_go_duration)]
    pub settle: Duration,
    /// Delay the built-in csi-mock adds to every ControllerPublish/Unpublish, e.g. 10ms.
    #[arg(long, default_value = "0s", value_parser = component_runtime::parse_go_duration)]
    pub mock_delay: Duration,
    /// Keep the processes' logs in this directory (SCENARIO-adc.log, SCENARIO-attacher.log;
    /// default: temp files removed after each scenario).
    #[arg(long)]
    pub log_dir: Option<PathBuf>,
}

impl Default for LoadConfig {
    fn default() -> Self {
        crate::harness::cli::defaults(&["--adc-bin=attach-detach-controller"])
    }
}

impl LoadConfig {
    fn validate(&self) -> Result<(), Error> {
        if self.pods == 0 || self.nodes == 0 || self.parallelism == 0 || self.runs == 0 {
            return Err(Error::Config(
                "--pods, --nodes, --parallelism and --runs must be at least 1".into(),
            ));
        }
        if self.scenarios.is_empty() {
            return Err(Error::Config("no scenario to run".into()));
        }
        if self.scenarios.contains(&Scenario::AttachRequired) && self.attacher_bin.is_none() {
            return Err(Error::Config(
                "the attach-required scenario needs --attacher-bin (VolumeAttachments must be fulfilled)"
                    .into(),
            ));
        }
        Ok(())
    }
}

/// Runs every configured scenario once, one after the other. Processes, API servers, the mock
/// and temp dirs are stopped and removed on every way out, errors included.
pub async fn run(config: LoadConfig) -> Result<Report, Error> {
    config.validate()?;
    apiserver::install_crypto_provider();
    if let Some(dir) = &config.log_dir {
        std::fs::create_dir_all(dir).map_err(|source| Error::Io {
            op: format!("creating the log directory {}", dir.display()),
            source,
        })?;
    }
    let mut scenarios = Vec::with_capacity(config.scenarios.len() * config.runs);
    // Interleaved, so a load that comes and goes on the machine spreads over every scenario.
    for run in 1..=config.runs {
        for &s in &config.scenarios {
            tracing::info!(scenario = %s, run, pods = config.pods, nodes = config.nodes, "scenario starts");
            scenarios.push(scenario::run_one(&config, s).await?);
        }
    }
    Ok(Report::new(
        config.pods,
        config.nodes,
        csi_mock::MockConfig::default().name,
        config.runs,
        scenarios,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scenarios_say_what_they_configure() {
        let flags: Vec<_> = Scenario::ALL
            .iter()
            .map(|s| {
                (
                    s.name(),
                    s.attach_required(),
                    s.skip_attach(),
                    s.lists_volumes(),
                )
            })
            .collect();
        assert_eq!(
            flags,
            vec![
                ("attach-required", true, "bypass-adc", true),
                ("through-adc", false, "through-adc", true),
                ("bypass-adc", false, "bypass-adc", false),
            ]
        );
        assert_eq!(
            serde_json::to_value(Scenario::ThroughAdc).unwrap(),
            "through-adc"
        );
    }

    #[test]
    fn attach_required_needs_an_attacher() {
        let err = LoadConfig::default().validate().unwrap_err();
        assert!(err.to_string().contains("--attacher-bin"), "{err}");
        let ok = LoadConfig {
            scenarios: vec![Scenario::ThroughAdc, Scenario::BypassAdc],
            ..LoadConfig::default()
        };
        ok.validate().unwrap();
        let zero = LoadConfig { pods: 0, ..ok };
        assert!(matches!(zero.validate(), Err(Error::Config(_))));
    }
}
