//! `csi-bench attacher`: N PVs + VolumeAttachments against any attacher binary and driver socket.

use crate::attacher::LoadConfig;
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
    #[command(flatten)]
    config: LoadConfig,

    #[command(flatten)]
    report: ReportFlags,
}

/// Runs the benchmark and prints its report.
pub async fn run(f: Flags) -> anyhow::Result<()> {
    let report = crate::attacher::run(f.config)
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
            f.config.attacher_args,
            vec!["--kube-api-qps=5", "--worker-threads=50"]
        );
        assert_eq!(f.config.count, 5);
        assert_eq!(f.config.timeout, std::time::Duration::from_secs(1800));
    }
}
