//! The behaviour matrix for VolumeAttachments with `source.inlineVolumeSpec` (a CSI volume in a
//! pod spec, or an in-tree one the attach/detach controller translated), where the other test
//! files use `source.persistentVolumeName`: already attached, CSI error then success, timeout,
//! missing CSINode, detach success and failure. Inline sources have no PV, so no PV write and no
//! PV finalizer ever.

#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use std::time::Duration;

use common::*;
use csi_mock::{Method, MockConfig, Step};
use k8s_openapi::api::core::v1::{CSIPersistentVolumeSource, PersistentVolumeSpec};
use k8s_openapi::api::storage::v1::VolumeAttachment;

fn inline_va(name: &str, handle: &str, node: &str) -> VolumeAttachment {
    let mut va = va_of(name, DRIVER, "unused", node);
    va.spec.source.persistent_volume_name = None;
    va.spec.source.inline_volume_spec = Some(PersistentVolumeSpec {
        access_modes: Some(vec!["ReadWriteOnce".into()]),
        csi: Some(CSIPersistentVolumeSource {
            driver: DRIVER.into(),
            volume_handle: handle.into(),
            fs_type: Some("ext4".into()),
            ..Default::default()
        }),
        ..Default::default()
    });
    va
}

/// No request of the controller touched a PersistentVolume.
fn assert_no_pv_writes(env: &Env) {
    let pv_writes: Vec<String> = env
        .controller_writes()
        .iter()
        .filter(|r| r.resource == "persistentvolumes")
        .map(describe)
        .collect();
    assert!(pv_writes.is_empty(), "{pv_writes:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inline_csi_error_is_saved_retried_then_cleared_and_detach_unpublishes_once() {
    let mut env = Env::new(MockConfig::default()).await;
    env.mock().script(
        Method::ControllerPublishVolume,
        "vol-inline-e",
        vec![Step::Fail(tonic::Code::Unavailable, "try later".into())],
    );
    env.start(fast_options()).await;
    env.create_va(&inline_va("va-inline-e", "vol-inline-e", NODE))
        .await;
    env.wait_attach_error("va-inline-e", "try later").await;
    let va = env.wait_attached("va-inline-e").await;
    assert!(va.status.as_ref().unwrap().attach_error.is_none());
    assert_eq!(finalizers_of(&va), [FINALIZER]);
    let publishes = env.mock().calls_of(Method::ControllerPublishVolume);
    assert_eq!(publishes.len(), 2, "one failure, one success");
    assert!(publishes.iter().all(|c| c.node_id == NODE_ID));

    env.delete_va("va-inline-e").await;
    env.wait_va_gone("va-inline-e").await;
    let unpublishes = env.mock().calls_of(Method::ControllerUnpublishVolume);
    assert_eq!(unpublishes.len(), 1);
    assert_eq!(unpublishes[0].volume_id, "vol-inline-e");
    assert!(env.mock().published().is_empty());
    env.stop().await;
    assert_no_pv_writes(&env);
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inline_attach_that_hangs_is_cut_off_and_retried() {
    let mut env = Env::new(MockConfig::default()).await;
    env.mock().script(
        Method::ControllerPublishVolume,
        "vol-inline-h",
        vec![Step::Hang],
    );
    let mut options = fast_options();
    options.timeout = Duration::from_millis(300);
    env.start(options).await;
    env.create_va(&inline_va("va-inline-h", "vol-inline-h", NODE))
        .await;
    env.wait_attach_error("va-inline-h", "DeadlineExceeded")
        .await;
    env.wait_attached("va-inline-h").await;
    env.stop().await;
    assert_no_pv_writes(&env);
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inline_volume_on_a_node_without_csinode_waits_for_the_registration() {
    let mut env = Env::new(MockConfig::default()).await;
    env.start(fast_options()).await;
    env.create_va(&inline_va("va-inline-n", "vol-inline-n", "node-new"))
        .await;
    env.wait_attach_error("va-inline-n", "node-new").await;
    assert!(
        env.mock()
            .calls_of(Method::ControllerPublishVolume)
            .is_empty(),
        "nothing published without a node ID"
    );
    env.create_csinode("node-new", &[(DRIVER, "mock-node-new")])
        .await;
    env.wait_attached("va-inline-n").await;
    let publishes = env.mock().calls_of(Method::ControllerPublishVolume);
    assert_eq!(publishes.len(), 1);
    assert_eq!(publishes[0].node_id, "mock-node-new");
    env.stop().await;
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inline_detach_failure_is_recorded_and_retried() {
    let mut env = Env::new(MockConfig::default()).await;
    env.start(fast_options()).await;
    env.create_va(&inline_va("va-inline-d", "vol-inline-d", NODE))
        .await;
    env.wait_attached("va-inline-d").await;
    env.mock().script(
        Method::ControllerUnpublishVolume,
        "vol-inline-d",
        vec![Step::Fail(tonic::Code::Internal, "detach stuck".into())],
    );
    env.delete_va("va-inline-d").await;
    let va = eventually("detachError recorded", || async {
        env.get_va("va-inline-d").await.filter(|va| {
            va.status
                .as_ref()
                .and_then(|s| s.detach_error.as_ref())
                .and_then(|e| e.message.as_deref())
                .is_some_and(|m| m.contains("detach stuck"))
        })
    })
    .await;
    assert_eq!(
        finalizers_of(&va),
        [FINALIZER],
        "kept until the detach works"
    );
    env.wait_va_gone("va-inline-d").await;
    assert_eq!(
        env.mock().calls_of(Method::ControllerUnpublishVolume).len(),
        2
    );
    env.stop().await;
    assert_no_pv_writes(&env);
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attached_inline_volume_attachment_is_left_alone() {
    let mut env = Env::new(MockConfig::default()).await;
    env.create_va(&inline_va("va-inline-done", "vol-inline-done", NODE))
        .await;
    env.set_attached("va-inline-done", true).await;
    // Created after it: once this one is attached, the controller has seen both.
    env.create_va(&inline_va("va-inline-new", "vol-inline-new", NODE))
        .await;
    env.start(fast_options()).await;
    env.wait_attached("va-inline-new").await;
    env.stop().await;
    let published: Vec<String> = env
        .mock()
        .calls_of(Method::ControllerPublishVolume)
        .into_iter()
        .map(|c| c.volume_id)
        .collect();
    assert_eq!(published, ["vol-inline-new"]);
    let touched_done = env
        .controller_writes()
        .iter()
        .any(|r| r.name.as_deref() == Some("va-inline-done"));
    assert!(!touched_done, "no write for the attached VolumeAttachment");
    assert_no_pv_writes(&env);
    env.shutdown().await;
}
