//! After binding: reclaim (Retain, Delete by an external provisioner, Recycle), the pvc- and
//! pv-protection finalizers, a malformed object, a restart halfway.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;
use test_support::objects::create_json;

use common::{Env, NS, PATIENCE, annotation, fast_options, pv_json, pvc_json};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;

const RWO: &[&str] = &["ReadWriteOnce"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_volumes_are_reclaimed_by_policy() {
    let mut env = Env::new().await;
    env.start(fast_options()).await;
    // Retain.
    env.create_pv("kept", "1Gi", RWO, "").await;
    env.create_pvc("a", "1Gi", RWO, None).await;
    env.wait_pvc_phase("a", "Bound").await;
    env.delete_pvc("a").await;
    let pv = env.wait_pv_phase("kept", "Released").await;
    // The ref stays (the data belongs to that claim until an admin says otherwise).
    assert_eq!(
        pv.spec.unwrap().claim_ref.unwrap().name.as_deref(),
        Some("a")
    );
    assert!(env.pvc("a").await.is_none());

    // Delete, provisioned by an external provisioner: Released and left to it.
    let mut ext = pv_json("external", "1Gi", RWO, "fast");
    ext["spec"]["persistentVolumeReclaimPolicy"] = json!("Delete");
    ext["metadata"]["annotations"] =
        json!({"pv.kubernetes.io/provisioned-by": "hostpath.csi.k8s.io"});
    env.create_pv_json(ext).await;
    env.create_pvc("b", "1Gi", RWO, Some("fast")).await;
    env.wait_pvc_phase("b", "Bound").await;
    env.delete_pvc("b").await;
    env.wait_pv_phase("external", "Released").await;
    // Still there a few sync periods later, with no Failed phase and no delete Event.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(env.pv_phase("external").await.as_deref(), Some("Released"));
    assert!(
        env.events("default", "external", "VolumeFailedDelete")
            .await
            .is_empty()
    );

    // Delete, but no plugin can delete a hostPath volume here: Failed, with the Event.
    let mut nobody = pv_json("nobody", "1Gi", RWO, "x");
    nobody["spec"]["persistentVolumeReclaimPolicy"] = json!("Delete");
    env.create_pv_json(nobody).await;
    env.create_pvc("c", "1Gi", RWO, Some("x")).await;
    env.wait_pvc_phase("c", "Bound").await;
    env.delete_pvc("c").await;
    env.wait_pv_phase("nobody", "Failed").await;
    let msg = env
        .wait_event("default", "nobody", "VolumeFailedDelete")
        .await;
    assert!(msg.contains("no deletable volume plugin matched"), "{msg}");

    // Delete, made by the in-tree aws-ebs plugin, not migrated, no cloud: the in-tree deleter
    // is tried and says what is missing; the volume is Failed and kept.
    let mut ebs = pv_json("ebs", "1Gi", RWO, "legacy");
    ebs["spec"].as_object_mut().unwrap().remove("hostPath");
    ebs["spec"]["awsElasticBlockStore"] =
        json!({"volumeID": "aws://us-east-1a/vol-0123456789abcdef0", "fsType": "ext4"});
    ebs["spec"]["persistentVolumeReclaimPolicy"] = json!("Delete");
    ebs["metadata"]["annotations"] =
        json!({"pv.kubernetes.io/provisioned-by": "kubernetes.io/aws-ebs"});
    env.create_pv_json(ebs).await;
    env.create_pvc("e", "1Gi", RWO, Some("legacy")).await;
    env.wait_pvc_phase("e", "Bound").await;
    env.delete_pvc("e").await;
    let msg = env.wait_event("default", "ebs", "VolumeFailedDelete").await;
    assert!(msg.contains("--cloud-provider=aws"), "{msg}");
    let pv = env.wait_pv_phase("ebs", "Failed").await;
    assert!(pv.metadata.deletion_timestamp.is_none());

    // Recycle: refused.
    let mut recycle = pv_json("recycled", "1Gi", RWO, "y");
    recycle["spec"]["persistentVolumeReclaimPolicy"] = json!("Recycle");
    env.create_pv_json(recycle).await;
    env.create_pvc("d", "1Gi", RWO, Some("y")).await;
    env.wait_pvc_phase("d", "Bound").await;
    env.delete_pvc("d").await;
    env.wait_pv_phase("recycled", "Failed").await;
    env.wait_event("default", "recycled", "VolumeFailedRecycle")
        .await;
    env.shutdown().await;
}

fn pod(name: &str, claim: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "nodeName": "node-1",
            "containers": [{"name": "c", "image": "busybox",
                            "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protection_finalizers_hold_what_is_in_use() {
    let mut env = Env::new().await;
    env.start(fast_options()).await;
    env.create_pv("vol", "1Gi", RWO, "").await;
    env.create_pvc("used", "1Gi", RWO, None).await;
    env.wait_pvc_phase("used", "Bound").await;
    let pods: Api<Pod> = Api::namespaced(env.kube.clone(), NS);
    create_json(pods.clone(), pod("app", "used")).await;

    // Another controller's finalizer on the claim survives ours coming and going.
    env.pvcs()
        .patch(
            "used",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["kubernetes.io/pvc-protection", "example.com/keep"]}})),
        )
        .await
        .unwrap();
    env.delete_pvc("used").await;
    // Deleted while a running pod uses it: it stays, Bound, finalizer in place.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pvc = env
        .pvc("used")
        .await
        .expect("claim kept while the pod uses it");
    assert!(pvc.metadata.deletion_timestamp.is_some());
    let finalizers = pvc.metadata.finalizers.clone().unwrap_or_default();
    assert!(
        finalizers.contains(&"kubernetes.io/pvc-protection".to_string()),
        "{finalizers:?}"
    );
    // The PV cannot go while Bound either.
    env.pvs()
        .delete("vol", &DeleteParams::default())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let pv = env.pv("vol").await.expect("bound volume kept");
    assert!(pv.metadata.deletion_timestamp.is_some());
    assert_eq!(pv.status.unwrap().phase.as_deref(), Some("Bound"));

    // The pod goes (the kubelet's confirmation: grace period 0).
    pods.delete(
        "app",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    test_support::eventually(
        "our finalizer removed, the other kept",
        PATIENCE,
        || async {
            let f = env
                .pvc("used")
                .await?
                .metadata
                .finalizers
                .unwrap_or_default();
            (f == vec!["example.com/keep".to_string()]).then_some(())
        },
    )
    .await;
    env.pvcs()
        .patch(
            "used",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    test_support::eventually("claim gone", PATIENCE, || async {
        env.pvc("used").await.is_none().then_some(())
    })
    .await;
    // Its volume is Released, no longer protected, and goes.
    test_support::eventually("volume gone", PATIENCE, || async {
        env.pv("vol").await.is_none().then_some(())
    })
    .await;

    // A claim no pod uses goes at once; an unscheduled pod does not hold it (kcm's rule).
    env.create_pvc("idle", "1Gi", RWO, Some("none")).await;
    test_support::eventually("finalizer added", PATIENCE, || async {
        env.pvc("idle")
            .await?
            .metadata
            .finalizers?
            .contains(&"kubernetes.io/pvc-protection".to_string())
            .then_some(())
    })
    .await;
    let mut unscheduled = pod("pending", "idle");
    unscheduled["spec"]
        .as_object_mut()
        .unwrap()
        .remove("nodeName");
    create_json(pods.clone(), unscheduled).await;
    env.delete_pvc("idle").await;
    test_support::eventually("idle claim gone", PATIENCE, || async {
        env.pvc("idle").await.is_none().then_some(())
    })
    .await;
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_claim_gets_an_event_and_the_rest_goes_on() {
    let mut env = Env::new().await;
    env.create_pv("good", "1Gi", RWO, "").await;
    env.create_pv("more", "1Gi", RWO, "").await;
    env.start(fast_options()).await;
    // A selector operator that does not exist (a real API server refuses it; apiserver-lite
    // may keep it): a Warning on the claim, backoff, and nothing else stops.
    let mut bad = pvc_json("bad", "1Gi", RWO, None);
    bad["spec"]["selector"] =
        json!({"matchExpressions": [{"key": "tier", "operator": "Near", "values": ["x"]}]});
    let accepted = env
        .pvcs()
        .create(&Default::default(), &serde_json::from_value(bad).unwrap())
        .await
        .is_ok();
    if accepted {
        let msg = env.wait_event(NS, "bad", "FailedBinding").await;
        assert!(msg.contains("Near"), "{msg}");
    }
    // A class of the in-tree plugin with a parameter it does not know: ProvisioningFailed
    // naming it (checked before anything asks for a cloud).
    env.create_class(
        "broken",
        "kubernetes.io/aws-ebs",
        "Immediate",
        json!({"bogus": "1"}),
    )
    .await;
    env.create_pvc("broken-params", "1Gi", RWO, Some("broken"))
        .await;
    // (The class may reach the controller's cache after the claim: "not found" first.)
    env.wait_event_containing(
        NS,
        "broken-params",
        "ProvisioningFailed",
        "invalid option \"bogus\"",
    )
    .await;
    env.create_pvc("fine", "1Gi", RWO, None).await;
    env.wait_pvc_phase("fine", "Bound").await;
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_halfway_converges() {
    let mut env = Env::new().await;
    // A crash after the PV's claimRef was written, before anything else: the state kcm's write
    // order leaves behind.
    let claim = env.create_pvc("half", "1Gi", RWO, None).await;
    let mut v = pv_json("half-pv", "1Gi", RWO, "");
    v["spec"]["claimRef"] = json!({
        "kind": "PersistentVolumeClaim", "apiVersion": "v1",
        "namespace": NS, "name": "half", "uid": claim.metadata.uid,
    });
    v["metadata"]["annotations"] = json!({"pv.kubernetes.io/bound-by-controller": "yes"});
    env.create_pv_json(v).await;
    // And a claim whose own side was written but not its status.
    env.create_pv("other-pv", "2Gi", RWO, "").await;
    let mut done = pvc_json("done", "2Gi", RWO, None);
    done["spec"]["volumeName"] = json!("other-pv");
    done["metadata"]["annotations"] = json!({"pv.kubernetes.io/bind-completed": "yes", "pv.kubernetes.io/bound-by-controller": "yes"});
    env.create_pvc_json(done).await;

    env.start(fast_options()).await;
    env.wait_pvc_phase("half", "Bound").await;
    env.wait_pvc_phase("done", "Bound").await;
    env.wait_pv_phase("half-pv", "Bound").await;
    let pv = env.wait_pv_phase("other-pv", "Bound").await;
    assert_eq!(
        pv.spec.unwrap().claim_ref.unwrap().name.as_deref(),
        Some("done")
    );

    // Stop, change the world, start again: the new claims bind, the deleted one releases.
    env.stop().await;
    env.create_pv("after", "1Gi", RWO, "").await;
    env.create_pvc("new", "1Gi", RWO, None).await;
    env.delete_pvc("half").await;
    env.start(fast_options()).await;
    let pvc = env.wait_pvc_phase("new", "Bound").await;
    assert_eq!(pvc.spec.unwrap().volume_name.as_deref(), Some("after"));
    test_support::eventually(
        "half's claim gone after its finalizer",
        PATIENCE,
        || async { env.pvc("half").await.is_none().then_some(()) },
    )
    .await;
    env.wait_pv_phase("half-pv", "Released").await;
    assert_eq!(
        annotation(
            &env.pvc("done").await.unwrap(),
            "pv.kubernetes.io/bind-completed"
        )
        .as_deref(),
        Some("yes")
    );
    env.shutdown().await;
}
