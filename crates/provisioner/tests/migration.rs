//! A StorageClass of the in-tree `kubernetes.io/aws-ebs` provisioner, with the CSI mock
//! registered as `ebs.csi.aws.com`: a claim kube-controller-manager v1.26 annotated
//! `storage-provisioner: ebs.csi.aws.com` (and no `migrated-to`) is provisioned with
//! translated parameters, stored as an in-tree `awsElasticBlockStore` PV, and deleted through
//! the driver once released; a claim annotated for the in-tree plugin is left to it until
//! `pv.kubernetes.io/migrated-to` names the driver.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;

use common::*;
use csi_mock::{Method, MockConfig};
use provisioner::{
    BETA_STORAGE_PROVISIONER_ANNOTATION, DELETION_SECRET_NAME_ANNOTATION,
    DELETION_SECRET_NAMESPACE_ANNOTATION,
};

const EBS: &str = "ebs.csi.aws.com";
const IN_TREE: &str = "kubernetes.io/aws-ebs";
const EBS_ZONE_KEY: &str = "topology.ebs.csi.aws.com/zone";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_tree_class_is_provisioned_as_kcm_annotates_it_and_stored_in_tree() {
    let mut env = Env::with_mock(MockConfig {
        volume_id_prefix: "vol-".into(),
        ..provisioning_mock(EBS)
    })
    .await;
    env.create_node(
        "node-a",
        EBS,
        &[(EBS_ZONE_KEY, "us-east-1a")],
        &[EBS_ZONE_KEY],
    )
    .await;
    let mut sc = class(
        "gp2",
        IN_TREE,
        &[
            ("type", "io1"),
            ("iopsPerGB", "10"),
            ("encrypted", "true"),
            ("zones", "us-east-1a"),
            ("fsType", "ext4"),
        ],
    );
    sc.reclaim_policy = Some("Delete".into());
    env.create_class(sc).await;
    env.create_class(class("csi", EBS, &[])).await;
    env.start(fast_options()).await;

    // Annotated for the in-tree plugin (migration off in the PV controller): not ours.
    let in_tree = env
        .create_pvc(pvc("in-tree", "gp2", "4Gi", Some(IN_TREE)))
        .await;
    // What kube-controller-manager v1.26 writes for a migrated class: the driver's name in
    // storage-provisioner (GA and beta), and no migrated-to.
    let kcm = env.create_pvc(pvc("kcm", "gp2", "4Gi", Some(EBS))).await;
    env.annotate_pvc("kcm", BETA_STORAGE_PROVISIONER_ANNOTATION, EBS)
        .await;
    let csi = env.create_pvc(pvc("csi", "csi", "1Gi", Some(EBS))).await;
    env.wait_pv(&pv_name(&csi)).await;
    let name = pv_name(&kcm);
    let pv = env.wait_pv(&name).await;
    let mut names: Vec<String> = env
        .mock()
        .calls_of(Method::CreateVolume)
        .into_iter()
        .map(|c| c.volume_id)
        .collect();
    names.sort();
    let mut expected_names = vec![pv_name(&csi), name.clone()];
    expected_names.sort();
    assert_eq!(
        names, expected_names,
        "the CSI class's claim and kcm's migrated claim were provisioned, not the in-tree one"
    );
    assert!(env.pv(&pv_name(&in_tree)).await.is_none());
    assert!(
        kcm.metadata
            .annotations
            .as_ref()
            .is_none_or(|a| !a.contains_key(MIGRATED_TO_ANNOTATION))
    );

    let call = env
        .mock()
        .calls_of(Method::CreateVolume)
        .into_iter()
        .find(|c| c.volume_id == name)
        .unwrap();
    let req = call.create_request.unwrap();
    let expected: HashMap<String, String> = [
        ("type", "io1"),
        ("iopsPerGB", "10"),
        ("allowautoiopspergbincrease", "true"),
        ("encrypted", "true"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(req.parameters, expected);
    match &req.volume_capabilities[0].access_type {
        Some(csi_spec::v1::volume_capability::AccessType::Mount(m)) => {
            assert_eq!(m.fs_type, "ext4")
        }
        other => panic!("{other:?}"),
    }
    let topo = req.accessibility_requirements.unwrap();
    assert_eq!(topo.requisite.len(), 1);
    assert_eq!(topo.requisite[0].segments[EBS_ZONE_KEY], "us-east-1a");

    // Stored as the in-tree PV, with the annotations the Go sidecar writes before translating.
    let annotations = pv.metadata.annotations.clone().unwrap();
    assert_eq!(annotations[PROVISIONED_BY_ANNOTATION], IN_TREE);
    assert_eq!(annotations[MIGRATED_TO_ANNOTATION], EBS);
    assert_eq!(annotations[DELETION_SECRET_NAME_ANNOTATION], "");
    assert_eq!(annotations[DELETION_SECRET_NAMESPACE_ANNOTATION], "");
    let spec = pv.spec.clone().unwrap();
    assert!(spec.csi.is_none());
    let ebs = spec.aws_elastic_block_store.clone().unwrap();
    assert_eq!(ebs.volume_id, format!("vol-{name}"));
    assert_eq!(ebs.fs_type.as_deref(), Some("ext4"));
    assert_eq!(spec.capacity.clone().unwrap()["storage"].0, "4Gi");
    assert_eq!(
        spec.persistent_volume_reclaim_policy.as_deref(),
        Some("Delete")
    );
    assert_eq!(spec.storage_class_name.as_deref(), Some("gp2"));
    assert_eq!(spec.claim_ref.clone().unwrap().uid, kcm.metadata.uid);
    let terms = spec
        .node_affinity
        .clone()
        .unwrap()
        .required
        .unwrap()
        .node_selector_terms;
    let keys: Vec<(String, Vec<String>)> = terms[0]
        .match_expressions
        .clone()
        .unwrap()
        .into_iter()
        .map(|e| (e.key, e.values.unwrap_or_default()))
        .collect();
    assert!(
        keys.contains(&(
            "topology.kubernetes.io/zone".to_string(),
            vec!["us-east-1a".to_string()]
        )),
        "node affinity on the in-tree zone label: {keys:?}"
    );
    assert!(
        keys.contains(&(
            "topology.kubernetes.io/region".to_string(),
            vec!["us-east-1".to_string()]
        )),
        "node affinity on the in-tree region label: {keys:?}"
    );
    let labels = pv.metadata.labels.clone().unwrap();
    assert_eq!(labels["topology.kubernetes.io/zone"], "us-east-1a");
    assert_eq!(labels["topology.kubernetes.io/region"], "us-east-1");
    assert!(
        pv.metadata
            .finalizers
            .clone()
            .unwrap()
            .contains(&PV_FINALIZER.to_string())
    );

    // Released: the in-tree PV is translated back and deleted through the driver.
    env.set_pv_phase(&name, "Released").await;
    eventually("the in-tree PV deleted", || async {
        env.pv(&name).await.is_none().then_some(())
    })
    .await;
    let deletes = env.mock().calls_of(Method::DeleteVolume);
    assert_eq!(deletes.len(), 1, "{deletes:?}");
    assert_eq!(deletes[0].volume_id, format!("vol-{name}"));
    assert!(!env.mock().created_volumes().contains_key(&name));

    // A claim annotated for the in-tree plugin before migration: ours once the PV controller
    // marks it migrated-to our driver.
    env.annotate_pvc("in-tree", MIGRATED_TO_ANNOTATION, EBS)
        .await;
    let pv = env.wait_pv(&pv_name(&in_tree)).await;
    let annotations = pv.metadata.annotations.clone().unwrap();
    assert_eq!(annotations[PROVISIONED_BY_ANNOTATION], IN_TREE);
    assert_eq!(annotations[MIGRATED_TO_ANNOTATION], EBS);
    assert!(pv.spec.unwrap().aws_elastic_block_store.is_some());
    env.stop().await;
}
