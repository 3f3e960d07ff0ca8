//! `csi-cluster up --hostpath-attach-required` (the real binary, driven with kubectl): the
//! hostpath CSIDriver says `attachRequired: true`, a hostpath claim's pod becomes Ready with a
//! VolumeAttachment that the hostpath csi-attacher marked attached (ControllerPublish through
//! the controller-only hostpath instance, which checks the node from the volume ID), and the
//! attachment goes with the pod. Then `up` again on the same data dir without the flag: the
//! CSIDriver is replaced (attachRequired false, said on stdout) and a new hostpath pod gets no
//! VolumeAttachment. Nothing is left after either stop.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{
    Cluster, PATIENCE, can_run, claim_and_pod, loop_devices_below, mounts_below, sockets_below,
    volume_attachments, volume_path,
};

fn assert_nothing_left(cluster: &Cluster) {
    let dir = &cluster.data_dir;
    assert_eq!(mounts_below(dir), Vec::<String>::new(), "mounts left");
    assert!(loop_devices_below(dir).is_empty(), "loop devices left");
    assert!(
        sockets_below(dir).is_empty(),
        "sockets left: {:?}",
        sockets_below(dir)
    );
}

fn hostpath_attach_required(cluster: &Cluster) -> Option<bool> {
    cluster.get_json(&["get", "csidriver", "hostpath.csi.k8s.io"])["spec"]["attachRequired"]
        .as_bool()
}

fn ready(cluster: &Cluster, pod: &str) {
    cluster.kubectl(
        &[
            "wait",
            "--for=condition=Ready",
            &format!("pod/{pod}"),
            "--timeout=120s",
        ],
        None,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostpath_with_attach_required_gets_an_attached_volumeattachment_and_without_none() {
    if !can_run() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start_with(work.path(), 2, 1, &["--hostpath-attach-required"]);
    cluster.wait_ready().await;
    assert_eq!(hostpath_attach_required(&cluster), Some(true));
    let out = std::fs::read_to_string(&cluster.stdout).unwrap();
    assert!(out.contains("hostpath.csi.k8s.io (attachRequired"), "{out}");

    cluster.kubectl(
        &["apply", "-f", "-"],
        Some(&claim_and_pod("hp-claim", "hostpath", "hp-pod", "node-1")),
    );
    ready(&cluster, "hp-pod");
    let vas = cluster.get_json(&["get", "volumeattachments"]);
    let items = vas["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{vas}");
    let va = &items[0];
    assert_eq!(va["spec"]["attacher"], "hostpath.csi.k8s.io", "{va}");
    assert_eq!(va["spec"]["nodeName"], "node-1", "{va}");
    assert_eq!(va["status"]["attached"], true, "{va}");
    let pv_name = cluster.get_json(&["get", "pvc", "hp-claim"])["spec"]["volumeName"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        va["spec"]["source"]["persistentVolumeName"],
        pv_name.as_str()
    );
    let handle = cluster.get_json(&["get", "pv", &pv_name])["spec"]["csi"]["volumeHandle"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        handle.starts_with("node-1_"),
        "the volume ID names its node: {handle}"
    );
    let path = volume_path(&cluster, "hp-pod");
    assert!(
        path.starts_with(cluster.data_dir.join("nodes/node-1/kubelet")),
        "{path:?}"
    );
    std::fs::write(path.join("hello.txt"), b"attached hostpath").unwrap();

    cluster.kubectl(&["delete", "pod", "hp-pod", "--timeout=120s"], None);
    test_support::eventually("the VolumeAttachment gone", PATIENCE, || async {
        volume_attachments(&cluster).is_empty().then_some(())
    })
    .await;
    cluster.kubectl(&["delete", "pvc", "hp-claim", "--timeout=120s"], None);
    test_support::eventually("the PV deleted", PATIENCE, || async {
        cluster.get_json(&["get", "pv"])["items"]
            .as_array()?
            .is_empty()
            .then_some(())
    })
    .await;
    let exit = cluster.terminate().await;
    if !exit.success() {
        cluster.print_output();
    }
    assert!(exit.success(), "csi-cluster up ended with {exit}");
    assert_nothing_left(&cluster);

    // The same data dir without the flag: the CSIDriver from the first run is replaced.
    let mut cluster = Cluster::start_with(work.path(), 2, 2, &[]);
    cluster.wait_ready().await;
    let out = std::fs::read_to_string(&cluster.stdout).unwrap();
    assert!(
        out.contains("replaced CSIDriver hostpath.csi.k8s.io (attachRequired true → false)"),
        "{out}"
    );
    assert_eq!(hostpath_attach_required(&cluster), Some(false));
    cluster.kubectl(
        &["apply", "-f", "-"],
        Some(&claim_and_pod(
            "hp-claim-2",
            "hostpath",
            "hp-pod-2",
            "node-0",
        )),
    );
    ready(&cluster, "hp-pod-2");
    assert!(volume_attachments(&cluster).is_empty());
    let path = volume_path(&cluster, "hp-pod-2");
    std::fs::write(path.join("hello.txt"), b"no attach").unwrap();
    cluster.kubectl(&["delete", "pod", "hp-pod-2", "--timeout=120s"], None);
    assert!(volume_attachments(&cluster).is_empty());
    let exit = cluster.down();
    assert!(exit.success(), "csi-cluster up ended with {exit}");
    assert_nothing_left(&cluster);
}
