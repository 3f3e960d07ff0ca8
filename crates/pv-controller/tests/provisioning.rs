//! Dynamic provisioning as the persistentvolume controller sees it: annotations for the
//! external provisioner, WaitForFirstConsumer, migrated and unmigrated in-tree classes (the
//! migration design, docs/design/migration.md). The test plays the external provisioner (and the
//! scheduler) itself.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Env, NS, PATIENCE, annotation, fast_options, pv_json, pvc_json};
use kube::api::{Patch, PatchParams};
use serde_json::json;
use test_support::objects::create_json;
use volume_plugins::MigratedPlugins;

const RWO: &[&str] = &["ReadWriteOnce"];
const PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
const BETA_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";
const MIGRATED_TO: &str = "pv.kubernetes.io/migrated-to";

/// What an external provisioner creates for a claim: a PV pre-bound to it with its uid.
async fn provision_as_external(env: &Env, claim: &str, pv: &str, class: &str) {
    let pvc = env.pvc(claim).await.unwrap();
    let mut v = pv_json(pv, "1Gi", RWO, class);
    v["spec"]["claimRef"] = json!({
        "kind": "PersistentVolumeClaim", "apiVersion": "v1",
        "namespace": NS, "name": claim, "uid": pvc.metadata.uid,
    });
    v["spec"]["persistentVolumeReclaimPolicy"] = json!("Delete");
    v["metadata"]["annotations"] =
        json!({"pv.kubernetes.io/provisioned-by": "hostpath.csi.k8s.io"});
    env.create_pv_json(v).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn immediate_class_waits_for_the_external_provisioner() {
    let mut env = Env::new().await;
    env.create_class("fast", "hostpath.csi.k8s.io", "Immediate", json!({}))
        .await;
    env.start(fast_options()).await;
    env.create_pvc("data", "1Gi", RWO, Some("fast")).await;
    assert_eq!(
        env.wait_pvc_annotation("data", PROVISIONER).await,
        "hostpath.csi.k8s.io"
    );
    assert_eq!(
        env.wait_pvc_annotation("data", BETA_PROVISIONER).await,
        "hostpath.csi.k8s.io"
    );
    let msg = env.wait_event(NS, "data", "ExternalProvisioning").await;
    assert!(msg.contains("'hostpath.csi.k8s.io'"), "{msg}");
    let pvc = env.wait_pvc_phase("data", "Pending").await;
    assert_eq!(annotation(&pvc, MIGRATED_TO), None);

    provision_as_external(&env, "data", "pvc-data", "fast").await;
    let pvc = env.wait_pvc_phase("data", "Bound").await;
    assert_eq!(pvc.spec.unwrap().volume_name.as_deref(), Some("pvc-data"));
    env.wait_pv_phase("pvc-data", "Bound").await;

    // A class that does not exist: ProvisioningFailed naming it.
    env.create_pvc("lost-class", "1Gi", RWO, Some("nope")).await;
    let msg = env.wait_event(NS, "lost-class", "ProvisioningFailed").await;
    assert!(msg.contains("\"nope\" not found"), "{msg}");
    // Created later, the class is used.
    env.create_class("nope", "hostpath.csi.k8s.io", "Immediate", json!({}))
        .await;
    env.wait_pvc_annotation("lost-class", PROVISIONER).await;
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_first_consumer_waits_for_the_selected_node() {
    let mut env = Env::new().await;
    env.create_class(
        "late",
        "hostpath.csi.k8s.io",
        "WaitForFirstConsumer",
        json!({}),
    )
    .await;
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(env.kube.clone());
    for (node, zone) in [("node-a", "a"), ("node-b", "b")] {
        create_json(
            nodes.clone(),
            json!({"metadata": {"name": node, "labels": {"topology.kubernetes.io/zone": zone}}}),
        )
        .await;
    }
    // A volume only zone b can reach.
    let mut zone_b = pv_json("zone-b", "1Gi", RWO, "late");
    zone_b["spec"]["nodeAffinity"] = json!({"required": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["b"]}]}
    ]}});
    env.create_pv_json(zone_b).await;
    env.start(fast_options()).await;

    env.create_pvc("in-a", "1Gi", RWO, Some("late")).await;
    env.create_pvc("in-b", "1Gi", RWO, Some("late")).await;
    let msg = env.wait_event(NS, "in-a", "WaitForFirstConsumer").await;
    assert_eq!(
        msg,
        "waiting for first consumer to be created before binding"
    );
    env.wait_event(NS, "in-b", "WaitForFirstConsumer").await;
    // Without a selected node nothing is bound (the zone-b volume would fit) or annotated.
    let pvc = env.wait_pvc_phase("in-a", "Pending").await;
    assert_eq!(annotation(&pvc, PROVISIONER), None);
    assert_eq!(env.pv_phase("zone-b").await.as_deref(), Some("Available"));

    // The scheduler picks nodes: in-a lands in zone a (the volume cannot go there: provision),
    // in-b in zone b (the volume fits).
    for (claim, node) in [("in-a", "node-a"), ("in-b", "node-b")] {
        env.pvcs()
            .patch(
                claim,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {"volume.kubernetes.io/selected-node": node}}})),
            )
            .await
            .unwrap();
    }
    let pvc = env.wait_pvc_phase("in-b", "Bound").await;
    assert_eq!(pvc.spec.unwrap().volume_name.as_deref(), Some("zone-b"));
    assert_eq!(
        env.wait_pvc_annotation("in-a", PROVISIONER).await,
        "hostpath.csi.k8s.io"
    );
    env.wait_event(NS, "in-a", "ExternalProvisioning").await;
    assert_eq!(env.pvc_phase("in-a").await.as_deref(), Some("Pending"));
    env.shutdown().await;
}

/// A WaitForFirstConsumer claim is bound to the volume its provisioner made for it at once,
/// whatever the selected node's labels: kcm's PV controller never checks a pre-bound volume
/// against the node (placement is the scheduler's). Ours did, so on kube-apiserver a claim
/// whose node did not (yet) carry the volume's topology label stayed Pending beside its
/// volume until the label came and then until the next resync (nodes are not watched).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provisioned_volume_is_bound_whatever_the_selected_node_s_labels() {
    let mut env = Env::new().await;
    env.create_class(
        "late",
        "hostpath.csi.k8s.io",
        "WaitForFirstConsumer",
        json!({}),
    )
    .await;
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(env.kube.clone());
    create_json(nodes, json!({"metadata": {"name": "node-1"}})).await;
    env.start(fast_options()).await;
    env.create_pvc("data", "1Gi", RWO, Some("late")).await;
    env.pvcs()
        .patch(
            "data",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"volume.kubernetes.io/selected-node": "node-1"}}})),
        )
        .await
        .unwrap();
    env.wait_pvc_annotation("data", PROVISIONER).await;
    // The provisioner's volume, with the affinity the driver reported for node-1 (a label
    // node-1 does not have), and the phase kube-apiserver gives a new PV.
    let pvc = env.pvc("data").await.unwrap();
    let mut v = pv_json("pvc-data", "1Gi", RWO, "late");
    v["spec"]["claimRef"] = json!({
        "kind": "PersistentVolumeClaim", "apiVersion": "v1",
        "namespace": NS, "name": "data", "uid": pvc.metadata.uid,
    });
    v["spec"]["nodeAffinity"] = json!({"required": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "topology.hostpath.csi/node", "operator": "In", "values": ["node-1"]}]}
    ]}});
    v["metadata"]["annotations"] =
        json!({"pv.kubernetes.io/provisioned-by": "hostpath.csi.k8s.io"});
    v["status"] = json!({"phase": "Pending"});
    env.create_pv_json(v).await;
    let pvc = env.wait_pvc_phase("data", "Bound").await;
    assert_eq!(pvc.spec.unwrap().volume_name.as_deref(), Some("pvc-data"));
    env.wait_pv_phase("pvc-data", "Bound").await;
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_tree_aws_ebs_class_migrated_and_not() {
    let mut env = Env::new().await;
    let params = json!({"type": "gp3", "encrypted": "true"});
    env.create_class("ebs", "kubernetes.io/aws-ebs", "Immediate", params)
        .await;
    let mut options = fast_options();
    options.migrated = MigratedPlugins::from_feature_gates("CSIMigrationAWS=true").unwrap();
    env.start(options).await;

    // Migrated: the CSI driver provisions; the claim says so twice, and (as kcm v1.26 writes
    // it) carries no migrated-to: the storage-provisioner already names the driver.
    env.create_pvc("migrated", "1Gi", RWO, Some("ebs")).await;
    assert_eq!(
        env.wait_pvc_annotation("migrated", PROVISIONER).await,
        "ebs.csi.aws.com"
    );
    assert_eq!(
        env.wait_pvc_annotation("migrated", BETA_PROVISIONER).await,
        "ebs.csi.aws.com"
    );
    let msg = env.wait_event(NS, "migrated", "ExternalProvisioning").await;
    assert!(msg.contains("'ebs.csi.aws.com'"), "{msg}");
    assert_eq!(
        annotation(&env.pvc("migrated").await.unwrap(), MIGRATED_TO),
        None
    );

    // A claim annotated for the in-tree plugin before the upgrade (here one that asks for no
    // class, so nothing re-annotates it) is the one kcm marks migrated-to.
    let mut upgraded = pvc_json("upgraded", "1Gi", RWO, Some(""));
    upgraded["metadata"]["annotations"] = json!({
        PROVISIONER: "kubernetes.io/aws-ebs", BETA_PROVISIONER: "kubernetes.io/aws-ebs",
    });
    env.create_pvc_json(upgraded).await;
    assert_eq!(
        env.wait_pvc_annotation("upgraded", MIGRATED_TO).await,
        "ebs.csi.aws.com"
    );

    // An in-tree PV made by kubernetes.io/aws-ebs is marked migrated as well.
    let mut pv = pv_json("in-tree", "1Gi", RWO, "legacy");
    pv["spec"].as_object_mut().unwrap().remove("hostPath");
    pv["spec"]["awsElasticBlockStore"] =
        json!({"volumeID": "aws://us-east-1a/vol-0123456789abcdef0", "fsType": "ext4"});
    pv["metadata"]["annotations"] =
        json!({"pv.kubernetes.io/provisioned-by": "kubernetes.io/aws-ebs"});
    env.create_pv_json(pv).await;
    test_support::eventually("PV in-tree migrated-to", PATIENCE, || async {
        (annotation(&env.pv("in-tree").await?, MIGRATED_TO)? == "ebs.csi.aws.com").then_some(())
    })
    .await;

    // Downgrade: migration off, no cloud. The claim loses migrated-to and is the in-tree
    // plugin's again; without --cloud-provider=aws that fails with an Event saying why. The PV
    // loses its mark too.
    env.stop().await;
    env.start(fast_options()).await;
    test_support::eventually("claim back to the in-tree plugin", PATIENCE, || async {
        let pvc = env.pvc("migrated").await?;
        (annotation(&pvc, PROVISIONER)? == "kubernetes.io/aws-ebs"
            && annotation(&pvc, BETA_PROVISIONER)? == "kubernetes.io/aws-ebs"
            && annotation(&pvc, MIGRATED_TO).is_none())
        .then_some(())
    })
    .await;
    let msg = env.wait_event(NS, "migrated", "ProvisioningFailed").await;
    assert!(msg.contains("--cloud-provider=aws"), "{msg}");
    test_support::eventually("PV in-tree loses migrated-to", PATIENCE, || async {
        annotation(&env.pv("in-tree").await?, MIGRATED_TO)
            .is_none()
            .then_some(())
    })
    .await;
    assert_eq!(env.pvc_phase("migrated").await.as_deref(), Some("Pending"));
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_class_and_no_volume_is_failed_binding() {
    let mut env = Env::new().await;
    env.start(fast_options()).await;
    env.create_pvc_json(pvc_json("plain", "1Gi", RWO, Some("")))
        .await;
    let msg = env.wait_event(NS, "plain", "FailedBinding").await;
    assert_eq!(
        msg,
        "no persistent volumes available for this claim and no storage class is set"
    );
    env.create_pv("arrives", "1Gi", RWO, "").await;
    env.wait_pvc_phase("plain", "Bound").await;
    env.shutdown().await;
}

/// kcm's retroactive default StorageClass: a claim created without a class while no class was
/// the default gets the default class once one is marked, and is then provisioned through it;
/// a claim that asked for no class (`""`) keeps asking for none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_without_a_class_gets_the_default_class_once_there_is_one() {
    let mut env = Env::new().await;
    env.start(fast_options()).await;
    env.create_pvc("later", "1Gi", RWO, None).await;
    env.create_pvc("none", "1Gi", RWO, Some("")).await;
    env.wait_event(NS, "later", "FailedBinding").await;
    assert_eq!(
        env.pvc("later")
            .await
            .unwrap()
            .spec
            .unwrap()
            .storage_class_name,
        None,
        "no default class yet: nothing to assign"
    );

    let classes: kube::Api<k8s_openapi::api::storage::v1::StorageClass> =
        kube::Api::all(env.kube.clone());
    create_json(
        classes,
        json!({
            "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": "standard",
                         "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
            "provisioner": "hostpath.csi.k8s.io",
            "volumeBindingMode": "Immediate",
        }),
    )
    .await;
    // The class arrives through the claim's next sync (a change of the claim or the resync).
    env.pvcs()
        .patch(
            "later",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"poke": "1"}}})),
        )
        .await
        .unwrap();
    assert_eq!(
        env.wait_pvc_annotation("later", PROVISIONER).await,
        "hostpath.csi.k8s.io"
    );
    let later = env.pvc("later").await.unwrap();
    assert_eq!(
        later.spec.unwrap().storage_class_name.as_deref(),
        Some("standard")
    );
    let none = env.pvc("none").await.unwrap();
    assert_eq!(
        none.spec.as_ref().unwrap().storage_class_name.as_deref(),
        Some("")
    );
    assert_eq!(annotation(&none, PROVISIONER), None);
    env.shutdown().await;
}

/// A claim of a native CSI class whose driver is also a migration target (`ebs.csi.aws.com`
/// with CSIMigrationAWS on) carries the same storage-provisioner as a migrated in-tree claim;
/// neither gets `migrated-to` (kcm v1.26 writes none on either), and the controller leaves
/// the native one alone while it waits (it used to add and remove the annotation on every
/// sync, ~10 writes per claim).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_native_csi_claim_of_a_migration_target_driver_is_not_marked_migrated() {
    let mut env = Env::new().await;
    env.create_class("ebs-sc", "ebs.csi.aws.com", "Immediate", json!({}))
        .await;
    env.create_class("gp2", "kubernetes.io/aws-ebs", "Immediate", json!({}))
        .await;
    let mut options = fast_options();
    options.migrated = MigratedPlugins::from_feature_gates("CSIMigrationAWS=true").unwrap();
    env.start(options).await;
    env.create_pvc("native", "1Gi", RWO, Some("ebs-sc")).await;
    env.create_pvc("migrated", "1Gi", RWO, Some("gp2")).await;
    assert_eq!(
        env.wait_pvc_annotation("native", PROVISIONER).await,
        "ebs.csi.aws.com"
    );
    assert_eq!(
        env.wait_pvc_annotation("migrated", PROVISIONER).await,
        "ebs.csi.aws.com"
    );
    env.wait_event(NS, "migrated", "ExternalProvisioning").await;
    env.wait_event(NS, "native", "ExternalProvisioning").await;
    assert_eq!(
        annotation(&env.pvc("migrated").await.unwrap(), MIGRATED_TO),
        None
    );
    let settled = env.pvc("native").await.unwrap();
    assert_eq!(annotation(&settled, MIGRATED_TO), None);
    // Nothing more to write while it waits for the external provisioner: its resync and the
    // other claim's writes must not touch it.
    for i in 0..5 {
        env.pvcs()
            .patch(
                "migrated",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"poke": i.to_string()}}})),
            )
            .await
            .unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let later = env.pvc("native").await.unwrap();
    assert_eq!(
        later.metadata.resource_version, settled.metadata.resource_version,
        "the native claim was written again: {:?}",
        later.metadata.annotations
    );
    env.shutdown().await;
}
