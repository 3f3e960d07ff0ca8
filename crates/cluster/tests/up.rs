//! `csi-cluster up` as a child process (the real binary, 127.0.0.1:0, a temp data dir) driven
//! with the kubectl on PATH: an EBS volume (provisioned, attached through a VolumeAttachment,
//! staged on a loop device, published) and a hostpath volume (no VolumeAttachment ever) used by
//! pods; `csi-cluster status`; SIGTERM leaves no mount, loop device or socket. Then a second
//! `up` on the same data dir adopts the first one's objects and EC2 volumes, a third `up` on it
//! is refused while it runs, and `csi-cluster down` stops it. Without migration, the in-tree
//! `gp2` class provisions and attaches in-tree.
//!
//! The scheduler in csi-cluster places the pods (a `nodeSelector` on `kubernetes.io/hostname`
//! picks the node) and writes the claims' selected node; the tests check where they landed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{
    Cluster, PATIENCE, can_run, claim_and_pod, loop_devices_below, mounts_below, sockets_below,
    volume_attachments, volume_path,
};

fn assert_nothing_left(cluster: &Cluster) {
    let dir = &cluster.data_dir;
    assert!(
        mounts_below(dir).is_empty(),
        "mounts left: {:?}",
        mounts_below(dir)
    );
    assert!(
        loop_devices_below(dir).is_empty(),
        "loop devices left: {:?}",
        loop_devices_below(dir)
    );
    assert!(
        sockets_below(dir).is_empty(),
        "sockets left: {:?}",
        sockets_below(dir)
    );
    assert!(!dir.join("csi-cluster.pid").exists(), "pid file left");
}

/// A pod held to a node that does not exist.
const UNSCHEDULABLE_POD: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: nowhere
spec:
  nodeSelector:
    kubernetes.io/hostname: node-99
  containers:
  - name: app
    image: busybox
"#;

/// The scheduler bound `pod` to `node` and wrote `node` as the claim's selected node.
fn assert_scheduled(cluster: &Cluster, pod: &str, claim: &str, node: &str) {
    let p = cluster.get_json(&["get", "pod", pod]);
    assert_eq!(p["spec"]["nodeName"].as_str(), Some(node), "{p}");
    let c = cluster.get_json(&["get", "pvc", claim]);
    assert_eq!(
        c["metadata"]["annotations"]["volume.kubernetes.io/selected-node"].as_str(),
        Some(node),
        "{c}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_drives_ebs_and_hostpath_volumes_and_sigterm_leaves_nothing() {
    if !can_run() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(work.path(), 2, 1);
    cluster.wait_ready().await;
    // A pod no node fits: the scheduler says why, and `status` lists it as stuck after 30 s.
    cluster.kubectl(&["apply", "-f", "-"], Some(UNSCHEDULABLE_POD));
    let nodes = cluster.kubectl(&["get", "nodes", "-o", "name"], None);
    assert!(
        nodes.contains("node/node-0") && nodes.contains("node/node-1"),
        "{nodes}"
    );

    // EBS: provisioned in node-0's zone, attached, staged, published.
    cluster.kubectl(
        &["apply", "-f", "-"],
        Some(&claim_and_pod("ebs-claim", "ebs-sc", "ebs-pod", "node-0")),
    );
    cluster.kubectl(
        &[
            "wait",
            "--for=condition=Ready",
            "pod/ebs-pod",
            "--timeout=120s",
        ],
        None,
    );
    assert_scheduled(&cluster, "ebs-pod", "ebs-claim", "node-0");
    let path = volume_path(&cluster, "ebs-pod");
    assert!(
        path.starts_with(cluster.data_dir.join("nodes/node-0/kubelet")),
        "{path:?}"
    );
    std::fs::write(path.join("hello.txt"), b"through kubectl").unwrap();
    assert_eq!(
        std::fs::read(path.join("hello.txt")).unwrap(),
        b"through kubectl"
    );
    assert_eq!(
        volume_attachments(&cluster),
        vec![("node-0".to_string(), true)]
    );
    let pv = cluster.get_json(&["get", "pvc", "ebs-claim"])["spec"]["volumeName"]
        .as_str()
        .unwrap()
        .to_string();
    let status = cluster.status();
    for expected in [
        "node-0 Ready",
        "node-1 Ready",
        "kubernetes.io/csi/ebs.csi.aws.com^vol-",
        &format!("pv={pv} node=node-0 attached=true"),
        "pod default/ebs-pod Running Ready",
        "PersistentVolumeClaims: Bound 1",
    ] {
        assert!(
            status.contains(expected),
            "status lacks {expected:?}:\n{status}"
        );
    }
    let report = cluster.status_json();
    assert_eq!(report["nodes"].as_array().unwrap().len(), 2, "{report}");
    let attachments = report["volumeAttachments"].as_array().unwrap();
    assert_eq!(attachments.len(), 1, "{report}");
    assert_eq!(attachments[0]["pv"].as_str(), Some(pv.as_str()), "{report}");
    assert_eq!(attachments[0]["attached"].as_bool(), Some(true), "{report}");

    cluster.kubectl(&["delete", "pod", "ebs-pod", "--timeout=120s"], None);
    test_support::eventually("the VolumeAttachment gone", PATIENCE, || async {
        volume_attachments(&cluster).is_empty().then_some(())
    })
    .await;

    // hostpath: attachRequired false, so no VolumeAttachment at any time.
    cluster.kubectl(
        &["apply", "-f", "-"],
        Some(&claim_and_pod("hp-claim", "hostpath", "hp-pod", "node-1")),
    );
    cluster.kubectl(
        &[
            "wait",
            "--for=condition=Ready",
            "pod/hp-pod",
            "--timeout=120s",
        ],
        None,
    );
    assert_scheduled(&cluster, "hp-pod", "hp-claim", "node-1");
    let path = volume_path(&cluster, "hp-pod");
    assert!(
        path.starts_with(cluster.data_dir.join("nodes/node-1/kubelet")),
        "{path:?}"
    );
    std::fs::write(path.join("hello.txt"), b"hostpath").unwrap();
    assert!(volume_attachments(&cluster).is_empty());
    let hp_pv = cluster.get_json(&["get", "pvc", "hp-claim"])["spec"]["volumeName"]
        .as_str()
        .unwrap()
        .to_string();
    let affinity = cluster.get_json(&["get", "pv", &hp_pv])["spec"]["nodeAffinity"].to_string();
    assert!(affinity.contains("node-1"), "{affinity}");
    cluster.kubectl(&["delete", "pod", "hp-pod", "--timeout=120s"], None);
    assert!(volume_attachments(&cluster).is_empty());

    test_support::eventually(
        "status listing the unschedulable pod as stuck",
        PATIENCE,
        || async {
            let report = cluster.status_json();
            report["stuck"].as_array()?.iter().find(|s| {
                s["pod"] == "default/nowhere"
                    && s["reason"] == "FailedScheduling"
                    && s["message"].as_str().is_some_and(|m| !m.is_empty())
            })?;
            cluster.status().contains("default/nowhere").then_some(())
        },
    )
    .await;

    let exit = cluster.terminate().await;
    if !exit.success() {
        cluster.print_output();
    }
    assert!(exit.success(), "csi-cluster up ended with {exit}");
    assert_nothing_left(&cluster);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_up_on_the_same_data_dir_adopts_the_objects_and_ec2_volumes() {
    if !can_run() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let mut first = Cluster::start(work.path(), 1, 1);
    first.wait_ready().await;
    first.kubectl(
        &["apply", "-f", "-"],
        Some(&claim_and_pod("data", "ebs-sc", "app", "node-0")),
    );
    first.kubectl(
        &["wait", "--for=condition=Ready", "pod/app", "--timeout=120s"],
        None,
    );
    let path = volume_path(&first, "app");
    std::fs::write(path.join("kept.txt"), b"across restarts").unwrap();
    let pv = first.get_json(&["get", "pvc", "data"])["spec"]["volumeName"]
        .as_str()
        .unwrap()
        .to_string();
    let handle = first.get_json(&["get", "pv", &pv])["spec"]["csi"]["volumeHandle"]
        .as_str()
        .unwrap()
        .to_string();
    let provider = first.get_json(&["get", "node", "node-0"])["spec"]["providerID"].clone();
    let exit = first.terminate().await;
    assert!(exit.success(), "first up ended with {exit}");
    assert_nothing_left(&first);
    drop(first);

    let mut second = Cluster::start(work.path(), 1, 2);
    second.wait_ready().await;
    // The same node on the same EC2 instance, the claim still bound to the same volume.
    assert_eq!(
        second.get_json(&["get", "node", "node-0"])["spec"]["providerID"],
        provider
    );
    let claim = second.get_json(&["get", "pvc", "data"]);
    assert_eq!(claim["spec"]["volumeName"].as_str(), Some(pv.as_str()));
    assert_eq!(claim["status"]["phase"].as_str(), Some("Bound"));
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(second.data_dir.join("ec2/state.json")).unwrap())
            .unwrap();
    assert!(
        state["volumes"][&handle].is_object() && state["volumes"][&handle]["deleted_ms"].is_null(),
        "EC2 volume {handle} in ec2-sim's state: {}",
        state["volumes"]
    );
    // The pod is still there; its volume is attached, staged and published again.
    test_support::eventually(
        "the file back at the pod's volume path",
        PATIENCE,
        || async {
            let text = std::fs::read(path.join("kept.txt")).ok()?;
            (text == b"across restarts").then_some(())
        },
    )
    .await;
    assert_eq!(
        volume_attachments(&second),
        vec![("node-0".to_string(), true)]
    );
    // One `up` per data dir: a third one is refused and leaves the running one alone.
    let (ok, text) = second.run_cli(&["up", "--nodes", "1", "--timing", "fast", "--port", "0"]);
    assert!(!ok && text.contains("another csi-cluster"), "{text}");
    assert!(second.data_dir.join("csi-cluster.pid").exists());
    second.kubectl(&["delete", "pod", "app", "--timeout=120s"], None);
    let exit = second.down();
    assert!(exit.success(), "second up ended with {exit}");
    assert_nothing_left(&second);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_migration_the_in_tree_gp2_class_provisions_and_attaches_in_tree() {
    if !can_run() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start_with(work.path(), 1, 1, &["--migration", "aws-ebs=none"]);
    cluster.wait_ready().await;
    cluster.kubectl(
        &["apply", "-f", "-"],
        Some(&claim_and_pod("old", "gp2", "old-pod", "node-0")),
    );
    cluster.kubectl(
        &[
            "wait",
            "--for=condition=Ready",
            "pod/old-pod",
            "--timeout=120s",
        ],
        None,
    );
    let path = volume_path(&cluster, "old-pod");
    std::fs::write(path.join("hello.txt"), b"in-tree").unwrap();
    // The PV controller's in-tree plugin created it, the attach/detach controller attached it
    // through EC2 itself: an awsElasticBlockStore PV and no VolumeAttachment.
    let pv = cluster.get_json(&["get", "pvc", "old"])["spec"]["volumeName"]
        .as_str()
        .unwrap()
        .to_string();
    let pv = cluster.get_json(&["get", "pv", &pv]);
    let volume_id = pv["spec"]["awsElasticBlockStore"]["volumeID"]
        .as_str()
        .unwrap_or_else(|| panic!("not an in-tree PV: {pv}"));
    assert!(pv["spec"]["csi"].is_null(), "{pv}");
    assert!(volume_attachments(&cluster).is_empty());
    let attached =
        cluster.get_json(&["get", "node", "node-0"])["status"]["volumesAttached"].to_string();
    assert!(
        attached.contains(&format!("kubernetes.io/aws-ebs/{volume_id}")),
        "{attached}"
    );
    let exit = cluster.terminate().await;
    assert!(exit.success(), "csi-cluster up ended with {exit}");
    assert_nothing_left(&cluster);
}
