//! Skip attach (the skip-attach design, docs/design/skip-attach.md) through the controller, in
//! both modes (bypass-adc: today's Kubernetes; through-adc: the design as written in 2018), with
//! the real csi-attacher and csi-mock fulfilling VolumeAttachments. Each case asserts the
//! VolumeAttachments the controller created (audit trail), `node.status.volumesAttached` and the
//! pod's Events.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use serde_json::{Value, json};
use volume_plugins::SkipAttachMode::{self, BypassAdc, ThroughAdc};

const NODE: &str = "node-1";
const MODES: [SkipAttachMode; 2] = [BypassAdc, ThroughAdc];

/// An inline in-tree EBS volume; with no cloud configured its attach fails at once with an
/// Event, which tells a test the controller has processed the pod (a sync point for "nothing
/// happened" assertions).
fn barrier_volume() -> Value {
    json!({"name": "barrier", "awsElasticBlockStore": {"volumeID": "vol-barrier"}})
}

async fn wait_barrier(env: &Env, pod: &str) {
    env.wait_pod_event(pod, "FailedAttachVolume", "no cloud configured")
        .await;
}

/// Env with the attacher (or not), node-1 registering the mock driver, PV `pv-<case>` bound to
/// claim `<case>` with handle `h-<case>`.
async fn setup(case: &str, attacher: bool) -> Env {
    let mut env = Env::new().await;
    if attacher {
        env.start_attacher(DRIVER).await;
    }
    env.create_node(NODE, &[DRIVER], None).await;
    env.create_csi_pv(
        &format!("pv-{case}"),
        case,
        DRIVER,
        &format!("h-{case}"),
        "ReadWriteOnce",
    )
    .await;
    env
}

async fn attach_required_true(mode: SkipAttachMode) {
    let mut env = setup("t", true).await;
    env.create_csidriver(DRIVER, true).await;
    env.create_pod("pod-t", NODE, "t").await;
    env.start_adc(fast_options(mode));
    env.wait_va_attached("h-t", DRIVER, NODE).await;
    env.wait_volumes_attached(NODE, &[&csi_name(DRIVER, "h-t")])
        .await;
    env.wait_pod_event(
        "pod-t",
        "SuccessfulAttachVolume",
        "AttachVolume.Attach succeeded for volume \"pv-t\"",
    )
    .await;
    assert_eq!(env.va_creates(), 1, "{mode}: one VolumeAttachment");
    env.delete_pod("pod-t").await;
    env.wait_va_gone("h-t", DRIVER, NODE).await;
    env.wait_volumes_attached(NODE, &[]).await;
    assert_eq!(env.va_creates(), 1, "{mode}: nothing created again");
    // Node status written when its list changed, and only then: listed, then emptied before
    // the detach.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let status_writes = env.adc_requests("patch", "nodes");
    assert_eq!(status_writes.len(), 2, "{mode}: {status_writes:?}");
    assert!(
        status_writes
            .iter()
            .all(|r| r.subresource.as_deref() == Some("status"))
    );
    env.shutdown().await;
}

#[tokio::test]
async fn attach_required_true_attaches_through_a_volume_attachment() {
    for mode in MODES {
        attach_required_true(mode).await;
    }
}

async fn attach_required_false(mode: SkipAttachMode) {
    let mut env = setup("f", true).await;
    env.create_csidriver(DRIVER, false).await;
    env.create_pod_with("pod-f", NODE, vec![claim_volume("f"), barrier_volume()])
        .await;
    env.start_adc(fast_options(mode));
    wait_barrier(&env, "pod-f").await;
    match mode {
        ThroughAdc => {
            // The 2018 design's no-op attach: listed, no VolumeAttachment.
            env.wait_volumes_attached(NODE, &[&csi_name(DRIVER, "h-f")])
                .await;
            env.wait_pod_event("pod-f", "SuccessfulAttachVolume", "\"pv-f\"")
                .await;
        }
        BypassAdc => {
            stays(
                "bypass-adc: not listed, no Event",
                Duration::from_secs(1),
                || async {
                    env.volumes_attached(NODE).await.is_empty()
                        && !env
                            .pod_events("pod-f")
                            .await
                            .iter()
                            .any(|(r, _)| r == "SuccessfulAttachVolume")
                },
            )
            .await;
        }
    }
    assert_eq!(
        env.va_creates(),
        0,
        "{mode}: no VolumeAttachment for attachRequired false"
    );
    assert!(env.vas().await.is_empty(), "{mode}");
    env.delete_pod("pod-f").await;
    env.wait_volumes_attached(NODE, &[]).await;
    env.shutdown().await;
}

#[tokio::test]
async fn attach_required_false_is_a_no_op_or_left_alone() {
    for mode in MODES {
        attach_required_false(mode).await;
    }
}

async fn csidriver_missing(mode: SkipAttachMode) {
    let mut env = setup("m", true).await;
    env.create_pod("pod-m", NODE, "m").await;
    env.start_adc(fast_options(mode));
    let va = env.wait_va_attached("h-m", DRIVER, NODE).await;
    assert_eq!(
        va.spec.source.persistent_volume_name.as_deref(),
        Some("pv-m")
    );
    env.wait_volumes_attached(NODE, &[&csi_name(DRIVER, "h-m")])
        .await;
    env.wait_pod_event("pod-m", "SuccessfulAttachVolume", "\"pv-m\"")
        .await;
    assert_eq!(env.va_creates(), 1, "{mode}");
    env.shutdown().await;
}

#[tokio::test]
async fn a_missing_csidriver_means_attachable() {
    for mode in MODES {
        csidriver_missing(mode).await;
    }
}

async fn csidriver_created_late(mode: SkipAttachMode) {
    // No attacher: the VolumeAttachment made while the CSIDriver is missing is never attached.
    let mut env = setup("l", false).await;
    env.create_pod("pod-l", NODE, "l").await;
    env.start_adc(fast_options(mode));
    eventually("the VolumeAttachment is created", || async {
        env.va_exists("h-l", DRIVER, NODE).await.then_some(())
    })
    .await;
    assert!(
        env.volumes_attached(NODE).await.is_empty(),
        "{mode}: not attached yet"
    );
    // The CSIDriver appears: the waiting attach recovers and the volume counts as attached.
    env.create_csidriver(DRIVER, false).await;
    env.wait_volumes_attached(NODE, &[&csi_name(DRIVER, "h-l")])
        .await;
    env.wait_pod_event("pod-l", "SuccessfulAttachVolume", "\"pv-l\"")
        .await;
    assert_eq!(env.va_creates(), 1, "{mode}");
    // The stale VolumeAttachment goes with the detach.
    env.delete_pod("pod-l").await;
    env.wait_va_gone("h-l", DRIVER, NODE).await;
    env.wait_volumes_attached(NODE, &[]).await;
    assert_eq!(env.va_creates(), 1, "{mode}");
    env.shutdown().await;
}

#[tokio::test]
async fn a_csidriver_created_late_ends_the_wait() {
    for mode in MODES {
        csidriver_created_late(mode).await;
    }
}

async fn csidriver_deleted_while_attached(mode: SkipAttachMode) {
    let mut env = setup("d", true).await;
    env.create_csidriver(DRIVER, false).await;
    env.create_pod_with("pod-d", NODE, vec![claim_volume("d"), barrier_volume()])
        .await;
    env.start_adc(fast_options(mode));
    wait_barrier(&env, "pod-d").await;
    if mode == ThroughAdc {
        env.wait_volumes_attached(NODE, &[&csi_name(DRIVER, "h-d")])
            .await;
    }
    assert_eq!(env.va_creates(), 0, "{mode}: no VolumeAttachment yet");
    // The skip-attach design's downgrade: the driver becomes attachable, a VolumeAttachment is
    // created and the attacher fulfils it.
    env.delete_csidriver(DRIVER).await;
    let va = env.wait_va_attached("h-d", DRIVER, NODE).await;
    assert_eq!(
        va.spec.source.persistent_volume_name.as_deref(),
        Some("pv-d")
    );
    env.wait_volumes_attached(NODE, &[&csi_name(DRIVER, "h-d")])
        .await;
    assert_eq!(env.va_creates(), 1, "{mode}");
    env.delete_pod("pod-d").await;
    env.wait_va_gone("h-d", DRIVER, NODE).await;
    env.wait_volumes_attached(NODE, &[]).await;
    env.shutdown().await;
}

#[tokio::test]
async fn a_csidriver_deleted_while_attached_makes_the_volume_attachable() {
    for mode in MODES {
        csidriver_deleted_while_attached(mode).await;
    }
}

async fn stale_va_deleted_on_detach(mode: SkipAttachMode) {
    let mut env = setup("s", true).await;
    env.create_pod("pod-s", NODE, "s").await;
    env.start_adc(fast_options(mode));
    env.wait_va_attached("h-s", DRIVER, NODE).await;
    env.wait_volumes_attached(NODE, &[&csi_name(DRIVER, "h-s")])
        .await;
    // The skip-attach design's upgrade: the CSIDriver appears saying no attach is needed. The pod
    // keeps its VolumeAttachment while it runs.
    env.create_csidriver(DRIVER, false).await;
    stays(
        "the VolumeAttachment stays while the pod runs",
        Duration::from_secs(1),
        || async { env.va_exists("h-s", DRIVER, NODE).await },
    )
    .await;
    env.delete_pod("pod-s").await;
    env.wait_va_gone("h-s", DRIVER, NODE).await;
    env.wait_volumes_attached(NODE, &[]).await;
    assert_eq!(env.va_creates(), 1, "{mode}");
    assert_eq!(
        env.adc_requests("delete", "volumeattachments")
            .iter()
            .filter(|r| r.code < 300)
            .count(),
        1,
        "{mode}: the stale VolumeAttachment deleted once"
    );
    env.shutdown().await;
}

#[tokio::test]
async fn a_stale_volume_attachment_is_deleted_on_detach() {
    for mode in MODES {
        stale_va_deleted_on_detach(mode).await;
    }
}
