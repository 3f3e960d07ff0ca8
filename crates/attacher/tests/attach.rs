//! Attach: the happy path and exactly the writes it takes, already attached, and what the
//! driver receives (capability, readonly, secrets, volume context).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;

use common::*;
use csi_mock::{Method, MockConfig};
use csi_spec::v1::volume_capability::AccessType;
use csi_spec::v1::volume_capability::access_mode::Mode;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Secret, SecretReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::PostParams;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_saves_metadata_and_sets_both_finalizers_with_three_writes() {
    let mut env = Env::new(MockConfig::default()).await;
    env.start(fast_options()).await;
    env.create_pair("a").await;

    let va = env.wait_attached("va-a").await;
    let status = va.status.clone().expect("status");
    assert_eq!(
        status.attachment_metadata,
        Some(BTreeMap::from([(
            "devicePath".to_string(),
            "/dev/mock/vol-a".to_string()
        )]))
    );
    assert!(status.attach_error.is_none());
    assert_eq!(finalizers_of(&va), [FINALIZER]);
    assert_eq!(
        va.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(NODE_ID_ANNOTATION))
            .map(String::as_str),
        Some(NODE_ID)
    );
    let pv = env.get_pv("pv-a").await.expect("pv");
    assert_eq!(finalizers_of(&pv), [FINALIZER]);

    let calls = env.mock().calls_of(Method::ControllerPublishVolume);
    assert_eq!(calls.len(), 1, "{calls:?}");
    let call = &calls[0];
    assert_eq!(call.volume_id, "vol-a");
    assert_eq!(call.node_id, NODE_ID);
    assert!(!call.readonly);
    let cap = call.capability.clone().expect("capability");
    assert_eq!(cap.mode(), Some(Mode::SingleNodeWriter));
    assert!(matches!(cap.access_type, Some(AccessType::Mount(_))));
    assert_eq!(
        env.mock().published().get("vol-a").map(|n| n.len()),
        Some(1)
    );

    // Stop (keys in progress finish), then count: nothing more may have been written.
    env.stop().await;
    let writes: Vec<String> = env.controller_writes().iter().map(describe).collect();
    assert_eq!(
        writes,
        [
            "patch persistentvolumes/pv-a",
            "patch volumeattachments/va-a",
            "patch volumeattachments/va-a/status",
        ]
    );
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attached_volume_attachment_is_left_alone() {
    let mut env = Env::new(MockConfig::default()).await;
    env.create_pair("done").await;
    env.set_attached("va-done", true).await;
    env.create_pair("new").await;

    env.start(fast_options()).await;
    env.wait_attached("va-new").await;
    env.stop().await;

    let published: Vec<String> = env
        .mock()
        .calls_of(Method::ControllerPublishVolume)
        .into_iter()
        .map(|c| c.volume_id)
        .collect();
    assert_eq!(
        published,
        ["vol-new"],
        "the attached one is not published again"
    );
    let touched_done = env
        .controller_writes()
        .iter()
        .any(|r| r.name.as_deref().is_some_and(|n| n.ends_with("-done")));
    assert!(!touched_done, "no write for the attached VolumeAttachment");
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volume_attachments_of_other_attachers_are_ignored() {
    let mut env = Env::new(MockConfig::default()).await;
    env.start(fast_options()).await;
    env.create_pv(&csi_pv("pv-other", "vol-other")).await;
    env.create_va(&va_of("va-other", "other.csi.io", "pv-other", NODE))
        .await;
    env.create_pair("mine").await;
    env.wait_attached("va-mine").await;
    env.stop().await;
    let other = env.get_va("va-other").await.expect("other");
    assert!(other.status.as_ref().is_none_or(|s| !s.attached));
    assert!(finalizers_of(&other).is_empty());
    assert_eq!(
        env.mock().calls_of(Method::ControllerPublishVolume).len(),
        1
    );
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_driver_gets_block_readonly_secrets_and_volume_context() {
    let mut env = Env::new(MockConfig::default()).await;
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("publish-secret".into()),
            namespace: Some("default".into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            "token".to_string(),
            ByteString(b"s3cr3t".to_vec()),
        )])),
        ..Default::default()
    };
    Api::<Secret>::namespaced(env.kube.clone(), "default")
        .create(&PostParams::default(), &secret)
        .await
        .expect("secret");

    let mut block = csi_pv("pv-block", "vol-block");
    if let Some(spec) = block.spec.as_mut() {
        spec.volume_mode = Some("Block".into());
        spec.access_modes = Some(vec!["ReadWriteMany".into()]);
        if let Some(csi) = spec.csi.as_mut() {
            csi.read_only = Some(true);
            csi.volume_attributes =
                Some(BTreeMap::from([("tier".to_string(), "gold".to_string())]));
            csi.controller_publish_secret_ref = Some(SecretReference {
                name: Some("publish-secret".into()),
                namespace: Some("default".into()),
            });
        }
    }
    env.create_pv(&block).await;
    env.create_va(&va_for_pv("va-block", "pv-block", NODE))
        .await;

    let mut mount = csi_pv("pv-mount", "vol-mount");
    if let Some(spec) = mount.spec.as_mut() {
        spec.mount_options = Some(vec!["noatime".into()]);
        spec.access_modes = Some(vec!["ReadOnlyMany".into()]);
    }
    env.create_pv(&mount).await;
    env.create_va(&va_for_pv("va-mount", "pv-mount", NODE))
        .await;

    let mut options = fast_options();
    options.default_fstype = "ext4".into();
    env.start(options).await;
    env.wait_attached("va-block").await;
    env.wait_attached("va-mount").await;
    env.stop().await;

    let calls = env.mock().calls_of(Method::ControllerPublishVolume);
    let block_call = calls
        .iter()
        .find(|c| c.volume_id == "vol-block")
        .expect("block");
    let cap = block_call.capability.clone().expect("cap");
    assert!(cap.is_block());
    assert_eq!(cap.mode(), Some(Mode::MultiNodeMultiWriter));
    assert!(block_call.readonly, "PUBLISH_READONLY: readonly passed on");
    assert_eq!(
        block_call.secrets,
        BTreeMap::from([("token".to_string(), "s3cr3t".to_string())])
    );
    assert_eq!(
        block_call.volume_context,
        BTreeMap::from([("tier".to_string(), "gold".to_string())])
    );

    let mount_call = calls
        .iter()
        .find(|c| c.volume_id == "vol-mount")
        .expect("mount");
    let cap = mount_call.capability.clone().expect("cap");
    assert_eq!(cap.mode(), Some(Mode::MultiNodeReaderOnly));
    let Some(AccessType::Mount(m)) = cap.access_type else {
        panic!("mount capability expected: {cap:?}");
    };
    assert_eq!(m.fs_type, "ext4", "--default-fstype fills in");
    assert_eq!(m.mount_flags, ["noatime"]);
    assert!(mount_call.secrets.is_empty());
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readonly_is_not_passed_to_a_driver_without_publish_readonly() {
    let mut env = Env::new(MockConfig {
        publish_readonly: false,
        ..MockConfig::default()
    })
    .await;
    let mut pv = csi_pv("pv-ro", "vol-ro");
    if let Some(csi) = pv.spec.as_mut().and_then(|s| s.csi.as_mut()) {
        csi.read_only = Some(true);
    }
    env.create_pv(&pv).await;
    env.create_va(&va_for_pv("va-ro", "pv-ro", NODE)).await;
    env.start(fast_options()).await;
    env.wait_attached("va-ro").await;
    env.stop().await;
    let calls = env.mock().calls_of(Method::ControllerPublishVolume);
    assert_eq!(calls.len(), 1);
    assert!(!calls[0].readonly);
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_attaches_with_two_va_writes_and_one_pv_write_each() {
    let mut env = Env::new(MockConfig::default()).await;
    for i in 0..20 {
        env.create_pair(&format!("b{i}")).await;
    }
    env.start(fast_options()).await;
    for i in 0..20 {
        env.wait_attached(&format!("va-b{i}")).await;
    }
    env.stop().await;
    let writes = env.controller_writes();
    let va_writes = writes
        .iter()
        .filter(|r| r.resource == "volumeattachments")
        .count();
    let pv_writes = writes
        .iter()
        .filter(|r| r.resource == "persistentvolumes")
        .count();
    assert_eq!(
        (va_writes, pv_writes),
        (40, 20),
        "{:?}",
        writes.iter().map(describe).collect::<Vec<_>>()
    );
    assert_eq!(
        env.mock().calls_of(Method::ControllerPublishVolume).len(),
        20
    );
    env.shutdown().await;
}
