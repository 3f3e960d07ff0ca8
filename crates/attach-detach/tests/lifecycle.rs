//! Pods coming and going: a pod moving between nodes (the detach waits for the node's
//! `status.volumesInUse`), Multi-Attach refusal for ReadWriteOnce, ReadWriteMany on several
//! nodes, a node deleted with volumes attached. The real csi-attacher and csi-mock fulfil the
//! VolumeAttachments.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;
use test_support::objects::create_json;

use common::*;
use volume_plugins::SkipAttachMode::BypassAdc;

const A: &str = "node-a";
const B: &str = "node-b";

async fn two_nodes() -> Env {
    let mut env = Env::new().await;
    env.start_attacher(DRIVER).await;
    env.create_node(A, &[DRIVER], None).await;
    env.create_node(B, &[DRIVER], None).await;
    env
}

#[tokio::test]
async fn a_pod_moving_between_nodes_is_detached_once_unmounted_then_attached() {
    let mut env = two_nodes().await;
    env.create_csi_pv("pv-mv", "mv", DRIVER, "h-mv", "ReadWriteOnce")
        .await;
    env.create_pod("pod-a", A, "mv").await;
    env.start_adc(fast_options(BypassAdc));
    let name = csi_name(DRIVER, "h-mv");
    env.wait_va_attached("h-mv", DRIVER, A).await;
    env.wait_volumes_attached(A, &[&name]).await;
    // The kubelet on A mounts it and says so.
    env.set_volumes_in_use(A, &[&name]).await;

    env.delete_pod("pod-a").await;
    env.create_pod("pod-b", B, "mv").await;
    let message = env
        .wait_pod_event("pod-b", "FailedAttachVolume", "Multi-Attach error")
        .await;
    assert_eq!(
        message,
        "Multi-Attach error for volume \"pv-mv\" Volume is already exclusively attached to one node and can't be attached to another"
    );
    stays(
        "A still in use: no detach, no attach to B",
        Duration::from_secs(1),
        || async {
            env.va_exists("h-mv", DRIVER, A).await
                && !env.va_exists("h-mv", DRIVER, B).await
                && env.volumes_attached(A).await.len() == 1
        },
    )
    .await;

    // The kubelet unmounts: detach from A, then attach to B.
    env.set_volumes_in_use(A, &[]).await;
    env.wait_va_gone("h-mv", DRIVER, A).await;
    env.wait_va_attached("h-mv", DRIVER, B).await;
    env.wait_volumes_attached(B, &[&name]).await;
    env.wait_volumes_attached(A, &[]).await;
    env.wait_pod_event("pod-b", "SuccessfulAttachVolume", "\"pv-mv\"")
        .await;
    assert_eq!(env.va_creates(), 2);

    // Node status lost the volume before its VolumeAttachment was deleted.
    let audit = env.server.audit();
    let va_a = volume_plugins::names::volume_attachment_name("h-mv", DRIVER, A);
    let delete = audit
        .iter()
        .position(|r| r.verb == "delete" && r.name.as_deref() == Some(va_a.as_str()))
        .expect("the controller deleted the VolumeAttachment on A");
    let status_write = audit.iter().position(|r| {
        r.user_agent.starts_with(ADC_UA)
            && r.verb == "patch"
            && r.resource == "nodes"
            && r.name.as_deref() == Some(A)
            && r.subresource.as_deref() == Some("status")
    });
    assert!(
        status_write.is_some_and(|w| w < delete),
        "node {A} status written ({status_write:?}) before the VolumeAttachment delete ({delete})"
    );
    env.shutdown().await;
}

#[tokio::test]
async fn read_write_once_is_refused_on_a_second_node_read_write_many_is_not() {
    let mut env = two_nodes().await;
    env.create_csi_pv("pv-rwo", "rwo", DRIVER, "h-rwo", "ReadWriteOnce")
        .await;
    env.create_csi_pv("pv-rwx", "rwx", DRIVER, "h-rwx", "ReadWriteMany")
        .await;
    env.create_pod_with("pod-1", A, vec![claim_volume("rwo"), claim_volume("rwx")])
        .await;
    env.start_adc(fast_options(BypassAdc));
    env.wait_va_attached("h-rwo", DRIVER, A).await;
    env.wait_va_attached("h-rwx", DRIVER, A).await;

    env.create_pod_with("pod-2", B, vec![claim_volume("rwo"), claim_volume("rwx")])
        .await;
    let message = env
        .wait_pod_event("pod-2", "FailedAttachVolume", "Multi-Attach error")
        .await;
    assert_eq!(
        message,
        "Multi-Attach error for volume \"pv-rwo\" Volume is already used by pod(s) pod-1"
    );
    env.wait_va_attached("h-rwx", DRIVER, B).await;
    env.wait_volumes_attached(B, &[&csi_name(DRIVER, "h-rwx")])
        .await;
    env.wait_volumes_attached(A, &[&csi_name(DRIVER, "h-rwo"), &csi_name(DRIVER, "h-rwx")])
        .await;
    stays("RWO stays on one node", Duration::from_secs(1), || async {
        !env.va_exists("h-rwo", DRIVER, B).await
    })
    .await;
    assert_eq!(env.va_creates(), 3, "rwo on A, rwx on A and B");
    let multi = env
        .pod_events("pod-2")
        .await
        .into_iter()
        .filter(|(_, m)| m.contains("Multi-Attach"))
        .count();
    assert_eq!(multi, 1, "the Multi-Attach error is reported once");
    env.shutdown().await;
}

#[tokio::test]
async fn a_deleted_node_has_its_volumes_detached_a_mounted_one_forced_after_the_wait() {
    let mut env = two_nodes().await;
    env.create_csi_pv("pv-n1", "n1", DRIVER, "h-n1", "ReadWriteOnce")
        .await;
    env.create_csi_pv("pv-n2", "n2", DRIVER, "h-n2", "ReadWriteOnce")
        .await;
    env.create_pod_with("pod-a", A, vec![claim_volume("n1"), claim_volume("n2")])
        .await;
    env.create_csi_pv("pv-keep", "keep", DRIVER, "h-keep", "ReadWriteOnce")
        .await;
    env.create_pod("pod-b", B, "keep").await;
    let max_wait = Duration::from_secs(3);
    env.start_adc(attach_detach::Options {
        max_wait_for_unmount: max_wait,
        ..fast_options(BypassAdc)
    });
    let (n1, n2) = (csi_name(DRIVER, "h-n1"), csi_name(DRIVER, "h-n2"));
    env.wait_volumes_attached(A, &[&n1, &n2]).await;
    env.wait_va_attached("h-keep", DRIVER, B).await;
    // The node's last word: n1 is mounted.
    env.set_volumes_in_use(A, &[&n1]).await;
    eventually("the controller has seen volumesInUse", || async {
        let vas = env.vas().await;
        (vas.len() == 3).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    env.delete_node(A).await;
    let deleted = std::time::Instant::now();
    env.wait_va_gone("h-n2", DRIVER, A).await;
    assert!(
        env.va_exists("h-n1", DRIVER, A).await,
        "the volume the node last reported in use waits for --max-wait-for-unmount"
    );
    env.wait_va_gone("h-n1", DRIVER, A).await;
    assert!(
        deleted.elapsed() >= max_wait - Duration::from_millis(500),
        "forced detach only after the wait ({:?})",
        deleted.elapsed()
    );
    let forced = eventually("a ForcedDetachVolume Event on the node", || async {
        let events =
            kube::Api::<k8s_openapi::api::core::v1::Event>::namespaced(env.kube.clone(), NS)
                .list(&Default::default())
                .await
                .ok()?;
        events.items.into_iter().find(|e| {
            e.involved_object.kind.as_deref() == Some("Node")
                && e.reason.as_deref() == Some("ForcedDetachVolume")
        })
    })
    .await;
    assert!(forced.message.unwrap_or_default().contains(&n1));
    stays(
        "the other node keeps its volume",
        Duration::from_millis(500),
        || async { env.va_exists("h-keep", DRIVER, B).await },
    )
    .await;
    env.wait_volumes_attached(B, &[&csi_name(DRIVER, "h-keep")])
        .await;
    env.shutdown().await;
}

#[tokio::test]
async fn nodes_without_the_annotation_are_left_to_their_kubelet() {
    let mut env = two_nodes().await;
    env.create_unmanaged_node("node-self").await;
    let kubelet_volume = csi_name(DRIVER, "h-self");
    env.set_volumes_attached("node-self", &[&kubelet_volume])
        .await;
    env.create_csi_pv("pv-self", "self", DRIVER, "h-self", "ReadWriteOnce")
        .await;
    env.create_pod("pod-self", "node-self", "self").await;
    env.create_csi_pv("pv-ours", "ours", DRIVER, "h-ours", "ReadWriteOnce")
        .await;
    env.create_pod("pod-ours", A, "ours").await;
    env.start_adc(fast_options(BypassAdc));
    env.wait_volumes_attached(A, &[&csi_name(DRIVER, "h-ours")])
        .await;
    stays(
        "the unmanaged node is untouched",
        Duration::from_millis(500),
        || async {
            !env.va_exists("h-self", DRIVER, "node-self").await
                && env.volumes_attached("node-self").await
                    == vec![(kubelet_volume.clone(), "/dev/kubelet".to_string())]
        },
    )
    .await;
    assert!(
        env.adc_requests("patch", "nodes")
            .iter()
            .all(|r| r.name.as_deref() != Some("node-self")),
        "no status write to the unmanaged node"
    );
    env.shutdown().await;
}

#[tokio::test]
async fn attach_errors_reach_the_pod_and_the_attach_is_retried() {
    let mut env = two_nodes().await;
    env.mock(0).script(
        csi_mock::Method::ControllerPublishVolume,
        "h-err",
        vec![
            csi_mock::Step::Fail(
                tonic::Code::ResourceExhausted,
                "no free slot on the node".into(),
            ),
            csi_mock::Step::Fail(
                tonic::Code::ResourceExhausted,
                "no free slot on the node".into(),
            ),
        ],
    );
    env.create_csi_pv("pv-err", "err", DRIVER, "h-err", "ReadWriteOnce")
        .await;
    env.create_pod("pod-err", A, "err").await;
    env.start_adc(fast_options(BypassAdc));
    let message = env
        .wait_pod_event("pod-err", "FailedAttachVolume", "no free slot on the node")
        .await;
    // Word for word what kube-controller-manager shows with the Go external-attacher.
    assert_eq!(
        message,
        "AttachVolume.Attach failed for volume \"pv-err\" : rpc error: code = ResourceExhausted desc = no free slot on the node"
    );
    env.wait_va_attached("h-err", DRIVER, A).await;
    env.wait_volumes_attached(A, &[&csi_name(DRIVER, "h-err")])
        .await;
    env.wait_pod_event("pod-err", "SuccessfulAttachVolume", "\"pv-err\"")
        .await;
    assert_eq!(
        env.va_creates(),
        1,
        "the failed VolumeAttachment is reused, not created again"
    );
    env.shutdown().await;
}

#[tokio::test]
async fn a_pending_claim_is_attached_once_it_binds() {
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
    use kube::api::{Patch, PatchParams};
    use serde_json::json;

    let mut env = two_nodes().await;
    create_json::<PersistentVolume>(
        kube::Api::all(env.kube.clone()),
        json!({"metadata": {"name": "pv-late"}, "spec": {
            "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"},
            "csi": {"driver": DRIVER, "volumeHandle": "h-late"}}}),
    )
    .await;
    create_json::<PersistentVolumeClaim>(
        kube::Api::namespaced(env.kube.clone(), NS),
        json!({"metadata": {"name": "late", "namespace": NS}, "spec": {
            "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
            "storageClassName": ""}}),
    )
    .await;
    env.create_pod("pod-late", A, "late").await;
    env.start_adc(fast_options(BypassAdc));
    stays(
        "nothing attached for a pending claim",
        Duration::from_millis(500),
        || async { env.vas().await.is_empty() },
    )
    .await;
    assert!(
        env.pod_events("pod-late").await.is_empty(),
        "a pending claim is no error"
    );
    // The PV controller binds them.
    let pvs = kube::Api::<PersistentVolume>::all(env.kube.clone());
    let claim_ref = json!({"spec": {"claimRef": {"namespace": NS, "name": "late"}}});
    pvs.patch(
        "pv-late",
        &PatchParams::default(),
        &Patch::Merge(&claim_ref),
    )
    .await
    .unwrap();
    let pvcs = kube::Api::<PersistentVolumeClaim>::namespaced(env.kube.clone(), NS);
    pvcs.patch(
        "late",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"volumeName": "pv-late"}})),
    )
    .await
    .unwrap();
    let bound = json!({"status": {"phase": "Bound"}});
    pvs.patch_status("pv-late", &PatchParams::default(), &Patch::Merge(&bound))
        .await
        .unwrap();
    pvcs.patch_status("late", &PatchParams::default(), &Patch::Merge(&bound))
        .await
        .unwrap();
    env.wait_va_attached("h-late", DRIVER, A).await;
    env.wait_volumes_attached(A, &[&csi_name(DRIVER, "h-late")])
        .await;
    env.shutdown().await;
}
