//! Without the binaries a real-Kubernetes test skips, naming what is missing, and fails
//! instead under CSI_RS_REQUIRE_ALL (as scripts/test and CI run it). Nothing is started.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failed test

use k8s_harness::{Cluster, ClusterOptions};

/// Runs `child_starts_a_cluster` in a child process with `CSI_RS_K8S_ASSETS=dir`.
fn run_child(dir: &std::path::Path, require_all: bool) -> (bool, String) {
    let mut c = std::process::Command::new(std::env::current_exe().unwrap());
    c.args(["--exact", "child_starts_a_cluster", "--nocapture"])
        .env("K8S_HARNESS_CHILD", "1")
        .env(k8s_harness::ASSETS_ENV, dir);
    if require_all {
        c.env(test_support::REQUIRE_ALL, "1");
    } else {
        c.env_remove(test_support::REQUIRE_ALL);
    }
    let out = c.output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[test]
fn a_missing_binary_is_named_and_skips_or_fails() {
    let empty = tempfile::tempdir().unwrap();
    std::fs::write(empty.path().join("kubelet"), "").unwrap(); // not executable: still missing
    let (ok, text) = run_child(empty.path(), false);
    assert!(ok, "{text}");
    assert!(
        text.contains("SKIPPED: real Kubernetes test: CSI_RS_K8S_ASSETS="),
        "{text}"
    );
    assert!(
        text.contains(
            "lacks kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, csi-sanity"
        ),
        "{text}"
    );
    let (ok, text) = run_child(empty.path(), true);
    assert!(!ok, "{text}");
    assert!(
        text.contains("CSI_RS_REQUIRE_ALL is set") && text.contains("lacks kube-apiserver"),
        "{text}"
    );
}

/// The child half of the tests above; a no-op when run directly.
#[tokio::test]
async fn child_starts_a_cluster() {
    if std::env::var_os("K8S_HARNESS_CHILD").is_none() {
        return;
    }
    let started = Cluster::start_or_skip(ClusterOptions::control_plane()).await;
    assert!(started.is_none());
}
