//! `csi-bench attacher`: N PVs + VolumeAttachments against any attacher binary and driver socket.

use std::path::PathBuf;
use std::time::Duration;

use crate::harness::output::ReportFlags;
use anyhow::Context as _;
use clap::Parser;

/// N PVs + VolumeAttachments against any CSI attacher and a driver socket.
///
/// Runs an embedded Kubernetes API server, creates --count PVs and VolumeAttachments for
/// --nodes nodes, starts the attacher against it and a CSI driver, and measures the time until
/// all are attached, detached and the PVs deleted, the attacher's API writes per attach and its
/// peak RSS.
///
/// The attacher gets `--kubeconfig=FILE --csi-address=ADDR --v=2` and then every
/// --attacher-arg, so ours (csi-attacher) and the Go external-attacher run the same way:
///
///   csi-bench attacher --attacher-bin target/release/csi-attacher --attacher-arg=--kube-api-qps=5
#[derive(Debug, Parser)]
#[command(verbatim_doc_comment)]
pub struct Flags {
    /// The attacher binary to load.
    #[arg(long)]
    attacher_bin: PathBuf,

    /// An extra argument for the attacher (repeat for more), e.g. --attacher-arg=--worker-threads=50.
    #[arg(long = "attacher-arg", allow_hyphen_values = true)]
    attacher_args: Vec<String>,

    /// The CSI driver socket (unix:///path or a path). Default: a built-in csi-mock driver.
    #[arg(long)]
    csi_address: Option<String>,

    /// The driver name for spec.attacher and CSINode. Default: what GetPluginInfo answers
    /// (the built-in mock answers "mock.csi.rs", or this name when given).
    #[arg(long)]
    driver_name: Option<String>,

    /// PersistentVolumes and VolumeAttachments to create.
    #[arg(long, default_value_t = 1000)]
    count: usize,

    /// Nodes (each with a CSINode); VolumeAttachments are spread round robin.
    #[arg(long, default_value_t = 10)]
    nodes: usize,

    /// Limit for each phase, e.g. 30m, 90s.
    #[arg(long, default_value = "30m", value_parser = component_runtime::parse_go_duration)]
    timeout: Duration,

    /// API creates and deletes in flight at once.
    #[arg(long, default_value_t = 32)]
    parallelism: usize,

    /// Delay the built-in mock adds to every ControllerPublish/Unpublish, e.g. 10ms.
    #[arg(long, default_value = "0s", value_parser = component_runtime::parse_go_duration)]
    mock_delay: Duration,

    /// Keep the attacher's output in this file (default: a temp file removed afterwards).
    #[arg(long)]
    attacher_log: Option<PathBuf>,

    #[command(flatten)]
    report: ReportFlags,
}

/// Runs the benchmark and prints its report.
pub async fn run(f: Flags) -> anyhow::Result<()> {
    let config = crate::attacher::LoadConfig {
        attacher_bin: f.attacher_bin,
        attacher_args: f.attacher_args,
        csi_address: f.csi_address,
        driver_name: f.driver_name,
        count: f.count,
        nodes: f.nodes,
        timeout: f.timeout,
        parallelism: f.parallelism,
        mock_delay: f.mock_delay,
        attacher_log: f.attacher_log,
    };
    let report = crate::attacher::run(config)
        .await
        .context("csi-bench attacher")?;
    f.report.emit(&report, |r| r.table())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attacher_args_may_start_with_dashes() {
        let f = Flags::try_parse_from([
            "csi-bench-attacher",
            "--attacher-bin",
            "/bin/true",
            "--attacher-arg",
            "--kube-api-qps=5",
            "--attacher-arg=--worker-threads=50",
            "--count=5",
        ])
        .unwrap();
        assert_eq!(
            f.attacher_args,
            vec!["--kube-api-qps=5", "--worker-threads=50"]
        );
        assert_eq!(f.count, 5);
        assert_eq!(f.timeout, Duration::from_secs(1800));
    }
}
