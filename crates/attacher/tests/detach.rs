//! Detach and the PV finalizer rules (the external-attacher design,
//! docs/design/external-attacher.md, "Concurrency").
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use csi_mock::{Method, MockConfig, Step};
use kube::api::{Patch, PatchParams};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detach_unpublishes_then_lets_the_volume_attachment_go_with_one_write() {
    let mut env = Env::new(MockConfig::default()).await;
    env.start(fast_options()).await;
    env.create_pair("d").await;
    env.wait_attached("va-d").await;
    let before = env.controller_writes().len();

    env.delete_va("va-d").await;
    env.wait_va_gone("va-d").await;
    let calls = env.mock().calls_of(Method::ControllerUnpublishVolume);
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(
        (calls[0].volume_id.as_str(), calls[0].node_id.as_str()),
        ("vol-d", NODE_ID)
    );
    assert!(
        env.mock()
            .published()
            .get("vol-d")
            .is_none_or(|n| n.is_empty())
    );

    // The PV was poked but is not being deleted: it keeps our finalizer.
    let pv = env.get_pv("pv-d").await.expect("pv");
    assert_eq!(finalizers_of(&pv), [FINALIZER]);

    env.stop().await;
    let detach_writes: Vec<String> = env.controller_writes()[before..]
        .iter()
        .map(describe)
        .collect();
    assert_eq!(detach_writes, ["patch volumeattachments/va-d"]);
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detach_uses_the_node_id_annotation_when_the_csinode_is_gone() {
    let mut env = Env::new(MockConfig::default()).await;
    env.start(fast_options()).await;
    env.create_pair("gone-node").await;
    env.wait_attached("va-gone-node").await;
    env.csinodes()
        .delete(NODE, &Default::default())
        .await
        .expect("delete CSINode");
    env.delete_va("va-gone-node").await;
    env.wait_va_gone("va-gone-node").await;
    let calls = env.mock().calls_of(Method::ControllerUnpublishVolume);
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].node_id, NODE_ID);
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_detach_is_recorded_and_retried() {
    let mut env = Env::new(MockConfig::default()).await;
    env.start(fast_options()).await;
    env.create_pair("df").await;
    env.wait_attached("va-df").await;
    env.mock().script(
        Method::ControllerUnpublishVolume,
        "vol-df",
        // Five failures keep detachError in the status for 50+100+200+400+800 ms at least.
        vec![Step::Fail(tonic::Code::Unavailable, "controller busy".into()); 5],
    );
    env.delete_va("va-df").await;
    let vas = env.vas();
    let errored = eventually("detachError recorded", || async {
        let va = vas.get_opt("va-df").await.ok().flatten()?;
        let msg = va.status.as_ref()?.detach_error.as_ref()?.message.clone()?;
        Some(msg)
    })
    .await;
    assert!(errored.contains("Unavailable"), "{errored}");
    assert!(errored.contains("controller busy"), "{errored}");
    env.wait_va_gone("va-df").await;
    assert_eq!(
        env.mock().calls_of(Method::ControllerUnpublishVolume).len(),
        6,
        "five failures, then success"
    );
    let events = env.events_for("va-df").await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].reason.as_deref(), Some("FailedDetach"));
    assert_eq!(events[0].count, Some(5));
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pv_deleted_while_attached_keeps_our_finalizer_until_the_detach() {
    let mut env = Env::new(MockConfig::default()).await;
    env.start(fast_options()).await;
    env.create_pair("busy").await;
    env.wait_attached("va-busy").await;

    env.delete_pv("pv-busy").await;
    // Deleted but held: still used by va-busy.
    let pv = env.get_pv("pv-busy").await.expect("pv still there");
    assert!(pv.metadata.deletion_timestamp.is_some());
    assert_eq!(finalizers_of(&pv), [FINALIZER]);

    env.delete_va("va-busy").await;
    env.wait_va_gone("va-busy").await;
    // The deleted VolumeAttachment pokes its PV: our finalizer goes, and with it the PV.
    env.wait_pv_gone("pv-busy").await;
    assert_eq!(
        env.mock().calls_of(Method::ControllerUnpublishVolume).len(),
        1
    );
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unused_pv_being_deleted_loses_only_our_finalizer() {
    let mut env = Env::new(MockConfig::default()).await;
    env.start(fast_options()).await;
    env.create_pair("free").await;
    env.wait_attached("va-free").await;
    env.delete_va("va-free").await;
    env.wait_va_gone("va-free").await;

    // Someone else's finalizer keeps the PV around after ours is gone.
    let patch = serde_json::json!({"metadata": {"finalizers": [FINALIZER, "example.com/keep"]}});
    env.pvs()
        .patch("pv-free", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("add finalizer");
    env.delete_pv("pv-free").await;
    let pvs = env.pvs();
    let pv = eventually("our finalizer removed", || async {
        let pv = pvs.get_opt("pv-free").await.ok().flatten()?;
        (finalizers_of(&pv) == ["example.com/keep"]).then_some(pv)
    })
    .await;
    assert!(pv.metadata.deletion_timestamp.is_some());
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_pv_keeps_our_finalizer_after_the_detach() {
    // The external-attacher design: even fully detached PVs keep the finalizer until they are being
    // deleted.
    let mut env = Env::new(MockConfig::default()).await;
    env.create_pair("kept").await;
    env.start(fast_options()).await;
    env.wait_attached("va-kept").await;
    env.delete_va("va-kept").await;
    env.wait_va_gone("va-kept").await;
    env.stop().await;
    let pv = env.get_pv("pv-kept").await.expect("pv");
    assert_eq!(finalizers_of(&pv), [FINALIZER]);
    let pv_writes = env
        .controller_writes()
        .iter()
        .filter(|r| r.resource == "persistentvolumes")
        .count();
    assert_eq!(
        pv_writes, 1,
        "only the finalizer add; no removal from a live PV"
    );
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pvs_being_deleted_at_start_up_are_released_once_free() {
    // A PV finalized by an earlier run, deleted while no attacher ran.
    let mut env = Env::new(MockConfig::default()).await;
    let mut pv = csi_pv("pv-orphan", "vol-orphan");
    pv.metadata.finalizers = Some(vec![FINALIZER.into()]);
    env.create_pv(&pv).await;
    env.delete_pv("pv-orphan").await;
    env.start(fast_options()).await;
    env.wait_pv_gone("pv-orphan").await;
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_attachment_deleted_during_its_publish_is_detached_right_after() {
    let mut env = Env::new(MockConfig::default()).await;
    env.mock().script(
        Method::ControllerPublishVolume,
        "vol-mid",
        vec![Step::Delay(std::time::Duration::from_millis(500))],
    );
    env.start(fast_options()).await;
    env.create_pair("mid").await;
    let mock = env.mock();
    eventually("publish in flight", || async {
        (!mock.calls_of(Method::ControllerPublishVolume).is_empty()).then_some(())
    })
    .await;
    env.delete_va("va-mid").await;
    env.wait_va_gone("va-mid").await;
    let calls = env.mock().calls();
    let order: Vec<Method> = calls
        .iter()
        .filter(|c| c.volume_id == "vol-mid")
        .map(|c| c.method)
        .collect();
    assert_eq!(
        order,
        [
            Method::ControllerPublishVolume,
            Method::ControllerUnpublishVolume
        ],
        "the detach waits for the attach in progress (one worker per object)"
    );
    let unpublish = calls
        .iter()
        .find(|c| c.method == Method::ControllerUnpublishVolume)
        .expect("unpublished");
    let publish = &calls[0];
    assert!(unpublish.at >= publish.at + std::time::Duration::from_millis(500));
    assert!(
        env.mock()
            .published()
            .get("vol-mid")
            .is_none_or(|n| n.is_empty())
    );
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_detaches_do_not_hold_up_a_new_attach() {
    let mut env = Env::new(MockConfig::default()).await;
    let mut options = fast_options();
    options.workers = 2;
    env.start(options).await;
    for i in 0..6 {
        env.create_pair(&format!("slow{i}")).await;
    }
    for i in 0..6 {
        env.wait_attached(&format!("va-slow{i}")).await;
        // Each detach takes a long while at the driver.
        env.mock().script(
            Method::ControllerUnpublishVolume,
            &format!("vol-slow{i}"),
            vec![Step::Delay(std::time::Duration::from_secs(2))],
        );
    }
    for i in 0..6 {
        env.delete_va(&format!("va-slow{i}")).await;
    }
    let mock = env.mock();
    eventually("both detach workers busy", || async {
        (mock.calls_of(Method::ControllerUnpublishVolume).len() >= 2).then_some(())
    })
    .await;
    env.create_pair("urgent").await;
    env.wait_attached("va-urgent").await;
    // With one shared FIFO queue the attach would wait behind all six detaches (three rounds of
    // 2 s on two workers) and find none left; here it does not wait for the detach lane.
    let remaining = env
        .vas()
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|va| {
            va.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with("va-slow"))
        })
        .count();
    assert!(
        remaining >= 4,
        "{remaining} detaches left; the attach did not wait for them"
    );
    for i in 0..6 {
        env.wait_va_gone(&format!("va-slow{i}")).await;
    }
    env.shutdown().await;
}
