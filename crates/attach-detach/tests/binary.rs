//! The `attach-detach-controller` binary: Go-style flags, refusal of bad ones, and a run against
//! the embedded API server with leader election, metrics and health on `--http-endpoint`, and a
//! clean exit on SIGTERM.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::{Command, Stdio};

use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use test_support::net::{free_port, try_http_get};
use test_support::process::ChildGuard;

const BIN: &str = env!("CARGO_BIN_EXE_attach-detach-controller");

#[test]
fn help_names_the_flags_and_bad_values_are_refused() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--kubeconfig",
        "--skip-attach",
        "--feature-gates",
        "--reconciler-sync-period",
        "--max-wait-for-unmount",
        "--disable-force-detach-on-timeout",
        "--attach-timeout",
        "--cloud-provider",
        "--region",
        "--ec2-endpoint",
        "--http-endpoint",
        "--leader-election",
        "--kube-api-qps",
        "--kube-api-burst",
    ] {
        assert!(help.contains(flag), "{flag} missing in --help:\n{help}");
    }
    for (args, needle) in [
        (&["-skip-attach=seed"][..], "through-adc"),
        (&["--cloud-provider=gce"], "--cloud-provider=gce"),
        (
            &["--feature-gates=CSIMigrationAWS=maybe"],
            "CSIMigrationAWS",
        ),
        (&["-max-wait-for-unmount=10"], "--max-wait-for-unmount"),
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

#[tokio::test]
async fn the_binary_attaches_serves_metrics_and_stops_on_sigterm() {
    let env = Env::new().await;
    env.create_node("node-1", &[DRIVER], None).await;
    env.create_csi_pv("pv-b", "b", DRIVER, "h-b", "ReadWriteOnce")
        .await;
    env.create_pod("pod-b", "node-1", "b").await;
    let port = free_port();
    let log = std::fs::File::create(env.dir.path().join("adc.log")).unwrap();
    let mut child = ChildGuard(
        Command::new(BIN)
            .arg(format!("-kubeconfig={}", env.kubeconfig_file().display()))
            .arg(format!("-http-endpoint=127.0.0.1:{port}"))
            .args([
                "-leader-election",
                "-leader-election-namespace=default",
                "-reconciler-sync-period=50ms",
                "-skip-attach=through-adc",
                "-v=2",
            ])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );

    // No attacher runs: the VolumeAttachment is created and waited for.
    eventually("the binary creates the VolumeAttachment", || async {
        env.va_exists("h-b", DRIVER, "node-1").await.then_some(())
    })
    .await;
    assert_eq!(env.va_creates(), 1);
    let lease = eventually("the lease is held", || async {
        let lease = Api::<Lease>::namespaced(env.kube.clone(), NS)
            .get_opt("attachdetach-controller")
            .await
            .ok()??;
        lease.spec.as_ref()?.holder_identity.clone()?;
        Some(lease)
    })
    .await;
    assert!(lease.spec.unwrap().holder_identity.is_some());
    let (code, _) = eventually("/healthz answers", || {
        try_http_get(("127.0.0.1", port), "/healthz")
    })
    .await;
    assert_eq!(code, 200);
    let metrics = eventually("metrics report the desired volume", || async {
        let (code, body) = try_http_get(("127.0.0.1", port), "/metrics").await?;
        (code == 200
            && body.contains("attachdetach_controller_total_volumes{plugin_name=\"kubernetes.io/csi:mock.csi.rs\",state=\"desired_state_of_world\"} 1"))
        .then_some(body)
    })
    .await;
    assert!(
        metrics.contains("attachdetach_controller_api_writes_total"),
        "{metrics}"
    );

    let status = test_support::process::terminate(&mut child.0, "the binary", PATIENCE).await;
    let log = std::fs::read_to_string(env.dir.path().join("adc.log")).unwrap_or_default();
    assert!(status.success(), "exit {status:?}; log:\n{log}");
    env.shutdown().await;
}
