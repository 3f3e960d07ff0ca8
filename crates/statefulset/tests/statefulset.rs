//! The StatefulSet controller against apiserver-lite. The test plays the kubelet (pods
//! Running and Ready through `/status`, a terminating pod confirmed with grace period 0) and
//! the scheduler (pods bound through `pods/binding`, so their deletion is graceful as on a
//! real node).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Event, Node, PersistentVolumeClaim, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

const NS: &str = "default";
const PATIENCE: Duration = Duration::from_secs(60);

struct Env {
    server: apiserver::RunningApiServer,
    kube: Client,
    controller: test_support::ComponentTask<statefulset::Error>,
}

impl Env {
    async fn new() -> Self {
        if std::env::var_os("RUST_LOG").is_some() {
            static ONCE: std::sync::Once = std::sync::Once::new();
            ONCE.call_once(|| component_runtime::init_logging(0));
        }
        let server = apiserver::ApiServer::start(apiserver::Config::default())
            .await
            .expect("api server");
        let kube = server.client();
        let config = statefulset::Config {
            resync_period: Duration::from_secs(600),
            cache_sync_timeout: Duration::from_secs(30),
            ..statefulset::Config::default()
        };
        let client = server.client();
        let controller =
            test_support::ComponentTask::spawn(|stop| statefulset::run(client, config, stop));
        let node: Node = serde_json::from_value(json!({"metadata": {"name": "node-1"}})).unwrap();
        Api::<Node>::all(kube.clone())
            .create(&PostParams::default(), &node)
            .await
            .unwrap();
        Self {
            server,
            kube,
            controller,
        }
    }

    async fn shutdown(self) {
        self.controller
            .stop("the StatefulSet controller", PATIENCE)
            .await;
        self.server.shutdown().await.expect("api server shutdown");
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.kube.clone(), NS)
    }
    fn claims(&self) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.kube.clone(), NS)
    }
    fn sets(&self) -> Api<StatefulSet> {
        Api::namespaced(self.kube.clone(), NS)
    }

    async fn create_set(&self, name: &str, replicas: i32, policy: &str) -> StatefulSet {
        let set: StatefulSet = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "replicas": replicas,
                "serviceName": name,
                "podManagementPolicy": policy,
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": {"containers": [{"name": "c", "image": "busybox",
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}]}]}
                },
                "volumeClaimTemplates": [{
                    "metadata": {"name": "data"},
                    "spec": {"accessModes": ["ReadWriteOnce"],
                        "resources": {"requests": {"storage": "1Gi"}}}
                }]
            }
        }))
        .unwrap();
        self.sets()
            .create(&PostParams::default(), &set)
            .await
            .unwrap()
    }

    async fn get_pod(&self, name: &str) -> Option<Pod> {
        self.pods().get_opt(name).await.unwrap()
    }

    async fn wait_pod(&self, name: &str) -> Pod {
        test_support::eventually(&format!("pod {name} exists"), PATIENCE, || async {
            self.get_pod(name)
                .await
                .filter(|p| p.metadata.deletion_timestamp.is_none())
        })
        .await
    }

    async fn wait_gone(&self, name: &str) {
        test_support::eventually(&format!("pod {name} gone"), PATIENCE, || async {
            self.get_pod(name).await.is_none().then_some(())
        })
        .await;
    }

    /// Plays the scheduler and the kubelet: bound to node-1, Running and Ready.
    async fn run_pod(&self, name: &str) {
        let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": "node-1"}});
        let _: Value = self
            .pods()
            .create_subresource("binding", name, &PostParams::default(), &binding)
            .await
            .unwrap();
        let status = json!({"status": {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
        self.pods()
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap();
    }

    async fn wait_terminating(&self, name: &str) {
        test_support::eventually(&format!("pod {name} terminating"), PATIENCE, || async {
            self.get_pod(name)
                .await
                .and_then(|p| p.metadata.deletion_timestamp)
                .map(|_| ())
        })
        .await;
    }

    async fn is_terminating(&self, name: &str) -> bool {
        self.get_pod(name)
            .await
            .is_some_and(|p| p.metadata.deletion_timestamp.is_some())
    }

    /// Plays the kubelet confirming a terminating pod's end.
    async fn confirm_deletion(&self, name: &str) {
        self.wait_terminating(name).await;
        self.pods()
            .delete(
                name,
                &DeleteParams {
                    grace_period_seconds: Some(0),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
    }

    async fn claim_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .claims()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter_map(|c| c.metadata.name)
            .collect();
        names.sort();
        names
    }

    async fn event_messages(&self, reason: &str) -> Vec<String> {
        let api: Api<Event> = Api::namespaced(self.kube.clone(), NS);
        api.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .filter_map(|e| e.message)
            .collect()
    }

    async fn wait_status(&self, set: &str, want: Value) {
        test_support::eventually(&format!("status of {set} is {want}"), PATIENCE, || async {
            let s = self.sets().get(set).await.ok()?;
            let gen_ = s.metadata.generation;
            let st = s.status?;
            let have = json!({"replicas": st.replicas, "readyReplicas": st.ready_replicas.unwrap_or(0),
                "availableReplicas": st.available_replicas.unwrap_or(0),
                "currentReplicas": st.current_replicas.unwrap_or(0)});
            (have == want && st.observed_generation == gen_).then_some(())
        })
        .await;
    }
}

fn rv(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> u64 {
    meta.resource_version.as_deref().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordered_ready_scale_down_keeps_claims_and_pods_come_back() {
    let env = Env::new().await;
    let set = env.create_set("web", 3, "OrderedReady").await;
    let set_uid = set.metadata.uid.clone().unwrap();

    for i in 0..3 {
        let name = format!("web-{i}");
        let pod = env.wait_pod(&name).await;
        // The claim was there first, and the pod is wired to it.
        let claim = env.claims().get(&format!("data-web-{i}")).await.unwrap();
        assert!(
            rv(&claim.metadata) < rv(&pod.metadata),
            "claim created before pod {name}"
        );
        assert_eq!(claim.metadata.labels.as_ref().unwrap()["app"], "web");
        let labels = pod.metadata.labels.clone().unwrap();
        assert_eq!(labels["statefulset.kubernetes.io/pod-name"], name);
        assert_eq!(labels["apps.kubernetes.io/pod-index"], i.to_string());
        let owner = &pod.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.uid.as_str(), owner.controller),
            (set_uid.as_str(), Some(true))
        );
        let volume = &pod.spec.as_ref().unwrap().volumes.as_ref().unwrap()[0];
        assert_eq!(
            volume.persistent_volume_claim.as_ref().unwrap().claim_name,
            format!("data-web-{i}")
        );
        // The next ordinal waits for this one: the status shows this pod counted, not Ready,
        // and the next pod is not there.
        env.wait_status("web", json!({"replicas": i + 1, "readyReplicas": i, "availableReplicas": i, "currentReplicas": i + 1})).await;
        assert!(
            env.get_pod(&format!("web-{}", i + 1)).await.is_none(),
            "web-{} before web-{i} is Ready",
            i + 1
        );
        env.run_pod(&name).await;
    }
    env.wait_status(
        "web",
        json!({"replicas": 3, "readyReplicas": 3, "availableReplicas": 3, "currentReplicas": 3}),
    )
    .await;
    let created = env.event_messages("SuccessfulCreate").await;
    assert!(
        created.contains(&"create Pod web-0 in StatefulSet web successful".to_string()),
        "{created:?}"
    );
    assert!(
        created
            .contains(&"create Claim data-web-0 Pod web-0 in StatefulSet web success".to_string()),
        "{created:?}"
    );

    // Scale 3 -> 1: web-2 first; web-1 only after web-2 is gone.
    env.sets()
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"replicas": 1}})),
        )
        .await
        .unwrap();
    env.wait_terminating("web-2").await;
    assert!(
        !env.is_terminating("web-1").await,
        "web-1 deleted while web-2 is still there"
    );
    env.confirm_deletion("web-2").await;
    env.wait_gone("web-2").await;
    env.wait_terminating("web-1").await;
    assert!(!env.is_terminating("web-0").await);
    env.confirm_deletion("web-1").await;
    env.wait_gone("web-1").await;
    env.wait_status(
        "web",
        json!({"replicas": 1, "readyReplicas": 1, "availableReplicas": 1, "currentReplicas": 1}),
    )
    .await;
    assert!(
        env.get_pod("web-0")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_none()
    );
    assert_eq!(
        env.claim_names().await,
        ["data-web-0", "data-web-1", "data-web-2"]
    );
    let deleted = env.event_messages("SuccessfulDelete").await;
    assert!(
        deleted.contains(&"delete Pod web-2 in StatefulSet web successful".to_string()),
        "{deleted:?}"
    );

    // A deleted pod comes back under the same name, with the same claim.
    let old_uid = env.get_pod("web-0").await.unwrap().metadata.uid;
    env.pods()
        .delete("web-0", &DeleteParams::default())
        .await
        .unwrap();
    env.confirm_deletion("web-0").await;
    let back = test_support::eventually("web-0 re-created", PATIENCE, || async {
        env.get_pod("web-0")
            .await
            .filter(|p| p.metadata.uid != old_uid)
    })
    .await;
    let volume = &back.spec.unwrap().volumes.unwrap()[0];
    assert_eq!(
        volume.persistent_volume_claim.as_ref().unwrap().claim_name,
        "data-web-0"
    );
    env.run_pod("web-0").await;

    // Scale back up: the old claims are used again, not new ones.
    let claim_uid = env.claims().get("data-web-1").await.unwrap().metadata.uid;
    env.sets()
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"replicas": 2}})),
        )
        .await
        .unwrap();
    env.wait_pod("web-1").await;
    assert_eq!(
        env.claims().get("data-web-1").await.unwrap().metadata.uid,
        claim_uid
    );
    assert_eq!(env.claim_names().await.len(), 3);
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_creates_all_and_set_deletion_removes_pods() {
    let env = Env::new().await;
    env.create_set("par", 3, "Parallel").await;
    // All three without any being Ready.
    for i in 0..3 {
        env.wait_pod(&format!("par-{i}")).await;
    }
    env.wait_status(
        "par",
        json!({"replicas": 3, "readyReplicas": 0, "availableReplicas": 0, "currentReplicas": 3}),
    )
    .await;
    env.sets()
        .delete("par", &DeleteParams::default())
        .await
        .unwrap();
    for i in 0..3 {
        env.wait_gone(&format!("par-{i}")).await;
    }
    // Retain (the default): the claims stay.
    assert_eq!(
        env.claim_names().await,
        ["data-par-0", "data-par-1", "data-par-2"]
    );
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_retention_policy_removes_claims_on_scale_down_and_deletion() {
    let env = Env::new().await;
    // Created with 0 replicas, then given the policy and 2 replicas.
    env.create_set("del", 0, "Parallel").await;
    env.sets()
        .patch(
            "del",
            &PatchParams::default(),
            &Patch::Merge(
                &json!({"spec": {"replicas": 2, "persistentVolumeClaimRetentionPolicy": {
                "whenScaled": "Delete", "whenDeleted": "Delete"}}}),
            ),
        )
        .await
        .unwrap();
    env.wait_pod("del-0").await;
    env.wait_pod("del-1").await;
    assert_eq!(env.claim_names().await, ["data-del-0", "data-del-1"]);
    env.sets()
        .patch(
            "del",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"replicas": 1}})),
        )
        .await
        .unwrap();
    env.wait_gone("del-1").await;
    test_support::eventually("data-del-1 deleted on scale down", PATIENCE, || async {
        (env.claim_names().await == ["data-del-0"]).then_some(())
    })
    .await;
    env.sets()
        .delete("del", &DeleteParams::default())
        .await
        .unwrap();
    env.wait_gone("del-0").await;
    test_support::eventually("data-del-0 deleted with the set", PATIENCE, || async {
        env.claim_names().await.is_empty().then_some(())
    })
    .await;
    env.shutdown().await;
}
