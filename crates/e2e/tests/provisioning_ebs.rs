//! Dynamic provisioning with the real EBS driver on ec2-sim (the provisioner's end-to-end test):
//! the PV controller and the external provisioner from their libraries (the provisioner as its
//! binary where a SIGKILL is needed), the EBS driver's controller service on a unix socket with its
//! own aws-sdk-ec2 client, and apiserver-lite.
//!
//! What EC2 holds is read from ec2-sim's state; which path made or deleted a volume from who
//! called: the provisioner's CSI call metrics (with their `migrated` label), the PV
//! controller's own EC2 client (the in-tree plugin) and ec2-sim's call counts.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::DRIVER;
use common::ebs_world::*;
use common::provisioning::*;
use ebs_cloud::{Cloud, DiskOptions};
use ec2_sim::Faults;
use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, PersistentVolume, PersistentVolumeSpec, Secret,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use serde_json::Value;

const ANN_STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
const ANN_BETA_STORAGE_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";
const ANN_MIGRATED_TO: &str = "pv.kubernetes.io/migrated-to";
const ANN_PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
const ANN_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
const PV_FINALIZER: &str = "external-provisioner.volume.kubernetes.io/finalizer";
const MIGRATION_ON: &str = "CSIMigrationAWS=true";

fn zones_of(pv: &PersistentVolume) -> Vec<(String, Vec<String>)> {
    let terms = pv
        .spec
        .as_ref()
        .unwrap()
        .node_affinity
        .as_ref()
        .expect("node affinity")
        .required
        .as_ref()
        .unwrap()
        .node_selector_terms
        .clone();
    terms
        .into_iter()
        .flat_map(|t| t.match_expressions.unwrap_or_default())
        .map(|e| (e.key, e.values.unwrap_or_default()))
        .collect()
}

/// 1. An Immediate class of the CSI driver: the provisioner creates the volume through the
///    driver, the PV controller binds the claim to the PV it made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn immediate_csi_class_binds_a_volume_made_by_the_driver() {
    let world = EbsWorld::start().await;
    let o = world.objects();
    o.create_ebs_node("node-b", "us-east-1b").await;
    let mut sc = class(
        "gp3-xfs",
        DRIVER,
        "Immediate",
        "Delete",
        &[("type", "gp3"), ("csi.storage.k8s.io/fstype", "xfs")],
    );
    sc.mount_options = Some(vec!["noatime".into()]);
    o.create_class(sc).await;
    let _pvc_ctl = world.pv_controller("", false).await;
    let prov = world.provisioner().await;

    let claim = o.create_pvc(pvc("data", Some("gp3-xfs"), "3Gi")).await;
    let (bound, pv) = o.wait_bound("data").await;
    let name = pv_name(&claim);
    assert_eq!(pv.metadata.name.as_deref(), Some(name.as_str()));

    // The claim: marked for our driver by the PV controller, bound by it.
    let ann = bound.metadata.annotations.clone().unwrap();
    assert_eq!(ann[ANN_STORAGE_PROVISIONER], DRIVER);
    assert_eq!(ann[ANN_BETA_STORAGE_PROVISIONER], DRIVER);
    assert_eq!(ann["pv.kubernetes.io/bind-completed"], "yes");
    assert!(!ann.contains_key(ANN_MIGRATED_TO));
    let status = bound.status.clone().unwrap();
    assert_eq!(status.capacity.unwrap()["storage"].0, "3Gi");

    // The volume in EC2: one, the claim's size, the class's type, the node's zone, named and
    // tagged for the claim.
    let volumes = world.volumes();
    assert_eq!(volumes.len(), 1, "{volumes:#?}");
    let v = &volumes[0];
    assert_eq!(
        (v.size_gib, v.volume_type.as_str(), v.zone.as_str()),
        (3, "gp3", "us-east-1b")
    );
    assert_eq!(v.tag("CSIVolumeName"), Some(name.as_str()));
    assert_eq!(v.tag("kubernetes.io/created-for/pvc/name"), Some("data"));
    assert_eq!(v.tag("kubernetes.io/created-for/pvc/namespace"), Some(NS));
    assert_eq!(
        v.tag("kubernetes.io/created-for/pv/name"),
        Some(name.as_str())
    );

    // The PV, field by field.
    let ann = pv.metadata.annotations.clone().unwrap();
    assert_eq!(ann[ANN_PROVISIONED_BY], DRIVER);
    let finalizers = pv.metadata.finalizers.clone().unwrap_or_default();
    assert!(
        finalizers.contains(&PV_FINALIZER.to_string()),
        "{finalizers:?}"
    );
    assert!(finalizers.contains(&"kubernetes.io/pv-protection".to_string()));
    let spec = pv.spec.clone().unwrap();
    let csi = spec.csi.clone().unwrap();
    assert_eq!(csi.driver, DRIVER);
    assert_eq!(csi.volume_handle, v.id);
    assert_eq!(csi.fs_type.as_deref(), Some("xfs"));
    assert_eq!(spec.capacity.unwrap()["storage"].0, "3Gi");
    assert_eq!(spec.access_modes.unwrap(), vec!["ReadWriteOnce"]);
    assert_eq!(spec.volume_mode.as_deref(), Some("Filesystem"));
    assert_eq!(
        spec.persistent_volume_reclaim_policy.as_deref(),
        Some("Delete")
    );
    assert_eq!(spec.storage_class_name.as_deref(), Some("gp3-xfs"));
    assert_eq!(spec.mount_options.unwrap(), vec!["noatime"]);
    let claim_ref = spec.claim_ref.unwrap();
    assert_eq!(claim_ref.uid, claim.metadata.uid);
    assert_eq!(claim_ref.name.as_deref(), Some("data"));
    let affinity = zones_of(&pv);
    assert!(
        affinity.contains(&(EBS_ZONE_KEY.to_string(), vec!["us-east-1b".to_string()])),
        "{affinity:?}"
    );
    // Exactly once: a claim event that overtakes our PV's watch event does not repeat it.
    assert_eq!(prov.calls(CREATE_VOLUME, Some(false)), 1);
    assert_eq!(prov.calls(CREATE_VOLUME, Some(true)), 0);
    assert_eq!(world.in_tree_ec2.calls("CreateVolume"), 0);
}

/// 2. WaitForFirstConsumer: nothing happens until the scheduler (the test) picks a node; the
///    volume then lands in that node's zone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_first_consumer_provisions_in_the_selected_nodes_zone() {
    let world = EbsWorld::start().await;
    let o = world.objects();
    o.create_ebs_node("node-b", "us-east-1b").await;
    o.create_ebs_node("node-c", "us-east-1c").await;
    o.create_class(class(
        "late",
        DRIVER,
        "WaitForFirstConsumer",
        "Delete",
        &[("type", "gp2")],
    ))
    .await;
    let _pvc_ctl = world.pv_controller("", false).await;
    let prov = world.provisioner().await;

    let claim = o.create_pvc(pvc("late", Some("late"), "1Gi")).await;
    o.wait_event("late", "WaitForFirstConsumer").await;
    // A few more passes of both controllers: still nothing.
    let pending = o.pvc("late").await.unwrap();
    assert!(
        annotation(&pending.metadata, ANN_STORAGE_PROVISIONER).is_none(),
        "not handed to a provisioner before a node is picked"
    );
    assert_eq!(prov.attempts(CREATE_VOLUME), 0);
    assert_eq!(world.ec2_creates(), 0);
    assert!(world.volumes().is_empty());

    o.annotate_pvc("late", ANN_SELECTED_NODE, "node-c").await;
    let (bound, pv) = o.wait_bound("late").await;
    assert_eq!(
        annotation(&bound.metadata, ANN_STORAGE_PROVISIONER),
        Some(DRIVER)
    );
    let volumes = world.volumes_named(&pv_name(&claim));
    assert_eq!(volumes.len(), 1);
    assert_eq!(volumes[0].zone, "us-east-1c", "the selected node's zone");
    assert!(zones_of(&pv).contains(&(EBS_ZONE_KEY.to_string(), vec!["us-east-1c".to_string()])));
    assert_eq!(world.volumes().len(), 1);
}

/// 3. Static binding: a PV an administrator made for an existing EC2 volume binds to a claim
///    with no provisioning at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pre_created_pv_binds_without_any_create_volume() {
    let world = EbsWorld::start().await;
    let o = world.objects();
    let disk = world
        .in_tree_cloud
        .create_disk(
            "static-volume",
            &DiskOptions {
                size_gib: 2,
                volume_type: "gp3".into(),
                zone: "us-east-1a".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    // A class exists, so dynamic provisioning would be possible: the PV must win.
    o.create_class(class("manual", DRIVER, "Immediate", "Retain", &[]))
        .await;
    let _pvc_ctl = world.pv_controller("", false).await;
    let prov = world.provisioner().await;
    let pv = PersistentVolume {
        metadata: ObjectMeta {
            name: Some("static-pv".into()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            capacity: Some([("storage".to_string(), Quantity("2Gi".into()))].into()),
            csi: Some(CSIPersistentVolumeSource {
                driver: DRIVER.into(),
                volume_handle: disk.volume_id.clone(),
                fs_type: Some("ext4".into()),
                ..Default::default()
            }),
            persistent_volume_reclaim_policy: Some("Retain".into()),
            storage_class_name: Some("manual".into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    o.create_pv(pv).await;
    // Available: the PV controller has it in its cache (a claim it saw first would go to the
    // provisioner, as with kcm).
    eventually("the PV is Available", || async {
        let pv = o.pv("static-pv").await?;
        (pv.status?.phase.as_deref() == Some("Available")).then_some(())
    })
    .await;
    o.create_pvc(pvc("claim", Some("manual"), "2Gi")).await;
    let (bound, pv) = o.wait_bound("claim").await;
    assert_eq!(pv.metadata.name.as_deref(), Some("static-pv"));
    assert_eq!(
        bound.spec.unwrap().volume_name.as_deref(),
        Some("static-pv")
    );
    assert!(
        annotation(&bound.metadata, ANN_STORAGE_PROVISIONER).is_none(),
        "a matching PV: no provisioner is asked"
    );
    assert_eq!(prov.attempts(CREATE_VOLUME), 0, "no CSI CreateVolume");
    assert_eq!(world.ec2_creates(), 1, "only the test's own CreateVolume");
    assert_eq!(world.volumes().len(), 1);
}

/// Flattens JSON into `path -> leaf value` (`metadata.annotations[key]`, `spec.x.0.y`).
fn flatten(prefix: &str, value: &Value, out: &mut BTreeMap<String, Value>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                let key = if k.contains('.') || k.contains('/') {
                    format!("{prefix}[{k}]")
                } else if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, out);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                flatten(&format!("{prefix}.{i}"), v, out);
            }
        }
        leaf => {
            out.insert(prefix.to_string(), leaf.clone());
        }
    }
}

/// A PV's fields that can be compared across two claims: what differs by nature (names, uids,
/// resource versions, timestamps) is taken out, after the caller checked it.
fn comparable(pv: &PersistentVolume) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    flatten("", &serde_json::to_value(pv).unwrap(), &mut out);
    out.retain(|k, _| {
        !(k == "metadata.name"
            || k == "metadata.uid"
            || k == "metadata.resourceVersion"
            || k == "metadata.creationTimestamp"
            || k.starts_with("metadata.managedFields")
            || k.starts_with("metadata.finalizers")
            || k == "spec.claimRef.name"
            || k == "spec.claimRef.uid"
            || k == "spec.awsElasticBlockStore.volumeID"
            || k == "status.lastPhaseTransitionTime")
    });
    out
}

/// 4. A `kubernetes.io/aws-ebs` class, migrated (the CSI driver provisions, the PV is stored
///    in-tree) and not migrated (the PV controller's in-tree provisioner, no CSI call): the two
///    PVs and the two EC2 volumes are the same except for the differences docs/provisioner.md
///    lists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrated_and_in_tree_provisioning_of_an_aws_ebs_class_agree() {
    let world = EbsWorld::start().await;
    let o = world.objects();
    let mut sc = class(
        "ebs-io1",
        IN_TREE_EBS,
        "Immediate",
        "Delete",
        &[
            ("type", "io1"),
            ("iopsPerGB", "20"),
            ("encrypted", "true"),
            ("zones", "us-east-1b"),
            ("fsType", "ext4"),
        ],
    );
    sc.mount_options = Some(vec!["noatime".into()]);
    o.create_class(sc).await;
    let prov = world.provisioner().await;

    // (a) Migration on: the PV controller hands the claim to the CSI driver.
    let migrated_ctl = world.pv_controller(MIGRATION_ON, false).await;
    let migrated_claim = o.create_pvc(pvc("migrated", Some("ebs-io1"), "10Gi")).await;
    let (bound, migrated_pv) = o.wait_bound("migrated").await;
    let ann = bound.metadata.annotations.clone().unwrap();
    assert_eq!(ann[ANN_STORAGE_PROVISIONER], DRIVER);
    assert_eq!(ann[ANN_BETA_STORAGE_PROVISIONER], DRIVER);
    // As kube-controller-manager v1.26: no migrated-to on the claim (it is on the PV).
    assert!(!ann.contains_key(ANN_MIGRATED_TO));
    assert_eq!(
        prov.calls(CREATE_VOLUME, Some(true)),
        1,
        "the driver's CreateVolume, once, for a migrated volume"
    );
    assert_eq!(world.in_tree_ec2.calls("CreateVolume"), 0);
    assert_eq!(world.ec2_creates(), 1);
    let ann = migrated_pv.metadata.annotations.clone().unwrap();
    assert_eq!(ann[ANN_PROVISIONED_BY], IN_TREE_EBS);
    assert_eq!(ann[ANN_MIGRATED_TO], DRIVER);
    let spec = migrated_pv.spec.clone().unwrap();
    assert!(spec.csi.is_none(), "stored in-tree");
    let migrated_source = spec.aws_elastic_block_store.unwrap();
    let migrated_volume = world
        .volumes_named(&pv_name(&migrated_claim))
        .pop()
        .unwrap();
    assert_eq!(migrated_source.volume_id, migrated_volume.id);
    migrated_ctl.stop("the PV controller", PATIENCE).await;
    let csi_creates = prov.attempts(CREATE_VOLUME);

    // (b) Migration off, `--cloud-provider=aws`: the in-tree provisioner makes it.
    let in_tree_ctl = world.pv_controller("", true).await;
    let in_tree_claim = o.create_pvc(pvc("in-tree", Some("ebs-io1"), "10Gi")).await;
    let (bound, in_tree_pv) = o.wait_bound("in-tree").await;
    let ann = bound.metadata.annotations.clone().unwrap();
    assert_eq!(ann[ANN_STORAGE_PROVISIONER], IN_TREE_EBS);
    assert!(!ann.contains_key(ANN_MIGRATED_TO));
    assert_eq!(world.in_tree_ec2.calls("CreateVolume"), 1);
    assert_eq!(world.ec2_creates(), 2);
    assert_eq!(
        prov.attempts(CREATE_VOLUME),
        csi_creates,
        "no CSI call for the in-tree claim"
    );
    let in_tree_source = in_tree_pv
        .spec
        .clone()
        .unwrap()
        .aws_elastic_block_store
        .unwrap();
    let in_tree_volume = world.volumes_named(&pv_name(&in_tree_claim)).pop().unwrap();
    assert_eq!(
        in_tree_source.volume_id,
        format!("aws://us-east-1b/{}", in_tree_volume.id)
    );

    // The two EC2 volumes: equal but for their IDs and the claim-specific tags.
    let claim_specific = |v: &SimVolume, claim: &str, pv: &str| {
        let mut tags = v.tag_map();
        assert_eq!(
            tags.remove("kubernetes.io/created-for/pvc/name").as_deref(),
            Some(claim)
        );
        assert_eq!(
            tags.remove("kubernetes.io/created-for/pv/name").as_deref(),
            Some(pv)
        );
        assert_eq!(tags.remove("CSIVolumeName").as_deref(), Some(pv));
        assert_eq!(
            tags.remove("Name"),
            Some(format!("{CLUSTER_NAME}-dynamic-{pv}"))
        );
        tags
    };
    let m_name = pv_name(&migrated_claim);
    let i_name = pv_name(&in_tree_claim);
    assert_eq!(
        claim_specific(&migrated_volume, "migrated", &m_name),
        claim_specific(&in_tree_volume, "in-tree", &i_name),
        "the other tags are the same"
    );
    let shape = |v: &SimVolume| {
        (
            v.size_gib,
            v.volume_type.clone(),
            v.iops,
            v.encrypted,
            v.kms_key_id.clone(),
            v.zone.clone(),
        )
    };
    assert_eq!(shape(&migrated_volume), shape(&in_tree_volume));
    assert_eq!(
        shape(&in_tree_volume),
        (
            10,
            "io1".into(),
            Some(200),
            true,
            in_tree_volume.kms_key_id.clone(),
            "us-east-1b".into()
        )
    );

    // The two PVs, field by field.
    for (pv, claim, name) in [
        (&migrated_pv, &migrated_claim, &m_name),
        (&in_tree_pv, &in_tree_claim, &i_name),
    ] {
        assert_eq!(pv.metadata.name.as_ref(), Some(name));
        let claim_ref = pv.spec.as_ref().unwrap().claim_ref.clone().unwrap();
        assert_eq!(claim_ref.uid, claim.metadata.uid);
        assert_eq!(claim_ref.name, claim.metadata.name);
    }
    let finalizers = |pv: &PersistentVolume| -> BTreeSet<String> {
        pv.metadata
            .finalizers
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect()
    };
    let mut expected_finalizers = finalizers(&in_tree_pv);
    assert!(expected_finalizers.contains("kubernetes.io/pv-protection"));
    expected_finalizers.insert(PV_FINALIZER.to_string());
    assert_eq!(
        finalizers(&migrated_pv),
        expected_finalizers,
        "ours adds the external provisioner's finalizer"
    );
    let ours = comparable(&migrated_pv);
    let theirs = comparable(&in_tree_pv);
    let mut differences: BTreeMap<String, (Option<Value>, Option<Value>)> = BTreeMap::new();
    for key in ours.keys().chain(theirs.keys()) {
        let (a, b) = (theirs.get(key), ours.get(key));
        if a != b {
            differences.insert(key.clone(), (a.cloned(), b.cloned()));
        }
    }
    // docs/provisioner.md, "Migrated in-tree classes": the documented differences.
    let documented: BTreeSet<&str> = [
        "metadata.annotations[kubernetes.io/createdby]",
        "metadata.annotations[pv.kubernetes.io/bound-by-controller]",
        "metadata.annotations[pv.kubernetes.io/migrated-to]",
        "metadata.annotations[volume.kubernetes.io/provisioner-deletion-secret-name]",
        "metadata.annotations[volume.kubernetes.io/provisioner-deletion-secret-namespace]",
        "spec.claimRef.resourceVersion",
    ]
    .into();
    let found: BTreeSet<&str> = differences.keys().map(String::as_str).collect();
    assert_eq!(
        found, documented,
        "in-tree vs migrated PV (in-tree, ours): {differences:#?}"
    );
    assert_eq!(
        differences["metadata.annotations[kubernetes.io/createdby]"],
        (Some(Value::from("aws-ebs-dynamic-provisioner")), None)
    );
    assert_eq!(
        differences["metadata.annotations[pv.kubernetes.io/migrated-to]"],
        (None, Some(Value::from(DRIVER)))
    );
    assert_eq!(
        differences["metadata.annotations[volume.kubernetes.io/provisioner-deletion-secret-name]"],
        (None, Some(Value::from("")))
    );
    // Same zone labels and affinity, same fsType, capacity, modes, class, mount options.
    assert_eq!(
        ours["metadata.labels[topology.kubernetes.io/zone]"],
        "us-east-1b"
    );
    assert_eq!(ours["spec.awsElasticBlockStore.fsType"], "ext4");
    assert_eq!(ours["spec.capacity.storage"], "10Gi");
    assert_eq!(ours["spec.mountOptions.0"], "noatime");

    // Delete with migration off: the PV controller's in-tree deleter, no CSI call.
    o.delete_pvc("in-tree").await;
    eventually("the in-tree PV and its EC2 volume are gone", || async {
        (o.pv(&i_name).await.is_none() && world.volumes_named(&i_name).is_empty()).then_some(())
    })
    .await;
    assert_eq!(world.in_tree_ec2.calls("DeleteVolume"), 1);
    assert_eq!(prov.attempts(DELETE_VOLUME), 0);
    in_tree_ctl.stop("the PV controller", PATIENCE).await;
}

/// 5. Reclaim: Delete removes the EC2 volume and the PV (a CSI PV and a migrated in-tree PV,
///    both through the driver); Retain leaves the PV Released and the volume in EC2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_removes_volume_and_pv_retain_keeps_them() {
    let world = EbsWorld::start().await;
    let o = world.objects();
    o.create_ebs_node("node-a", "us-east-1a").await;
    o.create_class(class("csi-delete", DRIVER, "Immediate", "Delete", &[]))
        .await;
    o.create_class(class("csi-retain", DRIVER, "Immediate", "Retain", &[]))
        .await;
    o.create_class(class(
        "in-tree-delete",
        IN_TREE_EBS,
        "Immediate",
        "Delete",
        &[("type", "gp2"), ("zones", "us-east-1a")],
    ))
    .await;
    let _pvc_ctl = world.pv_controller(MIGRATION_ON, false).await;
    let prov = world.provisioner().await;
    let mut volumes = BTreeMap::new();
    for (claim, class) in [
        ("csi-delete", "csi-delete"),
        ("csi-retain", "csi-retain"),
        ("migrated-delete", "in-tree-delete"),
    ] {
        let c = o.create_pvc(pvc(claim, Some(class), "1Gi")).await;
        volumes.insert(claim, pv_name(&c));
    }
    for claim in volumes.keys() {
        o.wait_bound(claim).await;
    }
    assert_eq!(world.volumes().len(), 3);
    for claim in volumes.keys() {
        o.delete_pvc(claim).await;
    }
    for claim in ["csi-delete", "migrated-delete"] {
        let name = &volumes[claim];
        eventually(&format!("{claim}: PV and EC2 volume gone"), || async {
            (o.pv(name).await.is_none() && world.volumes_named(name).is_empty()).then_some(())
        })
        .await;
    }
    let retained = &volumes["csi-retain"];
    let pv = eventually("the retained PV is Released", || async {
        let pv = o.pv(retained).await?;
        (pv.status.as_ref()?.phase.as_deref() == Some("Released")).then_some(pv)
    })
    .await;
    assert!(
        !pv.metadata
            .finalizers
            .unwrap_or_default()
            .contains(&PV_FINALIZER.to_string()),
        "a Retain PV carries no delete guard"
    );
    assert_eq!(world.volumes_named(retained).len(), 1, "kept in EC2");
    assert!(prov.calls(DELETE_VOLUME, Some(false)) >= 1);
    assert!(prov.calls(DELETE_VOLUME, Some(true)) >= 1);
    assert_eq!(world.in_tree_ec2.calls("DeleteVolume"), 0);
    let deletes = prov.attempts(DELETE_VOLUME);
    // The administrator deletes the retained PV: the volume stays (and can be reused).
    o.pvs().delete(retained, &Default::default()).await.unwrap();
    eventually("the retained PV is gone", || async {
        o.pv(retained).await.is_none().then_some(())
    })
    .await;
    assert_eq!(world.volumes_named(retained).len(), 1);
    assert_eq!(
        prov.attempts(DELETE_VOLUME),
        deletes,
        "no DeleteVolume for it"
    );
}

/// Slows the driver's EC2 calls after its CreateVolume: the driver waits for the volume to be
/// `available` with DescribeVolumes, each of which now takes `ms`.
fn slow_describes(world: &EbsWorld, ms: u64) {
    world.sim.set_faults(Faults {
        latency_ms: [("DescribeVolumes".to_string(), ms)].into(),
        ..Faults::default()
    });
}

/// 6. The provisioner is SIGKILLed while the driver's CreateVolume is in flight (the EC2
///    volume exists, the driver still waits for it): a new provisioner finishes the job with the
///    same volume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provisioner_killed_mid_create_volume_leaves_one_volume_and_one_pv() {
    let Some(bin) = provisioner_bin() else {
        test_support::skip_or_fail(
            "no csi-provisioner built in this target dir and CSI_PROVISIONER_BIN unset \
             (`cargo build -p provisioner --bin csi-provisioner`, or scripts/test)",
        );
        return;
    };
    let world = EbsWorld::start().await;
    let o = world.objects();
    o.create_ebs_node("node-a", "us-east-1a").await;
    o.create_class(class("slow", DRIVER, "Immediate", "Delete", &[]))
        .await;
    let _pvc_ctl = world.pv_controller("", false).await;
    let args = [
        "--feature-gates=Topology=true",
        "--extra-create-metadata",
        "--timeout=120s",
        "--retry-interval-start=100ms",
        "--retry-interval-max=1s",
        "-v=4",
    ];
    // Every DescribeVolumes takes 3 s: the driver's look-up by name before its EC2
    // CreateVolume and its waits for `available` after it. Once ec2-sim has answered the
    // CreateVolume, the volume exists while the CSI call is still in flight.
    slow_describes(&world, 3_000);
    let first = ProvisionerProcess::spawn(
        &bin,
        &world.server,
        world.dir.path(),
        "first",
        &world.endpoint,
        &args,
    );
    let claim = o.create_pvc(pvc("crash", Some("slow"), "1Gi")).await;
    let name = pv_name(&claim);
    eventually("EC2 CreateVolume called for the claim", || async {
        (world.ec2_creates() >= 1).then_some(())
    })
    .await;
    assert!(o.pv(&name).await.is_none(), "still in flight");
    first.kill();
    world.sim.set_faults(Faults::default());

    let second = ProvisionerProcess::spawn(
        &bin,
        &world.server,
        world.dir.path(),
        "second",
        &world.endpoint,
        &args,
    );
    let (_, pv) = o.wait_bound("crash").await;
    assert_eq!(pv.metadata.name.as_deref(), Some(name.as_str()));
    let volumes = world.volumes();
    assert_eq!(volumes.len(), 1, "exactly one EC2 volume: {volumes:#?}");
    assert_eq!(volumes[0].tag("CSIVolumeName"), Some(name.as_str()));
    assert_eq!(pv.spec.unwrap().csi.unwrap().volume_handle, volumes[0].id);
    let pvs = o.pvs().list(&ListParams::default()).await.unwrap().items;
    assert_eq!(pvs.len(), 1, "exactly one PV");
    second.terminate().await;
}

/// 7. A claim deleted while its CreateVolume is in flight: the volume made meanwhile is deleted,
///    no PV is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_deleted_while_provisioning_leaks_nothing() {
    let world = EbsWorld::start().await;
    let o = world.objects();
    o.create_ebs_node("node-a", "us-east-1a").await;
    o.create_class(class("slow", DRIVER, "Immediate", "Delete", &[]))
        .await;
    let _pvc_ctl = world.pv_controller("", false).await;
    let prov = world.provisioner().await;
    slow_describes(&world, 2_000);
    o.create_pvc(pvc("gone", Some("slow"), "1Gi")).await;
    eventually("EC2 CreateVolume called for the claim", || async {
        (world.ec2_creates() >= 1).then_some(())
    })
    .await;
    o.delete_pvc("gone").await;
    eventually("the claim is gone (pvc-protection released)", || async {
        o.pvc("gone").await.is_none().then_some(())
    })
    .await;
    world.sim.set_faults(Faults::default());
    eventually("no EC2 volume and no PV left", || async {
        let pvs = o.pvs().list(&ListParams::default()).await.unwrap().items;
        (world.volumes().is_empty() && pvs.is_empty() && prov.calls(DELETE_VOLUME, None) >= 1)
            .then_some(())
    })
    .await;
    assert_eq!(world.ec2_creates(), 1, "one volume made, and deleted");
}

/// 8. Conflicting writes: two provisioners without leader election race for the same claims
///    while the test keeps rewriting every claim and PV (each write bumps the resourceVersion,
///    so the controllers' guarded writes get 409s): still one volume and one Bound PV per claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicts_are_retried_one_volume_one_pv_per_claim() {
    let world = EbsWorld::start().await;
    let o = world.objects();
    o.create_ebs_node("node-a", "us-east-1a").await;
    o.create_class(class("race", DRIVER, "Immediate", "Delete", &[]))
        .await;
    let _pvc_ctl = world.pv_controller("", false).await;
    let first = world.provisioner().await;
    let second = world.provisioner().await;

    let meddling = Arc::new(AtomicBool::new(true));
    let meddler = {
        let o = o.clone();
        let meddling = meddling.clone();
        tokio::spawn(async move {
            let mut n = 0u64;
            while meddling.load(Ordering::Relaxed) {
                n += 1;
                let patch = serde_json::json!({"metadata": {"labels": {"meddled": n.to_string()}}});
                let claims = o.pvcs().list(&ListParams::default()).await.unwrap().items;
                for c in claims {
                    let name = c.metadata.name.unwrap();
                    let _ = o
                        .pvcs()
                        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await;
                }
                let pvs = o.pvs().list(&ListParams::default()).await.unwrap().items;
                for pv in pvs {
                    let name = pv.metadata.name.unwrap();
                    let _ = o
                        .pvs()
                        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await;
                }
            }
        })
    };
    let claims: Vec<_> = create_race_claims(&o, 4).await;
    for c in &claims {
        o.wait_bound(c.metadata.name.as_deref().unwrap()).await;
    }
    meddling.store(false, Ordering::Relaxed);
    meddler.await.unwrap();

    for c in &claims {
        let name = pv_name(c);
        assert_eq!(world.volumes_named(&name).len(), 1, "one volume for {name}");
        let (_, pv) = o.wait_bound(c.metadata.name.as_deref().unwrap()).await;
        assert_eq!(pv.metadata.name.as_deref(), Some(name.as_str()));
    }
    assert_eq!(world.volumes().len(), claims.len());
    let pvs = o.pvs().list(&ListParams::default()).await.unwrap().items;
    assert_eq!(pvs.len(), claims.len());
    // The controllers' guarded writes of claims and volumes that lost a race (Events do not
    // count: a 409 there is a name collision, not a conflict).
    let conflicts = world
        .server
        .audit()
        .into_iter()
        .filter(|r| {
            r.code == 409
                && (r.resource == "persistentvolumeclaims" || r.resource == "persistentvolumes")
        })
        .inspect(|r| {
            eprintln!(
                "409: {} {} {:?} {:?} by {}",
                r.verb, r.resource, r.subresource, r.name, r.user_agent
            )
        })
        .count();
    eprintln!(
        "409s answered: {conflicts}; CreateVolume calls: {} + {}",
        first.attempts(CREATE_VOLUME),
        second.attempts(CREATE_VOLUME)
    );
    assert!(conflicts > 0, "the meddling caused no conflict at all");
}

async fn create_race_claims(
    o: &Objects,
    n: usize,
) -> Vec<k8s_openapi::api::core::v1::PersistentVolumeClaim> {
    let mut out = Vec::new();
    for i in 0..n {
        out.push(
            o.create_pvc(pvc(&format!("race-{i}"), Some("race"), "1Gi"))
                .await,
        );
    }
    out
}

/// 9. Secrets templating: the class's secret names are expanded per claim, the PV carries the
///    refs and the deletion secret, and the claim's volume is deleted with that secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secret_templates_are_expanded_into_the_pv() {
    let world = EbsWorld::start().await;
    let o = world.objects();
    o.create_ebs_node("node-a", "us-east-1a").await;
    o.create_class(class(
        "secret",
        DRIVER,
        "Immediate",
        "Delete",
        &[
            ("type", "gp3"),
            (
                "csi.storage.k8s.io/provisioner-secret-name",
                "${pvc.name}-secret",
            ),
            (
                "csi.storage.k8s.io/provisioner-secret-namespace",
                "${pvc.namespace}",
            ),
            (
                "csi.storage.k8s.io/node-stage-secret-name",
                "${pvc.annotations['team']}-stage",
            ),
            (
                "csi.storage.k8s.io/node-stage-secret-namespace",
                "${pvc.namespace}",
            ),
            (
                "csi.storage.k8s.io/controller-publish-secret-name",
                "${pv.name}-publish",
            ),
            (
                "csi.storage.k8s.io/controller-publish-secret-namespace",
                "kube-system",
            ),
        ],
    ))
    .await;
    Api::<Secret>::namespaced(world.kube.clone(), NS)
        .create(
            &PostParams::default(),
            &Secret {
                metadata: ObjectMeta {
                    name: Some("vault-secret".into()),
                    ..Default::default()
                },
                string_data: Some(strings(&[("token", "s3cr3t")])),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let _pvc_ctl = world.pv_controller("", false).await;
    let prov = world.provisioner().await;

    let mut with_team = pvc("vault", Some("secret"), "1Gi");
    with_team.metadata.annotations = Some(strings(&[("team", "blue")]));
    let claim = o.create_pvc(with_team).await;
    // Another claim whose provisioner secret does not exist: not provisioned, and told why.
    let mut without = pvc("nosecret", Some("secret"), "1Gi");
    without.metadata.annotations = Some(strings(&[("team", "red")]));
    o.create_pvc(without).await;

    let (_, pv) = o.wait_bound("vault").await;
    let name = pv_name(&claim);
    let ann = pv.metadata.annotations.clone().unwrap();
    assert_eq!(
        ann["volume.kubernetes.io/provisioner-deletion-secret-name"],
        "vault-secret"
    );
    assert_eq!(
        ann["volume.kubernetes.io/provisioner-deletion-secret-namespace"],
        NS
    );
    let csi = pv.spec.unwrap().csi.unwrap();
    let stage = csi.node_stage_secret_ref.unwrap();
    assert_eq!(
        (stage.name.as_deref(), stage.namespace.as_deref()),
        (Some("blue-stage"), Some(NS))
    );
    let publish = csi.controller_publish_secret_ref.unwrap();
    assert_eq!(publish.name, Some(format!("{name}-publish")));
    assert_eq!(publish.namespace.as_deref(), Some("kube-system"));
    assert!(csi.node_publish_secret_ref.is_none());
    let message = o.wait_event("nosecret", "ProvisioningFailed").await;
    assert!(message.contains("nosecret-secret"), "{message}");
    assert_eq!(world.volumes().len(), 1, "only the claim with its secret");

    // Deleted with the deletion secret the PV names.
    o.delete_pvc("vault").await;
    eventually("the volume and PV are gone", || async {
        (o.pv(&name).await.is_none() && world.volumes_named(&name).is_empty()).then_some(())
    })
    .await;
    assert!(prov.calls(DELETE_VOLUME, None) >= 1);
}
