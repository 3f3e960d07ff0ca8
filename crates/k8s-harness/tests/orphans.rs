//! A test process killed outright (no `Drop`): its Kubernetes processes die with it (parent-
//! death signal), and the next cluster started on the machine removes what outlived it
//! (containerd's shims and the containers, the mounts, the temp dir).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failed test

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_harness::{Cluster, ClusterOptions};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};

fn processes_mentioning(dir: &Path) -> Vec<u32> {
    let needle = dir.to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&needle))
        })
        .collect()
}

fn mount_count_below(dir: &Path) -> usize {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| Path::new(p).starts_with(dir))
        .count()
}

#[tokio::test]
async fn what_a_killed_test_left_is_cleaned_by_the_next_cluster() {
    if std::env::var_os("K8S_HARNESS_CHILD").is_some() {
        return;
    }
    if k8s_harness::Assets::from_env().is_err() {
        // The child would skip too; start_or_skip below says why (and fails under REQUIRE_ALL).
        let _ = Cluster::start_or_skip(ClusterOptions::control_plane()).await;
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_runs_a_pod_and_aborts", "--nocapture"])
        .env("K8S_HARNESS_CHILD", "1")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the child aborts: {text}");
    let dir = text
        .lines()
        .find_map(|l| l.strip_prefix("CLUSTER_DIR="))
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("child output has no CLUSTER_DIR: {text}"));
    // What outlives the test process: the shims and containers, their mounts, the dir.
    assert!(dir.exists());
    assert!(
        !processes_mentioning(&dir).is_empty(),
        "a containerd shim outlives the test"
    );
    assert!(mount_count_below(&dir) > 0);

    let Some(_next) = Cluster::start_or_skip(ClusterOptions::control_plane()).await else {
        return;
    };
    assert_eq!(processes_mentioning(&dir), Vec::<u32>::new());
    assert_eq!(mount_count_below(&dir), 0);
    assert!(!dir.exists(), "{} is still there", dir.display());
}

/// The child half: a pod running on a node, then abort (no destructor runs).
#[tokio::test]
async fn child_runs_a_pod_and_aborts() {
    if std::env::var_os("K8S_HARNESS_CHILD").is_none() {
        return;
    }
    let cluster = Cluster::start(ClusterOptions::full("*", "orphan-node"))
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(cluster.admin_client().await.unwrap(), "default");
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": "pause" },
        "spec": {
            "hostNetwork": true,
            "containers": [{ "name": "pause", "image": k8s_harness::PAUSE_IMAGE, "imagePullPolicy": "Never" }],
        },
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    test_support::eventually("the pod to be Running", Duration::from_secs(90), || {
        let pods = pods.clone();
        async move {
            let p = pods.get("pause").await.ok()?;
            (p.status?.phase.as_deref() == Some("Running")).then_some(())
        }
    })
    .await;
    println!("CLUSTER_DIR={}", cluster.dir().display());
    std::process::abort();
}
