//! Migration (the migration design, docs/design/migration.md): in-tree PVs and inline specs
//! translated before publishing, and the rollback case (an in-tree PV no longer annotated
//! `migrated-to` us loses our finalizer).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;

use common::*;
use csi_mock::{Method, MockConfig};
use csi_spec::v1::volume_capability::AccessType;
use k8s_openapi::api::core::v1::{
    AWSElasticBlockStoreVolumeSource, CSIPersistentVolumeSource, PersistentVolume,
    PersistentVolumeSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

const EBS: &str = "ebs.csi.aws.com";
const EBS_FINALIZER: &str = "external-attacher/ebs-csi-aws-com";
const EBS_NODE_ID: &str = "i-0123456789abcdef0";
const MIGRATED_TO: &str = "pv.kubernetes.io/migrated-to";

async fn ebs_env() -> Env {
    let env = Env::new(MockConfig {
        name: EBS.into(),
        ..MockConfig::default()
    })
    .await;
    env.create_csinode("node-ebs", &[(EBS, EBS_NODE_ID)]).await;
    env
}

fn in_tree_pv(name: &str, volume_id: &str, migrated_to: Option<&str>) -> PersistentVolume {
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(name.into()),
            annotations: migrated_to
                .map(|d| BTreeMap::from([(MIGRATED_TO.to_string(), d.to_string())])),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            capacity: Some(BTreeMap::from([(
                "storage".to_string(),
                Quantity("4Gi".into()),
            )])),
            aws_elastic_block_store: Some(AWSElasticBlockStoreVolumeSource {
                volume_id: volume_id.into(),
                fs_type: Some("xfs".into()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migrated_in_tree_ebs_pv_is_published_under_its_csi_handle() {
    let mut env = ebs_env().await;
    env.create_pv(&in_tree_pv(
        "pv-intree",
        "aws://us-east-1a/vol-0123456789abcdef0",
        Some(EBS),
    ))
    .await;
    env.create_va(&va_of("va-intree", EBS, "pv-intree", "node-ebs"))
        .await;
    env.start(fast_options()).await;
    let va = env.wait_attached("va-intree").await;
    assert_eq!(finalizers_of(&va), [EBS_FINALIZER]);
    let pv = env.get_pv("pv-intree").await.unwrap();
    assert_eq!(finalizers_of(&pv), [EBS_FINALIZER]);
    assert!(
        pv.spec.unwrap().aws_elastic_block_store.is_some(),
        "the stored PV stays in-tree; only what the driver sees is translated"
    );

    let calls = env.mock().calls_of(Method::ControllerPublishVolume);
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].volume_id, "vol-0123456789abcdef0");
    assert_eq!(calls[0].node_id, EBS_NODE_ID);
    let Some(AccessType::Mount(m)) = calls[0].capability.clone().unwrap().access_type else {
        panic!("mount capability expected");
    };
    assert_eq!(m.fs_type, "xfs");

    env.delete_va("va-intree").await;
    env.wait_va_gone("va-intree").await;
    let unpublish = env.mock().calls_of(Method::ControllerUnpublishVolume);
    assert_eq!(unpublish.len(), 1);
    assert_eq!(unpublish[0].volume_id, "vol-0123456789abcdef0");

    env.stop().await;
    let observed = env.observed.lock().unwrap().clone();
    let publish = observed
        .iter()
        .find(|(m, ..)| m == "/csi.v1.Controller/ControllerPublishVolume")
        .expect("publish observed");
    assert!(publish.2, "operation metrics say migrated=\"true\"");
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inline_volume_spec_is_published_without_any_pv_write() {
    let mut env = ebs_env().await;
    let mut va = va_of("va-inline", EBS, "unused", "node-ebs");
    va.spec.source.persistent_volume_name = None;
    va.spec.source.inline_volume_spec = Some(PersistentVolumeSpec {
        access_modes: Some(vec!["ReadWriteOnce".into()]),
        csi: Some(CSIPersistentVolumeSource {
            driver: EBS.into(),
            volume_handle: "vol-0aaaaaaaaaaaaaaaa".into(),
            fs_type: Some("ext4".into()),
            ..Default::default()
        }),
        ..Default::default()
    });
    env.create_va(&va).await;
    env.start(fast_options()).await;
    let va = env.wait_attached("va-inline").await;
    assert_eq!(finalizers_of(&va), [EBS_FINALIZER]);
    let calls = env.mock().calls_of(Method::ControllerPublishVolume);
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].volume_id, "vol-0aaaaaaaaaaaaaaaa");

    env.delete_va("va-inline").await;
    env.wait_va_gone("va-inline").await;
    env.stop().await;
    let writes: Vec<String> = env.controller_writes().iter().map(describe).collect();
    assert_eq!(
        writes,
        [
            "patch volumeattachments/va-inline",
            "patch volumeattachments/va-inline/status",
            "patch volumeattachments/va-inline",
        ]
    );
    let observed = env.observed.lock().unwrap().clone();
    assert!(
        observed.iter().all(|(_, _, migrated)| *migrated),
        "{observed:?}"
    );
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_in_tree_pv_loses_our_finalizer_unless_still_attached() {
    let mut env = ebs_env().await;
    // Rolled back: no migrated-to annotation, our finalizer left from the migrated time.
    let mut free = in_tree_pv("pv-rolled-back", "vol-0bbbbbbbbbbbbbbbb", None);
    free.metadata.finalizers = Some(vec![EBS_FINALIZER.into()]);
    env.create_pv(&free).await;
    // Annotated for another driver: also not ours any more.
    let mut other = in_tree_pv(
        "pv-other-driver",
        "vol-0cccccccccccccccc",
        Some("other.csi.io"),
    );
    other.metadata.finalizers = Some(vec![EBS_FINALIZER.into()]);
    env.create_pv(&other).await;
    // Still migrated to us: keeps it.
    let mut migrated = in_tree_pv("pv-migrated", "vol-0dddddddddddddddd", Some(EBS));
    migrated.metadata.finalizers = Some(vec![EBS_FINALIZER.into()]);
    env.create_pv(&migrated).await;
    // Rolled back but a VolumeAttachment still uses it: keeps it.
    let mut used = in_tree_pv("pv-used", "vol-0eeeeeeeeeeeeeeee", None);
    used.metadata.finalizers = Some(vec![EBS_FINALIZER.into()]);
    env.create_pv(&used).await;
    env.create_va(&va_of("va-used", "other.csi.io", "pv-used", "node-ebs"))
        .await;

    env.start(fast_options()).await;
    let pvs = env.pvs();
    for name in ["pv-rolled-back", "pv-other-driver"] {
        let pv = eventually(&format!("finalizer removed from {name}"), || async {
            let pv = pvs.get_opt(name).await.ok().flatten()?;
            finalizers_of(&pv).is_empty().then_some(pv)
        })
        .await;
        assert!(
            pv.metadata.deletion_timestamp.is_none(),
            "not deleted, only released"
        );
    }
    env.stop().await;
    assert_eq!(
        finalizers_of(&env.get_pv("pv-migrated").await.unwrap()),
        [EBS_FINALIZER]
    );
    assert_eq!(
        finalizers_of(&env.get_pv("pv-used").await.unwrap()),
        [EBS_FINALIZER]
    );
    env.shutdown().await;
}
