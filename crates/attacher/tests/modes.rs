//! The trivial handler (driver without PUBLISH_UNPUBLISH_VOLUME) and dummy mode.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use attacher::Driver;
use common::*;
use csi_mock::{Method, MockConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_publish_unpublish_volume_attachments_are_marked_attached_without_finalizers() {
    let mut env = Env::new(MockConfig {
        publish_unpublish: false,
        ..MockConfig::default()
    })
    .await;
    env.start(fast_options()).await;
    env.create_pair("t").await;
    let va = env.wait_attached("va-t").await;
    assert!(finalizers_of(&va).is_empty());
    assert!(va.status.unwrap().attachment_metadata.is_none());
    assert!(finalizers_of(&env.get_pv("pv-t").await.unwrap()).is_empty());

    env.delete_va("va-t").await;
    env.wait_va_gone("va-t").await;
    env.stop().await;
    assert!(
        env.mock()
            .calls_of(Method::ControllerPublishVolume)
            .is_empty()
    );
    assert!(
        env.mock()
            .calls_of(Method::ControllerUnpublishVolume)
            .is_empty()
    );
    let writes: Vec<String> = env.controller_writes().iter().map(describe).collect();
    assert_eq!(writes, ["patch volumeattachments/va-t/status"]);
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trivial_handler_drops_a_finalizer_left_by_an_earlier_csi_run() {
    let mut env = Env::new(MockConfig {
        publish_unpublish: false,
        ..MockConfig::default()
    })
    .await;
    let (_, _) = env.create_pair("left").await;
    let patch = serde_json::json!({"metadata": {"finalizers": [FINALIZER]}});
    env.vas()
        .patch(
            "va-left",
            &Default::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .unwrap();
    env.set_attached("va-left", true).await;
    env.start(fast_options()).await;
    env.delete_va("va-left").await;
    env.wait_va_gone("va-left").await;
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dummy_mode_attaches_csi_dummy_volume_attachments_only() {
    let mut env = Env::without_driver().await;
    env.create_pv(&csi_pv("pv-dummy", "vol-dummy")).await;
    // Today's API servers refuse `csi/dummy` (spec.attacher must be a DNS subdomain).
    let refused = env
        .vas()
        .create(
            &Default::default(),
            &va_of("va-slash", "csi/dummy", "pv-dummy", NODE),
        )
        .await;
    assert!(refused.is_err());
    env.create_va(&va_of("va-dummy", "csi-dummy", "pv-dummy", NODE))
        .await;
    env.create_va(&va_of("va-real", DRIVER, "pv-dummy", NODE))
        .await;
    env.start_with(Driver::Dummy, fast_options()).await;
    let va = env.wait_attached("va-dummy").await;
    assert!(finalizers_of(&va).is_empty());

    env.delete_va("va-dummy").await;
    env.wait_va_gone("va-dummy").await;
    env.stop().await;
    let real = env.get_va("va-real").await.unwrap();
    assert!(real.status.as_ref().is_none_or(|s| !s.attached));
    let writes: Vec<String> = env.controller_writes().iter().map(describe).collect();
    assert_eq!(writes, ["patch volumeattachments/va-dummy/status"]);
    env.shutdown().await;
}
