//! The real `csi-provisioner` binary: --help, bad flags, a driver that cannot provision, and a
//! run with Go-style flags that provisions and serves metrics and health.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::{Command, Stdio};

use common::*;
use csi_mock::MockConfig;
use test_support::net::{free_port, http_get, try_http_get};
use test_support::process::ChildGuard;

const BIN: &str = env!("CARGO_BIN_EXE_csi-provisioner");
const MOCK: &str = "mock.csi.rs";

#[test]
fn help_lists_the_go_flags_and_bad_flags_are_refused_naming_them() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--csi-address",
        "--kubeconfig",
        "--timeout",
        "--worker-threads",
        "--retry-interval-start",
        "--retry-interval-max",
        "--volume-name-prefix",
        "--volume-name-uuid-length",
        "--extra-create-metadata",
        "--default-fstype",
        "--feature-gates",
        "--strict-topology",
        "--immediate-topology",
        "--leader-election",
        "--leader-election-namespace",
        "--leader-election-lease-duration",
        "--leader-election-renew-deadline",
        "--leader-election-retry-period",
        "--kube-api-qps",
        "--kube-api-burst",
        "--http-endpoint",
        "--metrics-path",
        "--v",
    ] {
        assert!(help.contains(flag), "{flag} missing from --help:\n{help}");
    }
    let out = Command::new(BIN).arg("--timeout=fast").output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--timeout"));
    let out = Command::new(BIN).arg("--no-such-flag").output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--no-such-flag"));
    let out = Command::new(BIN)
        .args([
            "-feature-gates=Topology=true,Bogus=true",
            "--kubeconfig=/nonexistent",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unrecognized feature gate: Bogus"));
    let out = Command::new(BIN).arg("--version").output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("csi-provisioner"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_without_create_delete_volume_is_refused_clearly() {
    let env = Env::with_mock(MockConfig::default()).await;
    let kubeconfig = env.server.write_kubeconfig(env.dir.path()).unwrap();
    let out = tokio::process::Command::new(BIN)
        .args([
            format!("-kubeconfig={}", kubeconfig.display()),
            format!("-csi-address={}", env.mock().endpoint()),
        ])
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("CREATE_DELETE_VOLUME"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_provisions_with_go_style_flags_and_serves_metrics() {
    let env = Env::with_mock(provisioning_mock(MOCK)).await;
    env.create_class(class("fast", MOCK, &[])).await;
    let kubeconfig = env.server.write_kubeconfig(env.dir.path()).unwrap();
    let port = free_port();
    let child = Command::new(BIN)
        .args([
            format!("-kubeconfig={}", kubeconfig.display()),
            "-csi-address".into(),
            env.mock().endpoint(),
            "--timeout=5s".into(),
            "-retry-interval-start=50ms".into(),
            "-volume-name-prefix=vol".into(),
            "-volume-name-uuid-length=8".into(),
            "--feature-gates=Topology=true".into(),
            format!("--http-endpoint=127.0.0.1:{port}"),
            "-v=4".into(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let _guard = ChildGuard(child);
    let claim = env.create_pvc(pvc("data", "fast", "1Gi", Some(MOCK))).await;
    let uid = claim.metadata.uid.clone().unwrap();
    let name = format!("vol-{}", &uid[..8]);
    let pv = env.wait_pv(&name).await;
    assert_eq!(pv.spec.unwrap().csi.unwrap().volume_handle, name);
    let body = eventually("metrics with the provision counted", || async {
        let (_, body) = try_http_get(("127.0.0.1", port), "/metrics").await?;
        body.contains("controller_persistentvolumeclaim_provision_total{class=\"fast\"} 1")
            .then_some(body)
    })
    .await;
    assert!(
        body.contains("method_name=\"/csi.v1.Controller/CreateVolume\",grpc_status_code=\"OK\""),
        "{body}"
    );
    let (status, _) = http_get(("127.0.0.1", port), "/healthz").await;
    assert_eq!(status, 200);
}
