//! The migration design (docs/design/migration.md) end to end on one in-process cluster (3 nodes in
//! one zone, everything real: ec2-sim on loop devices, the controllers, per node an agent and the
//! EBS driver):
//!
//! - the configuration table, controller × node migration on/off, plus a node without a
//!   CSINode: per configuration a gp2 (in-tree `kubernetes.io/aws-ebs`) claim used by a pod,
//!   which path provisioned, attached, mounted, unmounted, detached and deleted it (the
//!   in-tree plugin's EC2 calls and staging mounts vs the EBS driver's RPCs), and that no
//!   operation was done by both;
//! - then the upgrade (controller migrated, node drained, node migrated, pod back) and the
//!   downgrade (node drained and un-migrated, pod back, controller un-migrated) with the file
//!   written at the start read back whenever a pod has it mounted.
//!
//! One cluster serves every step: the migration design changes gates by restarting components,
//! which `RunningCluster` does in place.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path as FsPath, PathBuf};
use std::time::{Duration, Instant};

use cluster::config::Migration;
use cluster::demo::migration::observe;
use cluster::demo::migration::paths::{self, Counts, Op, Path};
use cluster::demo::migration::walkthrough;
use cluster::demo::narrator::Narrator;
use cluster::kube_ops;
use cluster::kube_ops::delete_claim;
use cluster::{RunningCluster, UpConfig};
use ebs_cloud::Cloud as _;
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::CSINode;
use kube::Api;
use kube::api::DeleteParams;
use serde_json::json;

const PATIENCE: Duration = Duration::from_secs(120);

/// Unmounts and releases whatever the cluster left below its data dir when the test fails
/// (dropped after the cluster: declared before it).
struct Cleanup(PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // The components' logs outlive the temp dir, to tell what went wrong.
            let kept = std::env::temp_dir()
                .join(format!("csi-cluster-migration-logs-{}", std::process::id()));
            let _ = std::process::Command::new("cp")
                .arg("-r")
                .arg(self.0.join("logs"))
                .arg(&kept)
                .status();
            eprintln!("the cluster's logs: {}", kept.display());
        }
        test_support::unmount_all_below(&self.0);
        for (dev, _) in common::loop_devices_below(&self.0) {
            let _ = std::process::Command::new("losetup")
                .arg("-d")
                .arg(dev)
                .status();
        }
    }
}

/// What one row of the table observed.
#[derive(Debug)]
struct Row {
    config: &'static str,
    node: &'static str,
    paths: Vec<(Op, Path)>,
}

impl Row {
    fn path(&self, op: Op) -> Path {
        self.paths
            .iter()
            .find(|(o, _)| *o == op)
            .map_or(Path::Neither, |(_, p)| *p)
    }
}

fn no_op_by_both(what: &str, served: &[paths::Served]) {
    for s in served {
        assert_ne!(s.path(), Path::Both, "{what}: {s}");
    }
}

/// A gp2 claim and a pod on `node`, the file written and read, then the pod, the claim and
/// the volume deleted; each phase's paths recorded. `attach` is what the configuration should
/// give for attach, mount, unmount and detach; `provision` for provision and delete.
async fn gp2_row(
    cluster: &RunningCluster,
    config: &'static str,
    node: &'static str,
    provision: Path,
    attach: Path,
) -> Row {
    let client = cluster.client().unwrap();
    let ec2 = cluster.ec2_client().await.unwrap();
    let claim = format!("row-{}", config.replace('/', "-"));
    let pod_name = format!("{claim}-pod");
    let before = Counts::of(cluster);
    kube_ops::create_claim(&client, &claim, Some("gp2"), None)
        .await
        .unwrap();
    kube_ops::create_pod(&client, &pod_name, &claim, node)
        .await
        .unwrap();
    let pod = kube_ops::wait_pod_ready(&client, &pod_name, PATIENCE)
        .await
        .unwrap();
    let pv = kube_ops::bound_volume(&client, &claim, PATIENCE)
        .await
        .unwrap();
    let pv_name = pv.metadata.name.clone().unwrap();
    let volume_id = observe::volume_id(&pv).unwrap();
    assert!(
        pv.spec.as_ref().unwrap().aws_elastic_block_store.is_some(),
        "{config}: a gp2 claim's PV is in-tree whoever provisioned it: {pv:?}"
    );
    let up = Counts::of(cluster).all_since(&before);
    no_op_by_both(config, &up);

    let dir = kube_ops::data_path(&pod).unwrap();
    assert_eq!(paths::mount_path_kind(&dir), attach, "{config}: {dir:?}");
    std::fs::write(dir.join("f"), config).unwrap();
    assert_eq!(std::fs::read_to_string(dir.join("f")).unwrap(), config);
    let listed = observe::volumes_attached(&client, node).await.unwrap();
    let name = listed.iter().find(|n| n.ends_with(&volume_id)).unwrap();
    assert_eq!(
        paths::attached_name_kind(name),
        attach,
        "{config}: {listed:?}"
    );
    let vas = kube_ops::attachments_of(&client, &pv_name).await.unwrap();
    match attach {
        Path::Csi => {
            assert_eq!(vas.len(), 1, "{config}: {vas:?}");
            assert!(vas[0].status.as_ref().is_some_and(|s| s.attached));
            assert_eq!(vas[0].spec.attacher, cluster::EBS_DRIVER);
        }
        _ => assert!(vas.is_empty(), "{config}: attached in-tree, yet {vas:?}"),
    }

    let before = Counts::of(cluster);
    kube_ops::delete_pod(&client, &pod_name, PATIENCE)
        .await
        .unwrap();
    observe::wait_detached(&client, &ec2, node, &pv_name, &volume_id, PATIENCE)
        .await
        .unwrap();
    delete_claim(&client, &claim, PATIENCE).await.unwrap();
    observe::wait_volume_gone(&ec2, &volume_id, PATIENCE)
        .await
        .unwrap();
    let down = Counts::of(cluster).all_since(&before);
    no_op_by_both(config, &down);

    let mut row = Row {
        config,
        node,
        paths: Vec::new(),
    };
    for op in [Op::Provision, Op::Attach, Op::Mount] {
        row.paths.push((op, paths::path_of(&up, op)));
    }
    for op in [Op::Unmount, Op::Detach, Op::Delete] {
        row.paths.push((op, paths::path_of(&down, op)));
    }
    for (op, want) in [
        (Op::Provision, provision),
        (Op::Attach, attach),
        (Op::Mount, attach),
        (Op::Unmount, attach),
        (Op::Detach, attach),
        (Op::Delete, provision),
    ] {
        assert_eq!(
            row.path(op),
            want,
            "{config} on {node}: {op}; {up:?} / {down:?}"
        );
    }
    row
}

/// Controller not migrated, node migrated: the migration design calls it unsupported; the
/// attach/detach controller refuses (an Event), so nothing is attached or mounted by either path.
async fn refused_row(cluster: &RunningCluster, node: &'static str) -> Row {
    let client = cluster.client().unwrap();
    let ec2 = cluster.ec2_client().await.unwrap();
    let (claim, pod_name) = ("row-off-on", "row-off-on-pod");
    let before = Counts::of(cluster);
    kube_ops::create_claim(&client, claim, Some("gp2"), None)
        .await
        .unwrap();
    kube_ops::create_pod(&client, pod_name, claim, node)
        .await
        .unwrap();
    let message = kube_ops::wait_for("a FailedAttachVolume Event", PATIENCE, || async {
        let events = kube_ops::events_of(&client, pod_name).await;
        Ok(events
            .split("; ")
            .find(|e| e.starts_with("FailedAttachVolume"))
            .map(str::to_string))
    })
    .await
    .unwrap();
    assert!(message.contains("migrat"), "{message}");
    let pv = kube_ops::bound_volume(&client, claim, PATIENCE)
        .await
        .unwrap();
    let pv_name = pv.metadata.name.clone().unwrap();
    let volume_id = observe::volume_id(&pv).unwrap();
    // Long enough for a wrong attach or mount to show.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let up = Counts::of(cluster).all_since(&before);
    no_op_by_both("off/on", &up);
    assert!(
        kube_ops::attachments_of(&client, &pv_name)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        observe::volumes_attached(&client, node)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        ec2.get_disk_by_id(&volume_id)
            .await
            .unwrap()
            .attachments
            .is_empty()
    );
    let before = Counts::of(cluster);
    kube_ops::delete_pod(&client, pod_name, PATIENCE)
        .await
        .unwrap();
    delete_claim(&client, claim, PATIENCE).await.unwrap();
    observe::wait_volume_gone(&ec2, &volume_id, PATIENCE)
        .await
        .unwrap();
    let down = Counts::of(cluster).all_since(&before);
    no_op_by_both("off/on", &down);
    let row = Row {
        config: "off/on",
        node,
        paths: vec![
            (Op::Provision, paths::path_of(&up, Op::Provision)),
            (Op::Attach, paths::path_of(&up, Op::Attach)),
            (Op::Mount, paths::path_of(&up, Op::Mount)),
            (Op::Unmount, paths::path_of(&down, Op::Unmount)),
            (Op::Detach, paths::path_of(&down, Op::Detach)),
            (Op::Delete, paths::path_of(&down, Op::Delete)),
        ],
    };
    for (op, want) in [
        (Op::Provision, Path::InTree),
        (Op::Attach, Path::Neither),
        (Op::Mount, Path::Neither),
        (Op::Unmount, Path::Neither),
        (Op::Detach, Path::Neither),
        (Op::Delete, Path::InTree),
    ] {
        assert_eq!(row.path(op), want, "off/on: {op}; {up:?} / {down:?}");
    }
    row
}

/// Controller migrated, a node without a CSINode (a kubelet too old to write one): the
/// migration design says the attach/detach controller falls back to in-tree. The node's agent is
/// stopped and its CSINode deleted while the pod is placed and attached; the agent (not migrated,
/// as such a kubelet) then mounts it.
async fn no_csinode_row(cluster: &RunningCluster, node: &'static str) -> Row {
    let client = cluster.client().unwrap();
    let ec2 = cluster.ec2_client().await.unwrap();
    let agent = cluster::node_agent(node);
    cluster.kill(&agent).unwrap();
    let csinodes = Api::<CSINode>::all(client.clone());
    csinodes
        .delete(node, &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(
        observe::csinode_migrated(&client, node).await.unwrap(),
        None
    );

    // A pre-provisioned in-tree volume: provisioning is not what this row is about.
    let disk = ec2
        .create_disk(
            "row-no-csinode",
            &ebs_cloud::DiskOptions {
                size_gib: 1,
                volume_type: "gp2".into(),
                zone: "us-east-1a".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let volume_id = disk.volume_id.clone();
    kube_ops::wait_for("the new volume available", PATIENCE, || async {
        let d = ec2.get_disk_by_id(&volume_id).await.unwrap();
        Ok((d.state == "available").then_some(()))
    })
    .await
    .unwrap();
    let pv_name = "row-no-csinode-pv";
    kube_ops::create_pv(
        &client,
        json!({
            "metadata": {"name": pv_name},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "awsElasticBlockStore": {"volumeID": format!("aws://us-east-1a/{volume_id}"), "fsType": "ext4"},
            },
        }),
    )
    .await
    .unwrap();
    let (claim, pod_name) = ("row-no-csinode", "row-no-csinode-pod");
    let before = Counts::of(cluster);
    kube_ops::create_claim(&client, claim, None, Some(pv_name))
        .await
        .unwrap();
    kube_ops::create_pod(&client, pod_name, claim, node)
        .await
        .unwrap();
    // Attached while the node has no CSINode (nobody runs to write one).
    let name = kube_ops::wait_for("attached with no CSINode", PATIENCE, || async {
        let listed = observe::volumes_attached(&client, node).await?;
        Ok(listed.into_iter().find(|n| n.ends_with(&volume_id)))
    })
    .await
    .unwrap();
    assert_eq!(paths::attached_name_kind(&name), Path::InTree, "{name}");
    assert_eq!(
        observe::csinode_migrated(&client, node).await.unwrap(),
        None
    );
    assert!(
        kube_ops::attachments_of(&client, pv_name)
            .await
            .unwrap()
            .is_empty()
    );
    cluster.start_component(&agent).unwrap();
    let pod = kube_ops::wait_pod_ready(&client, pod_name, PATIENCE)
        .await
        .unwrap();
    let dir = kube_ops::data_path(&pod).unwrap();
    std::fs::write(dir.join("f"), "no CSINode").unwrap();
    let up = Counts::of(cluster).all_since(&before);
    no_op_by_both("on/no CSINode", &up);
    assert_eq!(paths::mount_path_kind(&dir), Path::InTree, "{dir:?}");

    let before = Counts::of(cluster);
    kube_ops::delete_pod(&client, pod_name, PATIENCE)
        .await
        .unwrap();
    observe::wait_detached(&client, &ec2, node, pv_name, &volume_id, PATIENCE)
        .await
        .unwrap();
    let down = Counts::of(cluster).all_since(&before);
    no_op_by_both("on/no CSINode", &down);
    delete_claim(&client, claim, PATIENCE).await.unwrap();
    Api::<PersistentVolume>::all(client.clone())
        .delete(pv_name, &DeleteParams::default())
        .await
        .unwrap();
    ec2.delete_disk(&volume_id).await.unwrap();
    let row = Row {
        config: "on/no CSINode",
        node,
        paths: vec![
            (Op::Provision, Path::Neither),
            (Op::Attach, paths::path_of(&up, Op::Attach)),
            (Op::Mount, paths::path_of(&up, Op::Mount)),
            (Op::Unmount, paths::path_of(&down, Op::Unmount)),
            (Op::Detach, paths::path_of(&down, Op::Detach)),
            (Op::Delete, Path::Neither),
        ],
    };
    for op in [Op::Attach, Op::Mount, Op::Unmount, Op::Detach] {
        assert_eq!(
            row.path(op),
            Path::InTree,
            "on/no CSINode: {op}; {up:?} / {down:?}"
        );
    }
    row
}

/// The migration design's upgrade without waiting for the detach: the node is drained (its pod
/// deleted) and migrated while the in-tree detach of its volume still waits for EC2 (ec2-sim holds
/// it `detaching`), and a pod with the same volume comes back through CSI. When the in-tree
/// detach ends it must leave the new VolumeAttachment alone: the migration design's cleanup of the
/// VolumeAttachment the CSI path would have made is for one left from before, and deleting
/// this one detached the new pod's volume (found with realistic EC2 timing).
async fn detach_in_flight_while_the_node_migrates(cluster: &RunningCluster, node: &'static str) {
    let client = cluster.client().unwrap();
    let ec2 = cluster.ec2_client().await.unwrap();
    let claim = "race";
    kube_ops::create_claim(&client, claim, Some("gp2"), None)
        .await
        .unwrap();
    kube_ops::create_pod(&client, "race-1", claim, node)
        .await
        .unwrap();
    kube_ops::wait_pod_ready(&client, "race-1", PATIENCE)
        .await
        .unwrap();
    let pv = kube_ops::bound_volume(&client, claim, PATIENCE)
        .await
        .unwrap();
    let pv_name = pv.metadata.name.clone().unwrap();
    let volume_id = observe::volume_id(&pv).unwrap();
    let detaches = cluster.in_tree_ec2_metrics().calls("DetachVolume");
    cluster.ec2().set_faults(ec2_sim::Faults {
        stuck_detaching: vec![volume_id.clone()],
        ..Default::default()
    });
    kube_ops::delete_pod(&client, "race-1", PATIENCE)
        .await
        .unwrap();
    kube_ops::wait_for("the in-tree DetachVolume sent", PATIENCE, || async {
        Ok((cluster.in_tree_ec2_metrics().calls("DetachVolume") > detaches).then_some(()))
    })
    .await
    .unwrap();
    cluster.set_node_migration(node, true).await.unwrap();
    observe::wait_csinode(&client, node, true, PATIENCE)
        .await
        .unwrap();
    let unpublishes = cluster
        .ebs_controller_metrics()
        .rpc
        .calls("ControllerUnpublishVolume");
    kube_ops::create_pod(&client, "race-2", claim, node)
        .await
        .unwrap();
    let uid = kube_ops::wait_for("the CSI attach's VolumeAttachment", PATIENCE, || async {
        let vas = kube_ops::attachments_of(&client, &pv_name).await?;
        Ok(vas.first().and_then(|va| va.metadata.uid.clone()))
    })
    .await
    .unwrap();
    let disk = ec2.get_disk_by_id(&volume_id).await.unwrap();
    assert_eq!(
        disk.attachments.first().map(|a| a.state),
        Some(ebs_cloud::AttachmentState::Detaching),
        "the in-tree detach is still in flight"
    );
    cluster.ec2().set_faults(ec2_sim::Faults::default());
    let pod = kube_ops::wait_pod_ready(&client, "race-2", PATIENCE)
        .await
        .unwrap();
    let vas = kube_ops::attachments_of(&client, &pv_name).await.unwrap();
    assert_eq!(vas.len(), 1, "{vas:?}");
    assert_eq!(
        vas[0].metadata.uid.as_deref(),
        Some(uid.as_str()),
        "{vas:?}"
    );
    assert!(vas[0].status.as_ref().is_some_and(|s| s.attached));
    assert_eq!(
        cluster
            .ebs_controller_metrics()
            .rpc
            .calls("ControllerUnpublishVolume"),
        unpublishes,
        "the new VolumeAttachment was detached"
    );
    assert_eq!(
        paths::mount_path_kind(&kube_ops::data_path(&pod).unwrap()),
        Path::Csi
    );
    kube_ops::delete_pod(&client, "race-2", PATIENCE)
        .await
        .unwrap();
    observe::wait_detached(&client, &ec2, node, &pv_name, &volume_id, PATIENCE)
        .await
        .unwrap();
    delete_claim(&client, claim, PATIENCE).await.unwrap();
    observe::wait_volume_gone(&ec2, &volume_id, PATIENCE)
        .await
        .unwrap();
    cluster.set_node_migration(node, false).await.unwrap();
    observe::wait_csinode(&client, node, false, PATIENCE)
        .await
        .unwrap();
}

fn print_rows(rows: &[Row]) {
    eprintln!(
        "{:<14} {:<7} {:<9} {:<9} {:<9} {:<9} {:<9} {:<9}",
        "ctrl/node", "node", "provision", "attach", "mount", "unmount", "detach", "delete"
    );
    for r in rows {
        let c = |op| r.path(op).to_string();
        eprintln!(
            "{:<14} {:<7} {:<9} {:<9} {:<9} {:<9} {:<9} {:<9}",
            r.config,
            r.node,
            c(Op::Provision),
            c(Op::Attach),
            c(Op::Mount),
            c(Op::Unmount),
            c(Op::Detach),
            c(Op::Delete)
        );
    }
}

fn work_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        // Short: a registrar's socket path below it must fit in sun_path (108 bytes).
        .prefix("csi-mig-")
        .tempdir_in("/var/tmp")
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn seed_003_table_then_upgrade_and_downgrade() {
    if !common::can_run() {
        return;
    }
    let work = work_dir();
    let data: &FsPath = &work.path().join("d");
    let _cleanup = Cleanup(data.to_path_buf());
    let mut config = UpConfig::new(3, data);
    config.zones = 1;
    config.port = Some(0);
    config.migration = Migration {
        controller: false,
        node: false,
    };
    let started = Instant::now();
    let cluster = RunningCluster::start(config).await.unwrap();
    cluster.wait_ready().await.unwrap();
    let client = cluster.client().unwrap();
    eprintln!("cluster ready in {:.1} s", started.elapsed().as_secs_f64());

    // node-1 migrated, node-0 and node-2 not.
    cluster.set_node_migration("node-1", true).await.unwrap();
    observe::wait_csinode(&client, "node-1", true, PATIENCE)
        .await
        .unwrap();
    observe::wait_csinode(&client, "node-0", false, PATIENCE)
        .await
        .unwrap();

    let mut rows = vec![
        gp2_row(&cluster, "off/off", "node-0", Path::InTree, Path::InTree).await,
        refused_row(&cluster, "node-1").await,
    ];
    cluster.set_controller_migration(true).await.unwrap();
    rows.push(gp2_row(&cluster, "on/off", "node-0", Path::Csi, Path::InTree).await);
    rows.push(gp2_row(&cluster, "on/on", "node-1", Path::Csi, Path::Csi).await);
    rows.push(no_csinode_row(&cluster, "node-2").await);
    print_rows(&rows);
    eprintln!("table done in {:.1} s", started.elapsed().as_secs_f64());
    detach_in_flight_while_the_node_migrates(&cluster, "node-0").await;
    eprintln!(
        "detach in flight while the node migrates: done in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // The upgrade starts from a cluster that migrated nothing.
    cluster.set_controller_migration(false).await.unwrap();
    let steps = walkthrough::upgrade_and_downgrade(
        &cluster,
        "node-0",
        "upgrade",
        &mut Narrator::new(),
        PATIENCE,
    )
    .await
    .unwrap();
    let titles: Vec<&str> = steps.iter().map(|s| s.title.as_str()).collect();
    assert_eq!(
        titles,
        [
            "in-tree everywhere",
            "controller migrated",
            "node drained",
            "node migrated",
            "CSI everywhere",
            "node drained (CSI)",
            "node un-migrated",
            "in-tree again (controller still migrated)",
            "controller un-migrated",
            "cleaned up",
        ]
    );
    let step = |t: &str| steps.iter().find(|s| s.title == t).unwrap();
    // Attached in-tree before the controller migrates, still in-tree after (no VA, no
    // detach), detached in-tree by the drain.
    for t in ["in-tree everywhere", "controller migrated"] {
        assert_eq!(step(t).attached_as, Path::InTree, "{t}");
        assert_eq!(step(t).volume_attachments, 0, "{t}");
        assert_eq!(step(t).mounted_as, Path::InTree, "{t}");
    }
    assert_eq!(step("controller migrated").path(Op::Detach), Path::Neither);
    assert_eq!(step("node drained").path(Op::Detach), Path::InTree);
    let csi = step("CSI everywhere");
    assert_eq!(
        (csi.path(Op::Attach), csi.path(Op::Mount), csi.attached_as),
        (Path::Csi, Path::Csi, Path::Csi)
    );
    assert_eq!(csi.volume_attachments, 1);
    assert_eq!(step("node drained (CSI)").path(Op::Detach), Path::Csi);
    assert_eq!(step("node drained (CSI)").volume_attachments, 0);
    let back = step("in-tree again (controller still migrated)");
    assert_eq!(
        (
            back.path(Op::Attach),
            back.mounted_as,
            back.volume_attachments
        ),
        (Path::InTree, Path::InTree, 0)
    );
    assert_eq!(step("cleaned up").path(Op::Delete), Path::InTree);
    for s in &steps {
        for served in &s.served {
            assert_ne!(served.path(), Path::Both, "{}: {served}", s.title);
        }
    }
    // Every step with a pod read the file back.
    let checked: Vec<&str> = steps
        .iter()
        .filter(|s| s.data_checked)
        .map(|s| s.title.as_str())
        .collect();
    assert_eq!(
        checked,
        [
            "in-tree everywhere",
            "controller migrated",
            "CSI everywhere",
            "in-tree again (controller still migrated)",
            "controller un-migrated",
        ]
    );
    assert!(
        kube_ops::all_attachments(&client).await.unwrap().is_empty(),
        "VolumeAttachments left"
    );
    // Every EC2 call the simulator received came from one of the two counted clients (or the
    // test's own, which made one volume and deleted it): the counters miss nothing.
    let sim = cluster.ec2().call_counts();
    for (action, by_test) in [
        ("CreateVolume", 1),
        ("AttachVolume", 0),
        ("DetachVolume", 0),
        ("DeleteVolume", 1),
    ] {
        let counted = cluster.in_tree_ec2_metrics().calls(action)
            + cluster.ebs_controller_metrics().ec2.calls(action)
            + by_test;
        assert_eq!(
            sim.get(action).copied().unwrap_or(0),
            counted,
            "{action}: {sim:?}"
        );
    }
    let took = started.elapsed();
    eprintln!("table and walkthrough done in {:.1} s", took.as_secs_f64());
    cluster.stop().await.unwrap();
    assert!(common::mounts_below(data).is_empty());
    assert!(common::loop_devices_below(data).is_empty());
}
