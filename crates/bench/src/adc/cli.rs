//! `csi-bench adc`: N pods with one CSI volume each against the attach/detach controller.

use std::path::PathBuf;
use std::time::Duration;

use crate::adc::Scenario;
use crate::harness::output::ReportFlags;
use anyhow::Context as _;
use clap::{Parser, ValueEnum};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ScenarioFlag {
    AttachRequired,
    ThroughAdc,
    BypassAdc,
    All,
}

impl ScenarioFlag {
    fn scenarios(self) -> Vec<Scenario> {
        match self {
            ScenarioFlag::AttachRequired => vec![Scenario::AttachRequired],
            ScenarioFlag::ThroughAdc => vec![Scenario::ThroughAdc],
            ScenarioFlag::BypassAdc => vec![Scenario::BypassAdc],
            ScenarioFlag::All => Scenario::ALL.to_vec(),
        }
    }
}

/// N pods with a CSI volume each through the attach/detach controller.
///
/// Runs an embedded Kubernetes API server with --nodes controller-managed Nodes and --pods pods
/// (one bound CSI PVC each, already scheduled), starts the attach/detach controller (and, for
/// attach-required, the attacher against a built-in csi-mock), and measures the time from the
/// first pod create until every volume is in its node's status.volumesAttached, the API writes
/// per volume of the ADC and of the attacher, and their peak RSS and CPU time.
///
/// Scenarios: attach-required (CSIDriver attachRequired true: VolumeAttachments), through-adc
/// (attachRequired false, --skip-attach=through-adc: the no-op attach of the
/// skip-attach design as written in 2018, docs/design/skip-attach.md), bypass-adc
/// (attachRequired false, --skip-attach=bypass-adc: the ADC should do nothing; it runs for
/// --settle after the last pod and its writes are counted).
///
///   csi-bench adc --adc-bin target/release/attach-detach-controller \
///       --attacher-bin target/release/csi-attacher --attacher-arg=--kube-api-qps=-1
#[derive(Debug, Parser)]
#[command(verbatim_doc_comment)]
pub struct Flags {
    /// The attach/detach controller binary. It gets --kubeconfig, --skip-attach,
    /// --reconciler-sync-period=100ms and --http-endpoint, then every --adc-arg.
    #[arg(long)]
    adc_bin: PathBuf,

    /// An extra argument for the ADC (repeat for more), e.g. --adc-arg=--kube-api-qps=-1.
    #[arg(long = "adc-arg", allow_hyphen_values = true)]
    adc_args: Vec<String>,

    /// The attacher for attach-required (gets --kubeconfig, --csi-address, --v=2, then every
    /// --attacher-arg).
    #[arg(long)]
    attacher_bin: Option<PathBuf>,

    /// An extra argument for the attacher (repeat for more), e.g. --attacher-arg=--kube-api-qps=-1.
    #[arg(long = "attacher-arg", allow_hyphen_values = true)]
    attacher_args: Vec<String>,

    /// Which scenario(s) to run; all runs them one after the other.
    #[arg(long, value_enum, default_value = "all")]
    scenario: ScenarioFlag,

    /// Run the scenario(s) this many times, in turn; the table shows median (min-max).
    #[arg(long, default_value_t = 1)]
    runs: usize,

    /// Pods, one volume each.
    #[arg(long, default_value_t = 1000)]
    pods: usize,

    /// Nodes; pods go round robin.
    #[arg(long, default_value_t = 10)]
    nodes: usize,

    /// The benchmark's own API creates in flight at once.
    #[arg(long, default_value_t = 32)]
    parallelism: usize,

    /// Limit for each phase, e.g. 10m, 90s.
    #[arg(long, default_value = "10m", value_parser = component_runtime::parse_go_duration)]
    timeout: Duration,

    /// How long the processes run on after the goal (bypass-adc: after the last pod create)
    /// so that late writes are counted.
    #[arg(long, default_value = "3s", value_parser = component_runtime::parse_go_duration)]
    settle: Duration,

    /// Delay the built-in csi-mock adds to every ControllerPublish/Unpublish, e.g. 10ms.
    #[arg(long, default_value = "0s", value_parser = component_runtime::parse_go_duration)]
    mock_delay: Duration,

    /// Keep the processes' logs in this directory (SCENARIO-adc.log, SCENARIO-attacher.log).
    #[arg(long)]
    log_dir: Option<PathBuf>,

    #[command(flatten)]
    report: ReportFlags,
}

/// Runs the benchmark and prints its report.
pub async fn run(f: Flags) -> anyhow::Result<()> {
    let config = crate::adc::LoadConfig {
        adc_bin: f.adc_bin,
        adc_args: f.adc_args,
        attacher_bin: f.attacher_bin,
        attacher_args: f.attacher_args,
        scenarios: f.scenario.scenarios(),
        runs: f.runs,
        pods: f.pods,
        nodes: f.nodes,
        parallelism: f.parallelism,
        timeout: f.timeout,
        settle: f.settle,
        mock_delay: f.mock_delay,
        log_dir: f.log_dir,
    };
    let report = crate::adc::run(config).await.context("csi-bench adc")?;
    f.report.emit(&report, |r| r.table())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_take_dashed_args_and_scenarios() {
        let f = Flags::try_parse_from([
            "csi-bench-adc",
            "--adc-bin",
            "/bin/adc",
            "--adc-arg",
            "--kube-api-qps=-1",
            "--adc-arg=-v",
            "--attacher-arg=--worker-threads=50",
            "--scenario",
            "through-adc",
            "--settle=500ms",
            "--runs=3",
            "--json-file=/tmp/r.json",
        ])
        .unwrap();
        assert_eq!(f.adc_args, vec!["--kube-api-qps=-1", "-v"]);
        assert_eq!(f.attacher_args, vec!["--worker-threads=50"]);
        assert_eq!(f.scenario.scenarios(), vec![Scenario::ThroughAdc]);
        assert_eq!(f.settle, Duration::from_millis(500));
        assert_eq!(f.runs, 3);
        assert_eq!(f.report.json_file, Some(PathBuf::from("/tmp/r.json")));
        assert_eq!(f.pods, 1000);
        assert_eq!(f.nodes, 10);
        let all = Flags::try_parse_from(["csi-bench-adc", "--adc-bin", "x"]).unwrap();
        assert_eq!(all.scenario.scenarios(), Scenario::ALL.to_vec());
        assert_eq!(all.runs, 1);
    }
}
