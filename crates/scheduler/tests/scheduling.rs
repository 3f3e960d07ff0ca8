//! The scheduler against apiserver-lite: where pods go, what FailedScheduling says, and the
//! WaitForFirstConsumer hand-off (the test plays the provisioner and the PV controller).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Env, PATIENCE, fit_error};
use kube::api::{Patch, PatchParams};
use serde_json::json;
use test_support::objects::create_json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_selector_affinity_and_fewest_pods() {
    let env = Env::new().await;
    env.node("node-1", json!({"zone": "a"})).await;
    env.node("node-2", json!({"zone": "b"})).await;
    env.node("node-3", json!({"zone": "b"})).await;

    env.pod("selected", &[], json!({"nodeSelector": {"zone": "a"}}))
        .await;
    assert_eq!(env.wait_bound("selected").await, "node-1");
    let scheduled = env.events("selected", "Scheduled").await;
    assert_eq!(
        scheduled[0].message.as_deref(),
        Some("Successfully assigned default/selected to node-1")
    );
    assert_eq!(
        scheduled[0].source.as_ref().unwrap().component.as_deref(),
        Some("default-scheduler")
    );

    let not_a = json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}]}}}});
    env.pod("b-1", &[], not_a.clone()).await;
    // node-2 and node-3 are both empty: the first name wins.
    assert_eq!(env.wait_bound("b-1").await, "node-2");
    env.pod("b-2", &[], not_a.clone()).await;
    // node-2 has a pod now: the one with fewer pods.
    assert_eq!(env.wait_bound("b-2").await, "node-3");

    // Another scheduler's pod is left alone; ours after it is bound, so the pass saw it.
    env.pod("other", &[], json!({"schedulerName": "someone-else"}))
        .await;
    env.pod("after", &[], json!({})).await;
    env.wait_bound("after").await;
    assert_eq!(env.node_of("other").await, None);

    // No node matches: kube-scheduler's message, counted per node.
    env.pod("zone-c", &[], json!({"nodeSelector": {"zone": "c"}}))
        .await;
    env.wait_failed(
        "zone-c",
        &fit_error(3, &["3 node(s) didn't match Pod's node affinity/selector"]),
    )
    .await;
    // A node that matches appears: the pod is tried again and bound.
    env.node("node-4", json!({"zone": "c"})).await;
    assert_eq!(env.wait_bound("zone-c").await, "node-4");
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unschedulable_and_not_ready_nodes_are_filtered_with_reasons() {
    let env = Env::new().await;
    env.node("cordoned", json!({})).await;
    env.nodes()
        .patch(
            "cordoned",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"unschedulable": true}})),
        )
        .await
        .unwrap();
    create_json(
        env.nodes(),
        json!({"metadata": {"name": "not-ready"}, "status": {"conditions": [{"type": "Ready", "status": "False"}]}}),
    )
    .await;
    env.node("other-zone", json!({"zone": "x"})).await;

    env.pod("web", &[], json!({"nodeSelector": {"zone": "y"}}))
        .await;
    env.wait_failed(
        "web",
        &fit_error(
            3,
            &[
                "1 node(s) didn't match Pod's node affinity/selector",
                "1 node(s) had untolerated taint {node.kubernetes.io/not-ready: }",
                "1 node(s) were unschedulable",
            ],
        ),
    )
    .await;
    assert_eq!(env.node_of("web").await, None);
    // Uncordoning the node (and giving it the zone) lets the pod in.
    env.nodes()
        .patch(
            "cordoned",
            &PatchParams::default(),
            &Patch::Merge(
                &json!({"metadata": {"labels": {"zone": "y"}}, "spec": {"unschedulable": false}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(env.wait_bound("web").await, "cordoned");
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_missing_unbound_immediate_and_bound_volume_affinity() {
    let env = Env::new().await;
    env.node("node-1", json!({})).await;
    env.node("node-2", json!({})).await;
    env.class("immediate", "Immediate", &[]).await;

    env.pod("app", &["data"], json!({})).await;
    env.wait_failed(
        "app",
        "0/2 nodes are available: persistentvolumeclaim \"data\" not found. preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling.",
    )
    .await;
    env.claim("data", "immediate", "ReadWriteOnce").await;
    env.wait_failed(
        "app",
        "0/2 nodes are available: pod has unbound immediate PersistentVolumeClaims. preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling.",
    )
    .await;
    assert_eq!(env.node_of("app").await, None);
    // Bound to a volume that only node-2 reaches (hostpath-style topology): node-2, although
    // node-1 comes first by name.
    env.bind_claim("data", "immediate", Some("node-2")).await;
    assert_eq!(env.wait_bound("app").await, "node-2");

    // A volume pinned to a cordoned node: "volume node affinity conflict" on the others.
    env.claim("pinned", "immediate", "ReadWriteOnce").await;
    env.bind_claim("pinned", "immediate", Some("node-1")).await;
    env.nodes()
        .patch(
            "node-1",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"unschedulable": true}})),
        )
        .await
        .unwrap();
    env.pod("pinned-user", &["pinned"], json!({})).await;
    env.wait_failed(
        "pinned-user",
        &fit_error(
            2,
            &[
                "1 node(s) had volume node affinity conflict",
                "1 node(s) were unschedulable",
            ],
        ),
    )
    .await;

    // ReadWriteOncePod: a second pod of the claim is refused while the first exists.
    env.claim("solo", "immediate", "ReadWriteOncePod").await;
    env.bind_claim("solo", "immediate", None).await;
    env.pod("solo-1", &["solo"], json!({})).await;
    env.wait_bound("solo-1").await;
    env.pod("solo-2", &["solo"], json!({})).await;
    env.wait_failed(
        "solo-2",
        "0/2 nodes are available: node has pod using PersistentVolumeClaim with the same name and ReadWriteOncePod access mode. preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling.",
    )
    .await;
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_first_consumer_selects_a_node_and_binds_after_the_claim() {
    let env = Env::new().await;
    env.node("node-1", json!({})).await;
    env.node("node-2", json!({})).await;
    env.node("node-3", json!({})).await;
    // node-1 is not among the class's topologies.
    env.class("wffc", "WaitForFirstConsumer", &["node-2", "node-3"])
        .await;
    env.claim("data", "wffc", "ReadWriteOnce").await;
    env.pod("app", &["data"], json!({})).await;

    let claims = env.claims();
    let selected = test_support::eventually("selected-node on the claim", PATIENCE, || {
        let claims = claims.clone();
        async move {
            let c = claims.get("data").await.ok()?;
            c.metadata
                .annotations?
                .get(scheduler::ANN_SELECTED_NODE)
                .cloned()
        }
    })
    .await;
    assert_eq!(selected, "node-2");
    // Not bound before the claim is.
    assert_eq!(env.node_of("app").await, None);
    env.bind_claim("data", "wffc", Some("node-2")).await;
    assert_eq!(env.wait_bound("app").await, "node-2");

    // No allowed topology fits: the provisioning reason.
    env.class("nowhere", "WaitForFirstConsumer", &["node-9"])
        .await;
    env.claim("lost", "nowhere", "ReadWriteOnce").await;
    env.pod("lost-user", &["lost"], json!({})).await;
    env.wait_failed(
        "lost-user",
        &fit_error(
            3,
            &["3 node(s) didn't find available persistent volumes to bind"],
        ),
    )
    .await;
    let lost = env.claims().get("lost").await.unwrap();
    assert!(
        !lost
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key(scheduler::ANN_SELECTED_NODE)
    );
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csinode_attach_limit() {
    let env = Env::new().await;
    env.node("node-1", json!({})).await;
    env.csinode("node-1", 2).await;
    env.class("immediate", "Immediate", &[]).await;
    for i in 1..=3 {
        let claim = format!("vol-{i}");
        env.claim(&claim, "immediate", "ReadWriteOnce").await;
        env.bind_claim(&claim, "immediate", None).await;
    }
    env.pod("p1", &["vol-1"], json!({})).await;
    assert_eq!(env.wait_bound("p1").await, "node-1");
    env.pod("p2", &["vol-2"], json!({})).await;
    assert_eq!(env.wait_bound("p2").await, "node-1");
    env.pod("p3", &["vol-3"], json!({})).await;
    env.wait_failed("p3", &fit_error(1, &["1 node(s) exceed max volume count"]))
        .await;
    // A volume already on the node is not counted again.
    env.pod("p1-twin", &["vol-1"], json!({})).await;
    assert_eq!(env.wait_bound("p1-twin").await, "node-1");
    assert_eq!(env.node_of("p3").await, None);
    // Another node with room: the third volume goes there.
    env.node("node-2", json!({})).await;
    env.csinode("node-2", 2).await;
    assert_eq!(env.wait_bound("p3").await, "node-2");
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_given_back_by_the_provisioner_is_chosen_again() {
    let env = Env::new().await;
    env.node("node-1", json!({})).await;
    env.class("wffc", "WaitForFirstConsumer", &[]).await;
    env.claim("data", "wffc", "ReadWriteOnce").await;
    env.pod("app", &["data"], json!({})).await;
    let claims = env.claims();
    let selected = || {
        let claims = claims.clone();
        async move {
            let c = claims.get("data").await.ok()?;
            c.metadata
                .annotations?
                .get(scheduler::ANN_SELECTED_NODE)
                .cloned()
        }
    };
    test_support::eventually("selected-node on the claim", PATIENCE, selected).await;
    // The provisioner's reschedule: it removes the annotation.
    env.claims()
        .patch(
            "data",
            &PatchParams::default(),
            &Patch::Merge(
                &json!({"metadata": {"annotations": {scheduler::ANN_SELECTED_NODE: null}}}),
            ),
        )
        .await
        .unwrap();
    env.wait_failed(
        "app",
        "running PreBind plugin \"VolumeBinding\": binding volumes: claim default/data was given back by its provisioner (volume.kubernetes.io/selected-node no longer node-1): volume provisioning on that node failed",
    )
    .await;
    // Tried again: the node is selected anew, and the pod binds once the claim is bound.
    assert_eq!(
        test_support::eventually("selected-node written again", PATIENCE, selected).await,
        "node-1"
    );
    env.bind_claim("data", "wffc", Some("node-1")).await;
    assert_eq!(env.wait_bound("app").await, "node-1");
    env.shutdown().await;
}

/// A generic ephemeral volume is the claim `<pod>-<volume>`: the pod waits for it, a claim of
/// that name the pod does not control is refused, and the pod's own claim goes through the
/// WaitForFirstConsumer hand-off like any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generic_ephemeral_volume_is_its_claim() {
    let env = Env::new().await;
    env.node("node-1", json!({})).await;
    env.node("node-2", json!({})).await;
    env.class("wffc", "WaitForFirstConsumer", &["node-2"]).await;
    let template = json!({"spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "wffc",
        "resources": {"requests": {"storage": "1Gi"}}}});
    let eph =
        json!({"volumes": [{"name": "scratch", "ephemeral": {"volumeClaimTemplate": template}}]});
    let pod = env.pod("eph", &[], eph.clone()).await;
    env.wait_failed(
        "eph",
        "0/2 nodes are available: persistentvolumeclaim \"eph-scratch\" not found. preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling.",
    )
    .await;
    // Someone else's claim of the name.
    env.claim("other-scratch", "wffc", "ReadWriteOnce").await;
    env.pod("other", &[], eph).await;
    env.wait_failed(
        "other",
        "0/2 nodes are available: PVC default/other-scratch was not created for pod default/other (pod is not owner). preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling.",
    )
    .await;
    // The pod's own claim (what the ephemeral volume controller makes).
    create_json(
        env.claims(),
        json!({"metadata": {"name": "eph-scratch", "ownerReferences": [{"apiVersion": "v1",
            "kind": "Pod", "name": "eph", "uid": pod.metadata.uid, "controller": true,
            "blockOwnerDeletion": true}]}, "spec": template["spec"]}),
    )
    .await;
    let claims = env.claims();
    let selected = test_support::eventually("selected-node on eph-scratch", PATIENCE, || {
        let claims = claims.clone();
        async move {
            let c = claims.get("eph-scratch").await.ok()?;
            c.metadata
                .annotations?
                .get(scheduler::ANN_SELECTED_NODE)
                .cloned()
        }
    })
    .await;
    assert_eq!(selected, "node-2");
    env.bind_claim("eph-scratch", "wffc", Some("node-2")).await;
    assert_eq!(env.wait_bound("eph").await, "node-2");
    assert_eq!(env.node_of("other").await, None);
    env.shutdown().await;
}
