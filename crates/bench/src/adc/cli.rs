//! `csi-bench adc`: N pods with one CSI volume each against the attach/detach controller.

use crate::adc::LoadConfig;
use crate::harness::cli::select;
use crate::harness::output::ReportFlags;
use anyhow::Context as _;
use clap::Parser;

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
    /// Which scenario(s) to run: attach-required, through-adc, bypass-adc or all, repeated or
    /// as a comma list; they run one after the other.
    #[arg(long, default_value = "all", value_name = "SCENARIO[,...]")]
    scenario: Vec<String>,

    #[command(flatten)]
    config: LoadConfig,

    #[command(flatten)]
    report: ReportFlags,
}

impl Flags {
    fn config(self) -> anyhow::Result<LoadConfig> {
        let (scenarios, _) = select(&self.scenario).map_err(anyhow::Error::msg)?;
        Ok(LoadConfig {
            scenarios,
            ..self.config
        })
    }
}

/// Runs the benchmark and prints its report.
pub async fn run(f: Flags) -> anyhow::Result<()> {
    let report_flags = f.report.clone();
    let report = crate::adc::run(f.config()?)
        .await
        .context("csi-bench adc")?;
    report_flags.emit(&report, |r| r.table())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::path::PathBuf;
    use std::time::Duration;

    use super::*;
    use crate::adc::{Named, Scenario};

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
            "bypass-adc,through-adc",
            "--settle=500ms",
            "--runs=3",
            "--json-file=/tmp/r.json",
        ])
        .unwrap();
        assert_eq!(f.report.json_file, Some(PathBuf::from("/tmp/r.json")));
        let c = f.config().unwrap();
        assert_eq!(c.adc_args, vec!["--kube-api-qps=-1", "-v"]);
        assert_eq!(c.attacher_args, vec!["--worker-threads=50"]);
        assert_eq!(c.scenarios, vec![Scenario::ThroughAdc, Scenario::BypassAdc]);
        assert_eq!(c.settle, Duration::from_millis(500));
        assert_eq!((c.runs, c.pods, c.nodes), (3, 1000, 10));
        let all = Flags::try_parse_from(["csi-bench-adc", "--adc-bin", "x"]).unwrap();
        let c = all.config().unwrap();
        assert_eq!(c.scenarios, Scenario::ALL.to_vec());
        assert_eq!(c.runs, 1);
        let bad = Flags::try_parse_from(["csi-bench-adc", "--adc-bin=x", "--scenario=seed"]);
        let e = bad.unwrap().config().unwrap_err().to_string();
        assert!(e.contains("\"seed\": want one of attach-required"), "{e}");
    }
}
