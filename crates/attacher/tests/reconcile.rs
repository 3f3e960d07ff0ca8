//! The reconciler: ListVolumes published nodes vs `status.attached`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use csi_mock::{Method, MockConfig};

fn reconciling() -> attacher::Options {
    let mut o = fast_options();
    o.reconcile_sync = Duration::from_millis(100);
    o
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_detached_behind_our_back_is_attached_again() {
    let mut env = Env::new(MockConfig::default()).await;
    env.start(reconciling()).await;
    env.create_pair("drift").await;
    env.wait_attached("va-drift").await;
    let writes_before = env.controller_writes().len();

    env.mock().set_published("vol-drift", &[]);
    eventually("re-published by the reconciler", || async {
        env.mock()
            .published()
            .get("vol-drift")
            .is_some_and(|n| n.contains(NODE_ID))
            .then_some(())
    })
    .await;
    env.stop().await;
    assert_eq!(
        env.mock().calls_of(Method::ControllerPublishVolume).len(),
        2
    );
    assert!(!env.mock().calls_of(Method::ListVolumes).is_empty());
    let va = env.get_va("va-drift").await.unwrap();
    assert!(va.status.unwrap().attached);
    assert_eq!(
        env.controller_writes().len(),
        writes_before,
        "the status already says so: no write"
    );
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attached_status_the_driver_does_not_confirm_is_corrected() {
    let mut env = Env::new(MockConfig::default()).await;
    env.create_pair("liar").await;
    env.set_attached("va-liar", true).await;
    let mut options = reconciling();
    options.max_entries = 1; // page through ListVolumes one volume at a time
    for i in 0..3 {
        env.create_pair(&format!("p{i}")).await;
    }
    env.start(options).await;
    for i in 0..3 {
        env.wait_attached(&format!("va-p{i}")).await;
    }
    eventually("va-liar published", || async {
        env.mock()
            .published()
            .get("vol-liar")
            .is_some_and(|n| n.contains(NODE_ID))
            .then_some(())
    })
    .await;
    let pvs = env.pvs();
    eventually("finalizers set on the re-attach", || async {
        let pv = pvs.get_opt("pv-liar").await.ok().flatten()?;
        (finalizers_of(&pv) == [FINALIZER]).then_some(())
    })
    .await;
    env.stop().await;
    let lists = env.mock().calls_of(Method::ListVolumes);
    assert!(lists.len() >= 2, "paged: {} ListVolumes calls", lists.len());
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_list_volumes_published_nodes_there_is_no_reconciler() {
    let mut env = Env::new(MockConfig {
        list_published_nodes: false,
        ..MockConfig::default()
    })
    .await;
    env.start(reconciling()).await;
    env.create_pair("nolist").await;
    env.wait_attached("va-nolist").await;
    env.mock().set_published("vol-nolist", &[]);
    // Give a reconciler (if there were one) several periods to run, measured by the work of
    // another VolumeAttachment rather than by a sleep.
    for i in 0..5 {
        env.create_pair(&format!("n{i}")).await;
        env.wait_attached(&format!("va-n{i}")).await;
    }
    env.stop().await;
    assert!(env.mock().calls_of(Method::ListVolumes).is_empty());
    let republished = env
        .mock()
        .calls_of(Method::ControllerPublishVolume)
        .iter()
        .filter(|c| c.volume_id == "vol-nolist")
        .count();
    assert_eq!(republished, 1);
    env.shutdown().await;
}
