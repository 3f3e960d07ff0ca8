//! Static binding against apiserver-lite: which volume a claim gets, and what both sides look
//! like afterwards, read back from the API.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Env, NS, PATIENCE, annotation, fast_options, pv_json, pvc_json};
use serde_json::json;

const RWO: &[&str] = &["ReadWriteOnce"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smallest_matching_volume_binds_and_both_sides_say_so() {
    let mut env = Env::new().await;
    env.create_pv("big", "10Gi", RWO, "").await;
    env.create_pv("fit", "2Gi", RWO, "").await;
    env.create_pv("small", "512Mi", RWO, "").await;
    env.create_pv("rwx", "1Gi", &["ReadWriteMany"], "").await;
    env.create_pv("gold", "1Gi", RWO, "gold").await;
    let mut block = pv_json("block", "1Gi", RWO, "");
    block["spec"]["volumeMode"] = json!("Block");
    env.create_pv_json(block).await;
    env.start(fast_options()).await;

    let claim = env.create_pvc("data", "1Gi", RWO, None).await;
    let pvc = env.wait_pvc_phase("data", "Bound").await;
    assert_eq!(
        pvc.spec.as_ref().unwrap().volume_name.as_deref(),
        Some("fit")
    );
    assert_eq!(
        annotation(&pvc, "pv.kubernetes.io/bind-completed").as_deref(),
        Some("yes")
    );
    assert_eq!(
        annotation(&pvc, "pv.kubernetes.io/bound-by-controller").as_deref(),
        Some("yes")
    );
    let status = pvc.status.as_ref().unwrap();
    assert_eq!(status.capacity.as_ref().unwrap()["storage"].0, "2Gi");
    assert_eq!(
        status.access_modes.as_deref(),
        Some(&["ReadWriteOnce".to_string()][..])
    );
    assert!(
        pvc.metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == "kubernetes.io/pvc-protection"),
        "{:?}",
        pvc.metadata.finalizers
    );

    let pv = env.wait_pv_phase("fit", "Bound").await;
    let r = pv.spec.as_ref().unwrap().claim_ref.as_ref().unwrap();
    assert_eq!(r.kind.as_deref(), Some("PersistentVolumeClaim"));
    assert_eq!(r.api_version.as_deref(), Some("v1"));
    assert_eq!(r.namespace.as_deref(), Some(NS));
    assert_eq!(r.name.as_deref(), Some("data"));
    assert_eq!(r.uid, claim.metadata.uid);
    assert!(r.resource_version.is_some());
    assert_eq!(
        annotation(&pv, "pv.kubernetes.io/bound-by-controller").as_deref(),
        Some("yes")
    );
    assert!(
        pv.status
            .as_ref()
            .unwrap()
            .last_phase_transition_time
            .is_some()
    );
    assert!(
        pv.metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == "kubernetes.io/pv-protection")
    );

    // The others stay Available.
    for name in ["big", "small", "rwx", "gold", "block"] {
        env.wait_pv_phase(name, "Available").await;
    }
    // Class, access modes, volume mode and selector each pick their own volume.
    env.create_pvc("golden", "1Gi", RWO, Some("gold")).await;
    env.create_pvc("shared", "1Gi", &["ReadWriteMany"], None)
        .await;
    let mut raw = pvc_json("raw", "1Gi", RWO, None);
    raw["spec"]["volumeMode"] = json!("Block");
    env.create_pvc_json(raw).await;
    let mut picky = pvc_json("picky", "1Gi", RWO, None);
    picky["spec"]["selector"] = json!({"matchExpressions": [
        {"key": "tier", "operator": "In", "values": ["gold"]}
    ], "matchLabels": {"size": "small"}});
    env.create_pvc_json(picky).await;
    for (claim, volume) in [("golden", "gold"), ("shared", "rwx"), ("raw", "block")] {
        let pvc = env.wait_pvc_phase(claim, "Bound").await;
        assert_eq!(
            pvc.spec.unwrap().volume_name.as_deref(),
            Some(volume),
            "{claim}"
        );
    }
    // No volume has the label size=small: picky stays Pending, with the no-class Event.
    let msg = env.wait_event(NS, "picky", "FailedBinding").await;
    assert!(msg.contains("no persistent volumes available"), "{msg}");
    assert_eq!(env.pvc_phase("picky").await.as_deref(), Some("Pending"));
    env.pvs()
        .patch(
            "big",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"labels": {"size": "small"}}})),
        )
        .await
        .unwrap();
    let pvc = env.wait_pvc_phase("picky", "Bound").await;
    assert_eq!(pvc.spec.unwrap().volume_name.as_deref(), Some("big"));
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pre_bound_both_ways() {
    let mut env = Env::new().await;
    env.start(fast_options()).await;
    // A PV pre-bound to a claim by name: the claim gets it although a smaller one fits.
    env.create_pv("other", "1Gi", RWO, "").await;
    let mut reserved = pv_json("reserved", "5Gi", RWO, "");
    reserved["spec"]["claimRef"] = json!({"namespace": NS, "name": "mine"});
    env.create_pv_json(reserved).await;
    // Reserved for a claim that does not exist yet: Available, and nobody else gets it.
    env.wait_pv_phase("reserved", "Available").await;
    env.create_pvc("mine", "1Gi", RWO, None).await;
    let pvc = env.wait_pvc_phase("mine", "Bound").await;
    assert_eq!(
        pvc.spec.as_ref().unwrap().volume_name.as_deref(),
        Some("reserved")
    );
    let pv = env.wait_pv_phase("reserved", "Bound").await;
    assert_eq!(
        pv.spec.clone().unwrap().claim_ref.unwrap().uid,
        pvc.metadata.uid
    );
    // The user wrote the ref: no bound-by-controller on the PV; the controller set the claim's
    // volumeName: bound-by-controller on the claim.
    assert_eq!(
        annotation(&pv, "pv.kubernetes.io/bound-by-controller"),
        None
    );

    // A claim naming its volume (spec.volumeName) binds to exactly that one.
    let mut named = pvc_json("named", "1Gi", RWO, None);
    named["spec"]["volumeName"] = json!("later");
    env.create_pvc_json(named).await;
    env.wait_pvc_phase("named", "Pending").await;
    env.create_pv("later", "3Gi", RWO, "").await;
    let pvc = env.wait_pvc_phase("named", "Bound").await;
    assert_eq!(
        annotation(&pvc, "pv.kubernetes.io/bound-by-controller"),
        None
    );
    assert_eq!(
        annotation(&pvc, "pv.kubernetes.io/bind-completed").as_deref(),
        Some("yes")
    );
    let pv = env.wait_pv_phase("later", "Bound").await;
    assert_eq!(
        annotation(&pv, "pv.kubernetes.io/bound-by-controller").as_deref(),
        Some("yes")
    );
    assert_eq!(env.pv_phase("other").await.as_deref(), Some("Available"));

    // A claim naming a volume too small for it: VolumeMismatch, Pending.
    env.create_pv("tiny", "1Mi", RWO, "").await;
    let mut wants_tiny = pvc_json("wants-tiny", "1Gi", RWO, None);
    wants_tiny["spec"]["volumeName"] = json!("tiny");
    env.create_pvc_json(wants_tiny).await;
    let msg = env.wait_event(NS, "wants-tiny", "VolumeMismatch").await;
    assert!(msg.contains("too small"), "{msg}");
    assert_eq!(
        env.pvc_phase("wants-tiny").await.as_deref(),
        Some("Pending")
    );
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_claims_racing_for_one_volume_one_wins() {
    let mut env = Env::new().await;
    env.create_pv("only", "1Gi", RWO, "").await;
    env.create_pvc("a", "1Gi", RWO, None).await;
    env.create_pvc("b", "1Gi", RWO, None).await;
    env.start(fast_options()).await;
    let winner = test_support::eventually("one claim Bound", PATIENCE, || async {
        let pv = env.pv("only").await?;
        (pv.status.as_ref()?.phase.as_deref() == Some("Bound"))
            .then(|| pv.spec?.claim_ref?.name)
            .flatten()
    })
    .await;
    let loser = if winner == "a" { "b" } else { "a" };
    env.wait_pvc_phase(&winner, "Bound").await;
    // The loser stays Pending through several sync periods and never names the volume.
    for _ in 0..3 {
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        let pvc = env.pvc(loser).await.unwrap();
        assert_eq!(pvc.status.unwrap().phase.as_deref(), Some("Pending"));
        assert_eq!(pvc.spec.unwrap().volume_name, None);
    }
    env.shutdown().await;
}

/// A volume pre-bound to a claim (`claimRef` by name) is still checked against it: one too
/// small is skipped (kcm's findMatchingVolume tests the size before the pre-binding), so the
/// claim stays Pending with the no-volume Event and the volume keeps waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pre_bound_volume_too_small_for_its_claim_is_not_bound() {
    let mut env = Env::new().await;
    let mut reserved = pv_json("reserved-small", "100Mi", RWO, "");
    reserved["spec"]["claimRef"] = json!({"namespace": NS, "name": "big-claim"});
    env.create_pv_json(reserved).await;
    env.start(fast_options()).await;
    env.wait_pv_phase("reserved-small", "Available").await;
    env.create_pvc("big-claim", "1Gi", RWO, None).await;
    let msg = env.wait_event(NS, "big-claim", "FailedBinding").await;
    assert!(msg.contains("no persistent volumes available"), "{msg}");
    for _ in 0..3 {
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        let pvc = env.pvc("big-claim").await.unwrap();
        assert_eq!(pvc.status.unwrap().phase.as_deref(), Some("Pending"));
        assert_eq!(pvc.spec.unwrap().volume_name, None);
        let pv = env.pv("reserved-small").await.unwrap();
        assert_eq!(pv.status.unwrap().phase.as_deref(), Some("Available"));
        assert_eq!(pv.spec.unwrap().claim_ref.unwrap().uid, None);
    }
    env.shutdown().await;
}

/// A volume being deleted (deletionTimestamp set, held by a finalizer) is never bound, not
/// even to a claim that names it: VolumeMismatch, as kcm's checkVolumeSatisfyClaim says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_being_deleted_is_not_bound_to_the_claim_naming_it() {
    let mut env = Env::new().await;
    let mut dying = pv_json("dying", "1Gi", RWO, "");
    dying["metadata"]["finalizers"] = json!(["example.com/hold"]);
    env.create_pv_json(dying).await;
    env.pvs()
        .delete("dying", &kube::api::DeleteParams::default())
        .await
        .unwrap();
    let pv = env.pv("dying").await.unwrap();
    assert!(pv.metadata.deletion_timestamp.is_some());
    env.start(fast_options()).await;
    let mut named = pvc_json("wants-dying", "1Gi", RWO, None);
    named["spec"]["volumeName"] = json!("dying");
    env.create_pvc_json(named).await;
    let msg = env.wait_event(NS, "wants-dying", "VolumeMismatch").await;
    assert_eq!(
        msg,
        "Cannot bind to requested volume \"dying\": the volume is marked for deletion \"dying\""
    );
    for _ in 0..3 {
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        let pvc = env.pvc("wants-dying").await.unwrap();
        assert_eq!(pvc.status.unwrap().phase.as_deref(), Some("Pending"));
        let pv = env.pv("dying").await.unwrap();
        assert_eq!(pv.spec.unwrap().claim_ref, None);
    }
    env.shutdown().await;
}

/// A volume the user pre-bound with the claim's uid, whose claim is bound to another volume:
/// the controller clears only the ref's uid (the ref stays, the volume waits for that claim
/// again) and makes it Available (kcm's syncVolume → unbindVolume without bound-by-controller).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_pre_bound_volume_whose_claim_is_bound_elsewhere_loses_only_the_uid() {
    let mut env = Env::new().await;
    env.start(fast_options()).await;
    let mut named = pvc_json("owner", "1Gi", RWO, None);
    named["spec"]["volumeName"] = json!("chosen");
    env.create_pvc_json(named).await;
    env.create_pv("chosen", "1Gi", RWO, "").await;
    let pvc = env.wait_pvc_phase("owner", "Bound").await;
    let mut stale = pv_json("stale", "1Gi", RWO, "");
    stale["spec"]["claimRef"] = json!({
        "kind": "PersistentVolumeClaim", "apiVersion": "v1",
        "namespace": NS, "name": "owner", "uid": pvc.metadata.uid,
    });
    env.create_pv_json(stale).await;
    let pv = test_support::eventually("stale ref without uid", PATIENCE, || async {
        let pv = env.pv("stale").await?;
        let r = pv.spec.as_ref()?.claim_ref.as_ref()?;
        (r.uid.is_none() && pv.status.as_ref()?.phase.as_deref() == Some("Available")).then_some(pv)
    })
    .await;
    let r = pv.spec.clone().unwrap().claim_ref.unwrap();
    assert_eq!(r.name.as_deref(), Some("owner"));
    assert_eq!(r.namespace.as_deref(), Some(NS));
    assert_eq!(
        annotation(&pv, "pv.kubernetes.io/bound-by-controller"),
        None
    );
    // The claim keeps its volume.
    let pvc = env.pvc("owner").await.unwrap();
    assert_eq!(pvc.spec.unwrap().volume_name.as_deref(), Some("chosen"));
    env.shutdown().await;
}

/// `status.capacity` is written when the claim becomes Bound and left alone afterwards: while
/// an expansion waits for the node (the PV already grown, the claim's capacity not yet), a
/// resync must not copy the PV's new size, or the kubelet never grows the filesystem.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bound_claims_capacity_is_not_overwritten_during_an_expansion() {
    let mut env = Env::new().await;
    env.create_pv("grows", "2Gi", RWO, "").await;
    env.start(fast_options()).await;
    env.create_pvc("expanding", "1Gi", RWO, None).await;
    let pvc = env.wait_pvc_phase("expanding", "Bound").await;
    assert_eq!(
        pvc.status.as_ref().unwrap().capacity.as_ref().unwrap()["storage"].0,
        "2Gi"
    );
    env.wait_pv_phase("grows", "Bound").await;
    // What a resizer does: the request and the PV grow; the claim's status says the node
    // part is pending.
    let pp = kube::api::PatchParams::default();
    env.pvcs()
        .patch(
            "expanding",
            &pp,
            &kube::api::Patch::Merge(
                json!({"spec": {"resources": {"requests": {"storage": "4Gi"}}}}),
            ),
        )
        .await
        .unwrap();
    env.pvs()
        .patch(
            "grows",
            &pp,
            &kube::api::Patch::Merge(json!({"spec": {"capacity": {"storage": "4Gi"}}})),
        )
        .await
        .unwrap();
    env.pvcs()
        .patch_status(
            "expanding",
            &pp,
            &kube::api::Patch::Merge(json!({"status": {
                "allocatedResources": {"storage": "4Gi"},
                "conditions": [{"type": "FileSystemResizePending", "status": "True"}],
            }})),
        )
        .await
        .unwrap();
    // Several sync periods (1 s each): the capacity stays what the node has.
    for _ in 0..4 {
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        let pvc = env.pvc("expanding").await.unwrap();
        let status = pvc.status.unwrap();
        assert_eq!(status.phase.as_deref(), Some("Bound"));
        assert_eq!(status.capacity.unwrap()["storage"].0, "2Gi");
        assert_eq!(status.allocated_resources.unwrap()["storage"].0, "4Gi");
    }
    env.shutdown().await;
}
