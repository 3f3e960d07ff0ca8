//! The node agent never lets a volume go while it is in use, and never starts a pod without
//! its volume (storage safety), with the real hostpath driver, our registrar, attach/detach
//! controller, csi-attacher and node agent over apiserver-lite, real bind mounts:
//! - what a failed mount leaves behind (a stage before a failed publish, an uncertain stage)
//!   and a stage still in flight stay in `node.status.volumesInUse`, is never detached while there, and is torn down
//!   once the pod goes;
//! - a running pod's volume stays published when the agent restarts and its claim cannot be
//!   resolved any more, until the pod goes;
//! - a generic ephemeral volume is mounted from the pod's own claim before the pod is Ready;
//! - node status posts keep the conditions other components write.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use test_support::objects::create_json;

use common::{DRIVER, Env, NS, PATIENCE, is_mounted};
use kube::Api;
use serde_json::json;
use volume_plugins::SkipAttachMode;
use volume_plugins::names::csi_unique_volume_name;

/// Mount points under `dir` (the driver's staging dirs).
async fn mounts_below(dir: &Path) -> Vec<String> {
    let table = mount_utils::findmnt::read().await.unwrap();
    let root = mount_utils::findmnt::canonical(dir);
    table
        .iter()
        .filter(|e| e.mount_point.starts_with(&root))
        .map(|e| e.mount_point.display().to_string())
        .collect()
}

/// The hostpath driver's staging dirs on node `n`.
fn staging_root(env: &Env, n: usize) -> std::path::PathBuf {
    env.nodes[n]
        .root
        .join("plugins/kubernetes.io/csi")
        .join(DRIVER)
}

/// Node `node-a` with a fault proxy in front of its hostpath driver (the plan), the
/// attach/detach controller (through the ADC), csi-attacher and the agent running, `claim-1`
/// bound to `pv-1`, and the driver registered: the node index, the plan and the volume's
/// unique name.
async fn faulty_node_with_claim() -> (Env, usize, csi_spec::faults::FaultPlan, String) {
    let mut env = Env::new().await;
    env.create_csidriver(true).await;
    let (n, plan) = env.add_faulty_node("node-a").await;
    let unique = start_with_claim(&mut env, n).await;
    (env, n, plan, unique)
}

/// On node `n` (`node-a`): the attach/detach controller (through the ADC), csi-attacher and
/// the agent started, `claim-1` bound to `pv-1`, and the driver registered (NodeGetInfo
/// answered); the volume's unique name.
async fn start_with_claim(env: &mut Env, n: usize) -> String {
    env.start_adc(SkipAttachMode::ThroughAdc);
    env.start_attacher().await;
    let options = env.agent_options(n, SkipAttachMode::ThroughAdc);
    env.start_agent(n, options);
    let handle = env.create_bound_claim(n, "pv-1", "claim-1", false).await;
    env.wait_registered("node-a").await;
    csi_unique_volume_name(DRIVER, &handle)
}

/// The publish secret does not exist: NodeStage succeeds, NodePublish cannot start. Deleting
/// the pod must unstage the volume, and the attach/detach controller must not detach it before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_publish_keeps_the_stage_in_use_and_unstages_it_when_the_pod_goes() {
    if !common::can_mount() {
        return;
    }
    let mut env = Env::new().await;
    env.create_csidriver(true).await;
    let n = env.add_node("node-a").await;
    env.start_adc(SkipAttachMode::ThroughAdc);
    env.start_attacher().await;
    let options = env.agent_options(n, SkipAttachMode::ThroughAdc);
    env.start_agent(n, options);
    let handle = env
        .create_bound_claim_with(
            n,
            "pv-1",
            "claim-1",
            false,
            json!({"nodePublishSecretRef": {"name": "absent-secret", "namespace": NS}}),
        )
        .await;
    let unique = csi_unique_volume_name(DRIVER, &handle);
    env.create_pod("pod-1", "node-a", "claim-1").await;

    let message = env
        .event_message(Some("FailedMount"), "MountVolume.SetUp failed")
        .await;
    assert!(message.contains("absent-secret"), "{message}");
    let staging_root = staging_root(&env, n);
    let staged = mounts_below(&staging_root).await;
    assert_eq!(staged.len(), 1, "NodeStage went through: {staged:?}");
    let (in_use, attached) = env.node_volumes("node-a").await;
    assert!(in_use.contains(&unique) && attached.contains(&unique));
    let pod = env.pods().get("pod-1").await.unwrap();
    let ready = pod
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    assert!(!ready, "a pod without its volume is not Ready");

    // The pod goes. Until the stage is gone the volume stays in use and attached; then it is
    // unstaged, leaves volumesInUse and is detached.
    env.pods()
        .delete("pod-1", &Default::default())
        .await
        .unwrap();
    let staging = Path::new(&staged[0]).to_path_buf();
    let mut samples = 0;
    test_support::eventually("unstaged, out of volumesInUse, detached", PATIENCE, || {
        let (env, staging, unique) = (&env, &staging, &unique);
        samples += 1;
        async move {
            let still_staged = is_mounted(staging).await;
            let (in_use, attached) = env.node_volumes("node-a").await;
            if still_staged {
                assert!(
                    in_use.contains(unique) && attached.contains(unique),
                    "{unique} left volumesInUse ({in_use:?}) or volumesAttached ({attached:?}) while {} is mounted",
                    staging.display()
                );
                return None;
            }
            (!in_use.contains(unique) && !attached.contains(unique)).then_some(())
        }
    })
    .await;
    println!("{samples} samples until unstaged and detached; never detached while staged");
    assert!(mounts_below(&staging_root).await.is_empty());
    env.shutdown().await;
}

/// The driver stages the volume and then answers a final error (Internal: a driver that
/// mounted, failed a later step and did not unmount; here a fault proxy drops its success).
/// The kubelet would believe the code and forget the mount, so the volume would leave
/// volumesInUse while mounted and could be detached under it. The agent sees the mount: the
/// stage is uncertain, stays in use and attached, and is unstaged when the pod goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_final_error_after_the_driver_staged_keeps_the_stage_in_use() {
    if !common::can_mount() {
        return;
    }
    let (env, n, plan, unique) = faulty_node_with_claim().await;
    // Every NodeStage fails after the driver staged, until the rule is cleared.
    plan.add(csi_spec::faults::Fault {
        method: "NodeStageVolume".into(),
        code: tonic::Code::Internal,
        when: csi_spec::faults::When::After,
        count: 1000,
    });
    env.create_pod("pod-1", "node-a", "claim-1").await;
    let message = env
        .event_message(Some("FailedMount"), "MountVolume.MountDevice failed")
        .await;
    assert!(
        message.contains("fault injected after NodeStageVolume"),
        "{message}"
    );
    let staging_root = staging_root(&env, n);
    let staged = mounts_below(&staging_root).await;
    assert_eq!(staged.len(), 1, "the driver staged: {staged:?}");

    // The pod goes while the stage is still there. Until it is unstaged the volume must stay
    // in volumesInUse and attached; then it is unstaged (NodeUnstage works) and released.
    plan.clear();
    env.pods()
        .delete("pod-1", &Default::default())
        .await
        .unwrap();
    let staging = Path::new(&staged[0]).to_path_buf();
    test_support::eventually("unstaged, out of volumesInUse, detached", PATIENCE, || {
        let (env, staging, unique) = (&env, &staging, &unique);
        async move {
            let still_staged = is_mounted(staging).await;
            let (in_use, attached) = env.node_volumes("node-a").await;
            if still_staged {
                assert!(
                    in_use.contains(unique) && attached.contains(unique),
                    "{unique} left volumesInUse or volumesAttached while staged"
                );
                return None;
            }
            (!in_use.contains(unique) && !attached.contains(unique)).then_some(())
        }
    })
    .await;
    assert!(mounts_below(&staging_root).await.is_empty());
    env.shutdown().await;
}

/// The pod goes while its NodeStage is still running (a slow driver): the operation in flight
/// may be mounting right now, so the volume stays in volumesInUse and attached until it is done
/// and unstaged. Before c888e7f the volume left volumesInUse the moment the pod went (it was
/// neither wanted nor staged yet) and the attach/detach controller detached it under the stage
/// the driver was making (found by `csi-cluster chaos`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_whose_stage_is_in_flight_stays_in_use_when_its_pod_goes() {
    if !common::can_mount() {
        return;
    }
    let (env, n, plan, unique) = faulty_node_with_claim().await;
    let slow = std::time::Duration::from_secs(4);
    plan.set_delay("NodeStageVolume", slow);
    env.create_pod("pod-1", "node-a", "claim-1").await;
    test_support::eventually("NodeStage in flight", PATIENCE, || async {
        (plan.calls_of("NodeStageVolume") > 0).then_some(())
    })
    .await;
    let started = std::time::Instant::now();
    env.pods()
        .delete("pod-1", &Default::default())
        .await
        .unwrap();
    plan.set_delay("NodeStageVolume", std::time::Duration::ZERO);

    // While the call is held by the proxy and until the stage it makes is undone, the volume
    // must be in use and attached.
    let staging_root = staging_root(&env, n);
    let mut in_flight_samples = 0;
    let saw_staged = std::cell::Cell::new(false);
    test_support::eventually("unstaged, out of volumesInUse, detached", PATIENCE, || {
        let (env, staging_root, unique) = (&env, &staging_root, &unique);
        let in_flight = started.elapsed() < slow;
        in_flight_samples += usize::from(in_flight);
        let saw = &saw_staged;
        async move {
            let staged = !mounts_below(staging_root).await.is_empty();
            saw.set(saw.get() || staged);
            let (in_use, attached) = env.node_volumes("node-a").await;
            if in_flight || staged {
                assert!(
                    in_use.contains(unique) && attached.contains(unique),
                    "{unique} left volumesInUse ({in_use:?}) or volumesAttached ({attached:?}) \
                     while NodeStage was in flight or its stage mounted"
                );
                return None;
            }
            (!in_use.contains(unique) && !attached.contains(unique)).then_some(())
        }
    })
    .await;
    println!(
        "{in_flight_samples} samples while NodeStage was held; stage seen: {}",
        saw_staged.get()
    );
    assert!(in_flight_samples >= 5, "sampled while in flight");
    assert!(mounts_below(&staging_root).await.is_empty());
    env.shutdown().await;
}

/// NodeStage fails with Unavailable (the driver is down): the driver may or may not have
/// staged, so the stage is uncertain, not absent. The pod goes: the volume stays in
/// volumesInUse and attached until the driver is back and NodeUnstage proves it clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncertain_stage_stays_in_use_until_unstaged() {
    if !common::can_mount() {
        return;
    }
    let mut env = Env::new().await;
    env.create_csidriver(true).await;
    let n = env.add_node("node-a").await;
    // Registered (NodeGetInfo answered) before the driver goes down.
    let unique = start_with_claim(&mut env, n).await;
    env.stop_driver(n).await;
    env.create_pod("pod-1", "node-a", "claim-1").await;

    let message = env
        .event_message(Some("FailedMount"), "failed for volume")
        .await;
    assert!(
        message.contains("MountVolume.MountDevice failed"),
        "NodeStage failed: {message}"
    );
    env.pods()
        .delete("pod-1", &Default::default())
        .await
        .unwrap();
    test_support::eventually("pod-1 gone", PATIENCE, || async {
        env.pods()
            .get_opt("pod-1")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    // The driver stays down for a while: the volume must stay in use and attached all along.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while std::time::Instant::now() < until {
        let (in_use, attached) = env.node_volumes("node-a").await;
        assert!(
            in_use.contains(&unique) && attached.contains(&unique),
            "an uncertain stage left volumesInUse ({in_use:?}) or volumesAttached ({attached:?})"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    // Back: NodeUnstage goes through, then the volume is released and detached.
    env.restart_driver(n).await;
    test_support::eventually("out of volumesInUse and detached", PATIENCE, || async {
        let (in_use, attached) = env.node_volumes("node-a").await;
        (!in_use.contains(&unique) && !attached.contains(&unique)).then_some(())
    })
    .await;
    env.shutdown().await;
}

/// The agent restarts (reconstruction: a publish rebuilt from disk does not know which pod
/// volume it is) and the running pod's claim is gone meanwhile, so its volume cannot be
/// resolved: the publish stays mounted under the running pod, and is torn down (and the
/// volume unstaged) only once the pod goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unresolvable_volume_of_a_running_pod_stays_published_across_a_restart() {
    if !common::can_mount() {
        return;
    }
    let mut env = Env::new().await;
    env.create_csidriver(false).await;
    let n = env.add_node("node-a").await;
    let options = env.agent_options(n, SkipAttachMode::BypassAdc);
    env.start_agent(n, options.clone());
    env.create_bound_claim(n, "pv-1", "claim-1", false).await;
    env.create_pod("pod-1", "node-a", "claim-1").await;
    let paths = env.wait_ready("pod-1").await;
    let publish = Path::new(&paths["data"]).to_path_buf();
    assert!(is_mounted(&publish).await, "{} mounted", publish.display());

    env.stop_agent(n).await;
    assert!(
        is_mounted(&publish).await,
        "a clean stop leaves volumes mounted"
    );
    // The claim goes (no pvc-protection finalizer here: at once): the pod's volume "data"
    // cannot be resolved any more.
    let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(env.kube.clone(), NS);
    claims.delete("claim-1", &Default::default()).await.unwrap();
    test_support::eventually("claim-1 gone", PATIENCE, || async {
        claims
            .get_opt("claim-1")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;

    env.start_agent(n, options);
    // The restarted agent has the pod in its desired state, the volume unresolved ...
    let message = env
        .event_message(Some("FailedMount"), "PVC default/claim-1 not found")
        .await;
    assert!(message.contains("volume \"data\""), "{message}");
    // ... and leaves the publish alone (it is still registered with the driver, so an
    // unmount would have gone through by now).
    env.wait_registered("node-a").await;
    let until = std::time::Instant::now() + std::time::Duration::from_secs(3);
    let mut samples = 0;
    while std::time::Instant::now() < until {
        assert!(
            is_mounted(&publish).await,
            "{} was unmounted under the running pod after {samples} samples",
            publish.display()
        );
        samples += 1;
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    println!("{samples} samples over 3 s after the restart: still mounted");

    // The pod goes: now the volume is unpublished and unstaged.
    env.delete_pod_and_wait("pod-1").await;
    assert!(!is_mounted(&publish).await, "unpublished with the pod");
    let root = env.nodes[n].root.clone();
    test_support::eventually("nothing mounted on the node", PATIENCE, || async {
        mounts_below(&root).await.is_empty().then_some(())
    })
    .await;
    env.shutdown().await;
}

/// A pod with a generic ephemeral volume is never Ready without it (such a pod used to wait
/// forever for its claim). Its volume is the claim `<pod>-<volume>` the ephemeral-volume controller
/// makes for it; until that exists the pod waits, a claim of that name the pod does not control is
/// refused, and once the pod's own claim is bound the volume is mounted and the pod Ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generic_ephemeral_volume_is_mounted_from_the_pods_own_claim_before_ready() {
    if !common::can_mount() {
        return;
    }
    let mut env = Env::new().await;
    env.create_csidriver(false).await;
    let n = env.add_node("node-a").await;
    let options = env.agent_options(n, SkipAttachMode::BypassAdc);
    env.start_agent(n, options);
    let pod = create_json::<k8s_openapi::api::core::v1::Pod>(
        env.pods(),
        json!({
            "metadata": {"name": "pod-e"},
            "spec": {
                "nodeName": "node-a",
                "containers": [{"name": "c", "image": "busybox"}],
                "volumes": [{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {
                    "spec": {"accessModes": ["ReadWriteOnce"],
                             "resources": {"requests": {"storage": "16Mi"}}},
                }}}],
            },
        }),
    )
    .await;
    let waiting = env.event_message(None, "PVC default/pod-e-scratch").await;
    println!("{waiting}");
    let not_ready = |p: &k8s_openapi::api::core::v1::Pod| {
        !p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    };
    assert!(not_ready(&env.pods().get("pod-e").await.unwrap()));

    // Someone else's claim of that name: refused.
    env.create_bound_claim(n, "pv-e", "pod-e-scratch", false)
        .await;
    let refused = env.event_message(None, "(pod is not owner)").await;
    assert!(refused.contains("PVC default/pod-e-scratch"), "{refused}");
    assert!(not_ready(&env.pods().get("pod-e").await.unwrap()));

    // The pod's own claim (what the ephemeral-volume controller writes): mounted, Ready.
    let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(env.kube.clone(), NS);
    claims
        .patch(
            "pod-e-scratch",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"ownerReferences": [{
                "apiVersion": "v1", "kind": "Pod", "name": "pod-e",
                "uid": pod.metadata.uid, "controller": true, "blockOwnerDeletion": true,
            }]}})),
        )
        .await
        .unwrap();
    let paths = env.wait_ready("pod-e").await;
    let path = Path::new(&paths["scratch"]).to_path_buf();
    assert!(is_mounted(&path).await, "{} mounted", path.display());
    env.delete_pod_and_wait("pod-e").await;
    assert!(!is_mounted(&path).await);
    env.shutdown().await;
}

/// The agent's status posts merge conditions by type: a condition another component wrote
/// (here NetworkUnavailable, as a network plugin writes it) survives the next heartbeat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_status_keeps_conditions_others_write() {
    if !common::can_mount() {
        return;
    }
    let mut env = Env::new().await;
    let n = env.add_node("node-a").await;
    let mut options = env.agent_options(n, SkipAttachMode::BypassAdc);
    options.node_status_update_frequency = std::time::Duration::from_millis(200);
    options.node_status_report_frequency = std::time::Duration::from_millis(200);
    env.start_agent(n, options);
    let nodes = env.nodes_api();
    let beat = |n: &k8s_openapi::api::core::v1::Node| {
        n.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
            .and_then(|c| c.last_heartbeat_time.clone())
    };
    let first = test_support::eventually("the agent's Ready condition", PATIENCE, || async {
        beat(&nodes.get("node-a").await.ok()?)
    })
    .await;
    nodes
        .patch_status(
            "node-a",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Strategic(json!({"status": {"conditions": [{
                "type": "NetworkUnavailable", "status": "False", "reason": "RouteCreated",
                "message": "routes created by the network plugin",
            }]}})),
        )
        .await
        .unwrap();
    // Two more heartbeats (heartbeat times have second resolution).
    test_support::eventually("a later heartbeat", PATIENCE, || async {
        let node = nodes.get("node-a").await.ok()?;
        let b = beat(&node)?;
        (b.0 > first.0 + std::time::Duration::from_secs(1)).then_some(())
    })
    .await;
    let node = nodes.get("node-a").await.unwrap();
    let types: Vec<String> = node
        .status
        .unwrap()
        .conditions
        .unwrap()
        .into_iter()
        .map(|c| c.type_)
        .collect();
    assert!(
        types.contains(&"NetworkUnavailable".to_string()) && types.contains(&"Ready".to_string()),
        "{types:?}"
    );
    env.shutdown().await;
}
