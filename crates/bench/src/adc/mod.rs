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

impl Scenario {
    /// Every scenario, in the order `--scenario all` runs them.
    pub const ALL: [Scenario; 3] = [
        Scenario::AttachRequired,
        Scenario::ThroughAdc,
        Scenario::BypassAdc,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Scenario::AttachRequired => "attach-required",
            Scenario::ThroughAdc => "through-adc",
            Scenario::BypassAdc => "bypass-adc",
        }
    }

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

impl std::fmt::Display for Scenario {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct LoadConfig {
    /// The attach/detach controller. It gets `--kubeconfig=FILE --skip-attach=MODE
    /// --reconciler-sync-period=100ms --http-endpoint=127.0.0.1:PORT`, then `adc_args`.
    pub adc_bin: PathBuf,
    pub adc_args: Vec<String>,
    /// The attacher for [`Scenario::AttachRequired`]. It gets `--kubeconfig=FILE
    /// --csi-address=ADDR --v=2`, then `attacher_args`.
    pub attacher_bin: Option<PathBuf>,
    pub attacher_args: Vec<String>,
    /// Run in this order, each on a fresh API server with fresh processes.
    pub scenarios: Vec<Scenario>,
    /// How often to run them all (in turn: every scenario, then again); the table shows the
    /// median and range.
    pub runs: usize,
    /// Pods, each with one PVC and its pre-bound CSI PV.
    pub pods: usize,
    /// Nodes; pod `i` runs on node `i % nodes`.
    pub nodes: usize,
    /// the benchmark's own creates in flight at once.
    pub parallelism: usize,
    /// Limit for each phase (setup, start-up, attach).
    pub timeout: Duration,
    /// How long the processes keep running after the last pod is created (bypass-adc) or after
    /// every volume is listed (the others), so late writes (Events, retries) are counted.
    pub settle: Duration,
    /// Delay the built-in csi-mock adds to every ControllerPublish/Unpublish.
    pub mock_delay: Duration,
    /// Keep the processes' logs here as `SCENARIO-adc.log` and `SCENARIO-attacher.log`
    /// (default: temp files removed after each scenario).
    pub log_dir: Option<PathBuf>,
}

impl Default for LoadConfig {
    fn default() -> Self {
        Self {
            adc_bin: PathBuf::from("attach-detach-controller"),
            adc_args: Vec::new(),
            attacher_bin: None,
            attacher_args: Vec::new(),
            scenarios: Scenario::ALL.to_vec(),
            runs: 1,
            pods: 1000,
            nodes: 10,
            parallelism: 32,
            timeout: Duration::from_secs(10 * 60),
            settle: Duration::from_secs(3),
            mock_delay: Duration::ZERO,
            log_dir: None,
        }
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
