//! The `pv-controller` binary: Go-style flags, refusal of bad ones, and a run against
//! apiserver-lite with leader election, metrics and health on `--http-endpoint`, and a clean
//! exit on SIGTERM.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::{Command, Stdio};

use common::{Env, PATIENCE};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use test_support::net::{free_port, try_http_get};
use test_support::process::ChildGuard;

const BIN: &str = env!("CARGO_BIN_EXE_pv-controller");
const RWO: &[&str] = &["ReadWriteOnce"];

#[test]
fn help_names_the_flags_and_bad_values_are_refused() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--kubeconfig",
        "--feature-gates",
        "--pvclaimbinder-sync-period",
        "--enable-dynamic-provisioning",
        "--cloud-provider",
        "--cluster-name",
        "--region",
        "--ec2-endpoint",
        "--kube-api-qps",
        "--kube-api-burst",
        "--leader-elect",
        "--leader-elect-lease-duration",
        "--leader-elect-renew-deadline",
        "--leader-elect-retry-period",
        "--leader-elect-resource-namespace",
        "--leader-elect-resource-name",
        "--http-endpoint",
    ] {
        assert!(help.contains(flag), "{flag} missing in --help:\n{help}");
    }
    for (args, needle) in [
        (&["--cloud-provider=gce"][..], "--cloud-provider=gce"),
        (
            &["--feature-gates=CSIMigrationAWS=maybe"],
            "CSIMigrationAWS",
        ),
        (
            &["-pvclaimbinder-sync-period=10"],
            "--pvclaimbinder-sync-period",
        ),
    ] {
        let out = Command::new(BIN)
            .args(args)
            .arg("--kubeconfig=/nonexistent")
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_binds_serves_metrics_and_stops_on_sigterm() {
    let env = Env::new().await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = env.server.write_kubeconfig(dir.path()).unwrap();
    env.create_pv("vol", "1Gi", RWO, "").await;
    env.create_pvc("data", "1Gi", RWO, None).await;
    let port = free_port();
    let log_path = dir.path().join("pv-controller.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut child = ChildGuard(
        Command::new(BIN)
            .arg(format!("-kubeconfig={}", kubeconfig.display()))
            .arg(format!("-http-endpoint=127.0.0.1:{port}"))
            .args([
                "-leader-elect-resource-namespace=default",
                "-pvclaimbinder-sync-period=1s",
                "-v=2",
            ])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );

    env.wait_pvc_phase("data", "Bound").await;
    let holder = test_support::eventually("the lease is held", PATIENCE, || async {
        let lease = Api::<Lease>::namespaced(env.kube.clone(), "default")
            .get_opt("pv-controller")
            .await
            .ok()??;
        lease.spec?.holder_identity
    })
    .await;
    assert!(!holder.is_empty());
    let (code, _) = test_support::eventually("/healthz answers", PATIENCE, || {
        try_http_get(("127.0.0.1", port), "/healthz")
    })
    .await;
    assert_eq!(code, 200);
    let metrics = test_support::eventually("metrics count the bound volume", PATIENCE, || async {
        let (code, body) = try_http_get(("127.0.0.1", port), "/metrics").await?;
        (code == 200 && body.contains("pv_collector_bound_pv_count{storage_class=\"\"} 1"))
            .then_some(body)
    })
    .await;
    assert!(
        metrics.contains("pv_collector_bound_pvc_count{namespace=\"default\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("leader_election_master_status"),
        "{metrics}"
    );

    let status = test_support::process::terminate(&mut child.0, "the binary", PATIENCE).await;
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    assert!(status.success(), "exit {status:?}; log:\n{log}");
    env.shutdown().await;
}
