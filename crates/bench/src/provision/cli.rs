//! `csi-bench provision`: the provisioning benchmark (PVCs → Bound, writes, memory, deletes).

use std::path::PathBuf;

use crate::harness::cli::select;
use crate::harness::output::ReportFlags;
use crate::provision::{Binaries, LoadConfig, Scenario};
use anyhow::Context as _;
use clap::Parser;

/// N claims through csi-provisioner and a CSI driver, to Bound and back.
///
/// Measures dynamic provisioning: csi-provisioner and the CSI driver run as child processes
/// (hostpath-csi-driver, or ebs-csi-driver --mode=controller against an in-process ec2-sim
/// with fast timing), apiserver-lite and the PV controller in-process. After a StorageClass
/// (Immediate, reclaim Delete), one Node and its CSINode, --pvcs PVCs are created at once, each
/// timed from just before its create until a PVC watch sees it Bound; then all are deleted and
/// timed until their PVs are gone. API writes per PVC by component (provisioner, PV controller)
/// from the API server's audit trail; VmRSS/VmHWM and CPU of the provisioner and the driver.
///
/// The provisioner gets --csi-address, --kubeconfig, --feature-gates=Topology=true,
/// --worker-threads, --kube-api-qps/--kube-api-burst (unlimited by default: the benchmark
/// measures the work, not the Go defaults' 5 qps) and --leader-election=false, then every
/// --provisioner-arg.
///
///   csi-bench provision --scenario hostpath --runs 3
///   csi-bench provision --scenario ebs --driver-bin target/debug/ebs-csi-driver --runs 3
#[derive(Debug, Parser)]
#[command(verbatim_doc_comment)]
pub struct Flags {
    /// Which scenario(s) to run: hostpath (1,000 PVCs), ebs (100 PVCs) or all, repeated or
    /// as a comma list.
    #[arg(long, default_value = "all", value_name = "SCENARIO[,...]")]
    scenario: Vec<String>,

    /// Directory with csi-provisioner, hostpath-csi-driver and ebs-csi-driver (default: the
    /// directory of this binary).
    #[arg(long, value_name = "DIR")]
    bin_dir: Option<PathBuf>,

    /// csi-provisioner binary (default: BIN_DIR/csi-provisioner). Its file name tells its
    /// writes in the audit trail: keep it csi-provisioner.
    #[arg(long, value_name = "PATH")]
    provisioner_bin: Option<PathBuf>,

    /// The driver binary of the one scenario chosen with --scenario.
    #[arg(long, value_name = "PATH")]
    driver_bin: Option<PathBuf>,

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

impl Flags {
    fn config(self) -> anyhow::Result<LoadConfig> {
        let (scenarios, _) = select(&self.scenario).map_err(anyhow::Error::msg)?;
        let bin_dir = match self.bin_dir {
            Some(d) => d,
            None => crate::harness::child::default_bin_dir()?,
        };
        let mut binaries = Binaries::in_dir(&bin_dir);
        if let Some(p) = self.provisioner_bin {
            binaries.provisioner = p;
        }
        if let Some(p) = self.hostpath_driver_bin {
            binaries.hostpath_driver = p;
        }
        if let Some(p) = self.ebs_driver_bin {
            binaries.ebs_driver = p;
        }
        if let Some(p) = self.driver_bin {
            match scenarios.as_slice() {
                [Scenario::Hostpath] => binaries.hostpath_driver = p,
                [Scenario::Ebs] => binaries.ebs_driver = p,
                _ => anyhow::bail!(
                    "--driver-bin needs one --scenario (hostpath or ebs); with all, use --hostpath-driver-bin and --ebs-driver-bin"
                ),
            }
        }
        Ok(LoadConfig {
            binaries,
            scenarios,
            ..self.config
        })
    }
}

/// Runs the benchmark and prints its report.
pub async fn run(f: Flags) -> anyhow::Result<()> {
    let report_flags = f.report.clone();
    let config = f.config()?;
    let report = crate::provision::run(config)
        .await
        .context("csi-bench provision")?;
    report_flags.emit(&report, |r| r.table())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::time::Duration;

    use super::*;

    fn parse(args: &[&str]) -> Flags {
        Flags::try_parse_from(component_runtime::normalize_go_args(
            std::iter::once("csi-bench-provision")
                .chain(args.iter().copied())
                .map(Into::into),
        ))
        .unwrap()
    }

    #[test]
    fn flags_become_a_config() {
        let c = parse(&[
            "--scenario=ebs",
            "--driver-bin=/d/ebs-csi-driver",
            "--bin-dir=/r",
            "-runs=3",
            "--provisioner-arg=--v=2",
            "--provisioner-arg",
            "--timeout=30s",
            "--timeout=90s",
            "--settle=500ms",
        ])
        .config()
        .unwrap();
        assert_eq!(c.scenarios, vec![Scenario::Ebs]);
        assert_eq!(c.binaries.ebs_driver, PathBuf::from("/d/ebs-csi-driver"));
        assert_eq!(c.binaries.provisioner, PathBuf::from("/r/csi-provisioner"));
        assert_eq!(
            c.binaries.hostpath_driver,
            PathBuf::from("/r/hostpath-csi-driver")
        );
        assert_eq!(c.runs, 3);
        assert_eq!(c.provisioner_args, vec!["--v=2", "--timeout=30s"]);
        assert_eq!(c.timeout, Duration::from_secs(90));
        assert_eq!(c.settle, Duration::from_millis(500));
        assert_eq!(c.kube_api_qps, -1.0);
        assert_eq!(c.worker_threads, 100);
        assert_eq!(c.pvcs, None);

        let all = parse(&["--driver-bin=/x"]).config().unwrap_err();
        assert!(all.to_string().contains("one --scenario"), "{all}");
        let both = parse(&["--scenario=ebs,hostpath"]).config().unwrap();
        assert_eq!(both.scenarios, vec![Scenario::Hostpath, Scenario::Ebs]);
        let bad = parse(&["--scenario=nfs"]).config().unwrap_err();
        assert!(
            bad.to_string()
                .contains("\"nfs\": want one of hostpath, ebs"),
            "{bad}"
        );
        let q = parse(&["--kube-api-qps", "-1", "--kube-api-burst=20", "--pvcs=5"]).config;
        assert_eq!(
            (q.kube_api_qps, q.kube_api_burst, q.pvcs),
            (-1.0, 20, Some(5))
        );
    }
}
