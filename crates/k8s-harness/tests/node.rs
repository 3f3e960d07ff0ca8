//! The whole cluster with a node: kube-controller-manager, kube-scheduler, containerd and the
//! kubelet. The node is Ready, the scheduler places a pod there and the kubelet runs it; after
//! the drop no process, mount, pod log or temp dir of the cluster is left.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failed test

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_harness::{Cluster, ClusterOptions};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use test_support::mounts_below;

/// Live (not zombie) processes whose command line mentions `dir`.
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
        .filter(|pid| alive(*pid))
        .collect()
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            != Some("Z")
    })
}

#[tokio::test]
async fn a_pod_runs_on_the_real_kubelet_and_nothing_is_left_after_drop() {
    let pod_uid;
    let root: PathBuf;
    let mut pids: Vec<(String, u32)>;
    {
        let Some(cluster) = Cluster::start_or_skip(ClusterOptions::full("*", "harness-node")).await
        else {
            return;
        };
        root = cluster.dir().to_path_buf();
        let admin = cluster.admin_client().await.unwrap();
        let nodes = Api::<Node>::all(admin.clone());
        let node = nodes.get("harness-node").await.unwrap();
        let ready = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .unwrap();
        assert!(
            ready
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True"),
            "{ready:?}"
        );
        // --node-ip: the kubelet reports the node's address (kube-apiserver reaches it there).
        let ip = cluster.node_ip().unwrap().to_string();
        test_support::eventually("the node's InternalIP", Duration::from_secs(30), || {
            let (nodes, ip) = (nodes.clone(), ip.clone());
            async move {
                let n = nodes.get("harness-node").await.ok()?;
                n.status?
                    .addresses?
                    .iter()
                    .any(|a| a.type_ == "InternalIP" && a.address == ip)
                    .then_some(())
            }
        })
        .await;

        let pod: Pod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": { "name": "pause", "namespace": "default" },
            "spec": {
                "hostNetwork": true,
                "containers": [{ "name": "pause", "image": k8s_harness::PAUSE_IMAGE, "imagePullPolicy": "Never" }],
            },
        }))
        .unwrap();
        let pods: Api<Pod> = Api::namespaced(admin, "default");
        pods.create(&PostParams::default(), &pod).await.unwrap();
        let running =
            test_support::eventually("the pod to be Running", Duration::from_secs(90), || {
                let pods = pods.clone();
                async move {
                    let p = pods.get("pause").await.ok()?;
                    (p.status.as_ref()?.phase.as_deref() == Some("Running")).then_some(p)
                }
            })
            .await;
        assert_eq!(
            running.spec.unwrap().node_name.as_deref(),
            Some("harness-node"),
            "the scheduler bound it"
        );
        pod_uid = running.metadata.uid.unwrap();
        // kube-apiserver reaches the kubelet (logs go through it): the pause container logs nothing.
        assert_eq!(cluster.kubectl(&["logs", "pause"]).unwrap(), "");
        // The kubelet mounted the projected ServiceAccount token (tmpfs) under its root dir,
        // and containerd the container's rootfs and the sandbox's shm under its own.
        let kubelet_root = cluster.kubelet_root_dir().unwrap().to_path_buf();
        let mounts = mounts_below(&root);
        assert!(
            mounts.iter().any(|m| {
                let m = m.to_string_lossy();
                m.contains(&pod_uid) && m.contains("kube-api-access")
            }),
            "{mounts:#?}"
        );
        assert!(
            mounts
                .iter()
                .any(|m| Path::new(m).starts_with(&kubelet_root))
        );
        assert!(
            Path::new("/var/log/pods")
                .read_dir()
                .unwrap()
                .flatten()
                .any(|e| e.file_name().to_string_lossy().ends_with(&pod_uid))
        );
        pids = cluster.pids();
        let shims = processes_mentioning(&root);
        assert!(
            !shims.is_empty(),
            "containerd's shim names its socket in the temp dir"
        );
        pids.extend(shims.into_iter().map(|p| ("shim or child".to_string(), p)));
        assert_eq!(
            pids.iter()
                .filter(|(n, _)| n == "kubelet" || n == "containerd")
                .count(),
            2,
            "{pids:?}"
        );
        // `cluster` is dropped here: as a test that panicked above would drop it.
    }
    let left: Vec<_> = pids.iter().filter(|(_, p)| alive(*p)).collect();
    assert!(left.is_empty(), "processes left after drop: {left:?}");
    assert!(processes_mentioning(&root).is_empty());
    assert_eq!(
        mounts_below(&root),
        Vec::<String>::new(),
        "mounts left after drop"
    );
    assert!(!root.exists(), "{} left after drop", root.display());
    let logs_left = std::fs::read_dir("/var/log/pods")
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with(&pod_uid))
                .count()
        })
        .unwrap_or(0);
    assert_eq!(logs_left, 0, "the pod's logs in /var/log/pods");
}
