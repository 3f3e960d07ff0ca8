//! The controller over apiserver-lite (in-process on 127.0.0.1:0), through
//! `ephemeral_volume::run` on its own client, as csi-cluster runs it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use ephemeral_volume::{Config, Options};
use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim, Pod};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

const NS: &str = "default";
const PATIENCE: Duration = Duration::from_secs(60);

struct Env {
    server: apiserver::RunningApiServer,
    kube: Client,
    controller: Option<test_support::ComponentTask<ephemeral_volume::Error>>,
}

fn options(delete_orphaned_claims: bool) -> Options {
    Options {
        delete_orphaned_claims,
        backoff_initial: Duration::from_millis(50),
        backoff_max: Duration::from_millis(500),
        cache_sync_timeout: Duration::from_secs(30),
        ..Options::default()
    }
}

impl Env {
    async fn new() -> Self {
        if std::env::var_os("RUST_LOG").is_some() {
            component_runtime::init_logging(0);
        }
        let server = apiserver::ApiServer::start(apiserver::Config::default())
            .await
            .expect("api server");
        let kube = server.client();
        Self {
            server,
            kube,
            controller: None,
        }
    }

    async fn start(&mut self, options: Options) {
        assert!(self.controller.is_none());
        let config = self.server.kube_config().unwrap();
        let client =
            component_runtime::rate_limited(config, &ephemeral_volume::user_agent(), -1.0, 0)
                .unwrap();
        self.controller = Some(test_support::ComponentTask::spawn(|stop| {
            ephemeral_volume::run(client, Config::new(options), stop)
        }));
    }

    async fn stop(&mut self) {
        if let Some(c) = self.controller.take() {
            c.stop("the ephemeral volume controller", PATIENCE).await;
        }
    }

    async fn shutdown(mut self) {
        self.stop().await;
        self.server.shutdown().await.expect("api server shutdown");
    }

    fn pvcs(&self) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.kube.clone(), NS)
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.kube.clone(), NS)
    }

    async fn create_pod(&self, name: &str) -> Pod {
        let pod: Pod = serde_json::from_value(pod_json(name)).unwrap();
        self.pods()
            .create(&PostParams::default(), &pod)
            .await
            .unwrap()
    }

    async fn wait_claim(&self, name: &str) -> PersistentVolumeClaim {
        let pvcs = self.pvcs();
        test_support::eventually(&format!("claim {name}"), PATIENCE, || async {
            pvcs.get_opt(name).await.unwrap()
        })
        .await
    }

    async fn wait_claim_gone(&self, name: &str) {
        let pvcs = self.pvcs();
        test_support::eventually(&format!("claim {name} gone"), PATIENCE, || async {
            pvcs.get_opt(name).await.unwrap().is_none().then_some(())
        })
        .await;
    }

    async fn events_on(&self, pod: &str) -> Vec<Event> {
        let api: Api<Event> = Api::namespaced(self.kube.clone(), NS);
        api.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.involved_object.name.as_deref() == Some(pod))
            .collect()
    }
}

/// A pod with an emptyDir and a generic ephemeral volume `scratch` whose template has
/// labels, annotations and a spec.
fn pod_json(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "containers": [{"name": "c", "image": "pause",
                            "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]}],
            "volumes": [
                {"name": "cache", "emptyDir": {}},
                {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {
                    "metadata": {"labels": {"app": "web"}, "annotations": {"note": "scratch space"}},
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "storageClassName": "fast",
                        "volumeMode": "Filesystem",
                        "resources": {"requests": {"storage": "2Gi"}}
                    }
                }}}
            ]
        }
    })
}

fn assert_is_pods_claim(claim: &PersistentVolumeClaim, pod: &Pod) {
    let owners = claim.metadata.owner_references.as_ref().expect("owner");
    assert_eq!(owners.len(), 1, "{owners:?}");
    let o = &owners[0];
    assert_eq!(
        (o.api_version.as_str(), o.kind.as_str(), o.name.as_str()),
        ("v1", "Pod", pod.metadata.name.as_deref().unwrap())
    );
    assert_eq!(Some(o.uid.as_str()), pod.metadata.uid.as_deref());
    assert_eq!(
        (o.controller, o.block_owner_deletion),
        (Some(true), Some(true))
    );
    assert_eq!(claim.metadata.labels.as_ref().unwrap()["app"], "web");
    assert_eq!(
        claim.metadata.annotations.as_ref().unwrap()["note"],
        "scratch space"
    );
    let spec = claim.spec.as_ref().unwrap();
    assert_eq!(spec.storage_class_name.as_deref(), Some("fast"));
    assert_eq!(
        spec.access_modes.as_deref(),
        Some(&["ReadWriteOnce".to_string()][..])
    );
    assert_eq!(spec.volume_mode.as_deref(), Some("Filesystem"));
    let storage = &spec.resources.as_ref().unwrap().requests.as_ref().unwrap()["storage"];
    assert_eq!(storage.0, "2Gi");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_claim_is_made_from_the_template_and_owned_by_the_pod() {
    let mut env = Env::new().await;
    let early = env.create_pod("early").await;
    env.start(options(false)).await;
    // A pod there before the start and one created while it runs.
    let claim = env.wait_claim("early-scratch").await;
    assert_is_pods_claim(&claim, &early);
    let late = env.create_pod("late").await;
    let claim = env.wait_claim("late-scratch").await;
    assert_is_pods_claim(&claim, &late);
    // The emptyDir gets no claim, and nothing warned.
    assert!(env.pvcs().get_opt("early-cache").await.unwrap().is_none());
    assert!(env.events_on("early").await.is_empty());
    // Without --delete-orphaned-claims, a deleted pod's claim is left to a garbage collector.
    env.pods()
        .delete("late", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let pvcs = env.pvcs();
    // A third pod's claim marks a pass after the deletion.
    env.create_pod("marker").await;
    env.wait_claim("marker-scratch").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(pvcs.get_opt("late-scratch").await.unwrap().is_some());
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_claim_is_not_adopted_and_the_pod_gets_a_warning() {
    let mut env = Env::new().await;
    let foreign: PersistentVolumeClaim = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "web-scratch", "namespace": NS, "labels": {"owner": "someone-else"}},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}}
    }))
    .unwrap();
    let foreign = env
        .pvcs()
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();
    let pod = env.create_pod("web").await;
    env.start(options(false)).await;
    let event = test_support::eventually("FailedBinding Event on pod web", PATIENCE, || async {
        env.events_on("web")
            .await
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("FailedBinding"))
    })
    .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(
        event.message.as_deref(),
        Some(
            "ephemeral volume scratch: PVC default/web-scratch was not created for pod default/web (pod is not owner)"
        )
    );
    assert_eq!(
        event.source.and_then(|s| s.component).as_deref(),
        Some("ephemeral_volume")
    );
    assert_eq!(event.involved_object.kind.as_deref(), Some("Pod"));
    assert_eq!(event.involved_object.uid, pod.metadata.uid);
    // Retried (the Event's count grows) and never adopted.
    test_support::eventually("the Warning repeated", PATIENCE, || async {
        env.events_on("web")
            .await
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("FailedBinding") && e.count.unwrap_or(1) >= 2)
    })
    .await;
    let now = env.pvcs().get("web-scratch").await.unwrap();
    assert_eq!(now.metadata.uid, foreign.metadata.uid);
    assert_eq!(
        now.metadata.resource_version,
        foreign.metadata.resource_version
    );
    assert!(now.metadata.owner_references.is_none());
    // Once the foreign claim is gone, the pod gets its own.
    env.pvcs()
        .delete("web-scratch", &DeleteParams::default())
        .await
        .unwrap();
    let pvcs = env.pvcs();
    let claim = test_support::eventually("the pod's own claim", PATIENCE, || async {
        pvcs.get_opt("web-scratch")
            .await
            .unwrap()
            .filter(|c| c.metadata.uid != foreign.metadata.uid)
    })
    .await;
    assert_is_pods_claim(&claim, &pod);
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_makes_only_the_missing_claims() {
    let mut env = Env::new().await;
    let first = env.create_pod("first").await;
    env.start(options(false)).await;
    let before = env.wait_claim("first-scratch").await;
    env.stop().await;
    let second = env.create_pod("second").await;
    env.start(options(false)).await;
    let claim = env.wait_claim("second-scratch").await;
    assert_is_pods_claim(&claim, &second);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = env.pvcs().get("first-scratch").await.unwrap();
    assert_eq!(after.metadata.uid, before.metadata.uid);
    assert_eq!(
        after.metadata.resource_version,
        before.metadata.resource_version
    );
    assert_is_pods_claim(&after, &first);
    for pod in ["first", "second"] {
        assert!(env.events_on(pod).await.is_empty(), "{pod} got Events");
    }
    let all = env.pvcs().list(&ListParams::default()).await.unwrap().items;
    assert_eq!(
        all.len(),
        2,
        "{:?}",
        all.iter().map(|c| &c.metadata.name).collect::<Vec<_>>()
    );
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_delete_orphaned_claims_a_deleted_pods_claim_goes() {
    let mut env = Env::new().await;
    let web = env.create_pod("web").await;
    let keep = env.create_pod("keep").await;
    // A claim that also has a non-Pod owner is not ours to collect.
    let shared: PersistentVolumeClaim = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "shared", "namespace": NS, "ownerReferences": [
            {"apiVersion": "v1", "kind": "Pod", "name": "web", "uid": web.metadata.uid},
            {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "set", "uid": "0000-set"}
        ]},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    }))
    .unwrap();
    env.pvcs()
        .create(&PostParams::default(), &shared)
        .await
        .unwrap();
    env.start(options(true)).await;
    env.wait_claim("web-scratch").await;
    let kept = env.wait_claim("keep-scratch").await;
    assert_is_pods_claim(&kept, &keep);
    env.pods()
        .delete("web", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    env.wait_claim_gone("web-scratch").await;
    // A new pod of the same name is not the old claim's owner: it gets a claim of its own.
    let again = env.create_pod("web").await;
    let claim = env.wait_claim("web-scratch").await;
    assert_is_pods_claim(&claim, &again);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(env.pvcs().get_opt("shared").await.unwrap().is_some());
    let kept_now = env.pvcs().get("keep-scratch").await.unwrap();
    assert_eq!(kept_now.metadata.uid, kept.metadata.uid);
    env.shutdown().await;
}
