//! Shared setup: apiserver-lite in-process on 127.0.0.1:0, the scheduler in-process through
//! `scheduler::run`, and helpers that create nodes, claims, volumes and pods and play the PV
//! controller (binding a claim by hand).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;
use test_support::objects::create_json;

use k8s_openapi::api::core::v1::{Event, Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};

pub const NS: &str = "default";
/// Generous: loaded 2-core CI machines.
pub const PATIENCE: Duration = Duration::from_secs(60);
pub const DRIVER: &str = "hostpath.csi.k8s.io";
pub const TOPOLOGY_KEY: &str = "topology.hostpath.csi/node";

pub struct Env {
    pub server: apiserver::RunningApiServer,
    pub kube: Client,
    scheduler: test_support::ComponentTask<scheduler::Error>,
}

impl Env {
    /// apiserver-lite and a scheduler with short backoffs.
    pub async fn new() -> Self {
        if std::env::var_os("RUST_LOG").is_some() {
            static ONCE: std::sync::Once = std::sync::Once::new();
            ONCE.call_once(|| component_runtime::init_logging(0));
        }
        let server = apiserver::ApiServer::start(apiserver::Config::default())
            .await
            .expect("api server");
        let kube = server.client();
        let config = scheduler::Config {
            initial_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(1),
            resync_period: Duration::from_secs(1),
            cache_sync_timeout: Duration::from_secs(30),
            ..scheduler::Config::default()
        };
        let client = server.client();
        let scheduler =
            test_support::ComponentTask::spawn(|stop| scheduler::run(client, config, stop));
        Self {
            server,
            kube,
            scheduler,
        }
    }

    pub async fn shutdown(self) {
        self.scheduler.stop("the scheduler", PATIENCE).await;
        self.server.shutdown().await.expect("api server shutdown");
    }

    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.kube.clone(), NS)
    }
    pub fn claims(&self) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.kube.clone(), NS)
    }
    pub fn volumes(&self) -> Api<PersistentVolume> {
        Api::all(self.kube.clone())
    }
    pub fn nodes(&self) -> Api<Node> {
        Api::all(self.kube.clone())
    }

    /// A Ready node (apiserver-lite keeps a node's status on create) with the hostpath
    /// topology label and `labels`.
    pub async fn node(&self, name: &str, labels: Value) -> Node {
        let mut l = json!({ TOPOLOGY_KEY: name, "kubernetes.io/hostname": name });
        for (k, v) in labels.as_object().unwrap() {
            l[k] = v.clone();
        }
        create_json(
            self.nodes(),
            json!({"metadata": {"name": name, "labels": l},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
        )
        .await
    }

    /// A CSINode with the hostpath driver and an attach limit.
    pub async fn csinode(&self, node: &str, count: i32) -> CSINode {
        create_json(
            Api::all(self.kube.clone()),
            json!({"metadata": {"name": node}, "spec": {"drivers": [{
                "name": DRIVER, "nodeID": node, "topologyKeys": [TOPOLOGY_KEY],
                "allocatable": {"count": count}}]}}),
        )
        .await
    }

    pub async fn class(&self, name: &str, mode: &str, allowed_nodes: &[&str]) -> StorageClass {
        let mut c =
            json!({"metadata": {"name": name}, "provisioner": DRIVER, "volumeBindingMode": mode});
        if !allowed_nodes.is_empty() {
            c["allowedTopologies"] = json!([{"matchLabelExpressions": [{"key": TOPOLOGY_KEY, "values": allowed_nodes}]}]);
        }
        create_json(Api::all(self.kube.clone()), c).await
    }

    pub async fn claim(&self, name: &str, class: &str, access_mode: &str) -> PersistentVolumeClaim {
        create_json(
            self.claims(),
            json!({"metadata": {"name": name}, "spec": {"accessModes": [access_mode],
                "storageClassName": class, "resources": {"requests": {"storage": "1Gi"}}}}),
        )
        .await
    }

    /// Plays the PV controller and the provisioner: a CSI volume (pinned to `node` when given)
    /// bound to claim `claim`.
    pub async fn bind_claim(
        &self,
        claim: &str,
        class: &str,
        node: Option<&str>,
    ) -> PersistentVolume {
        let pv_name = format!("pv-{claim}");
        let mut pv = json!({"metadata": {"name": pv_name}, "spec": {
            "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "storageClassName": class,
            "claimRef": {"namespace": NS, "name": claim},
            "csi": {"driver": DRIVER, "volumeHandle": format!("handle-{claim}")}}});
        if let Some(node) = node {
            pv["spec"]["nodeAffinity"] = json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": TOPOLOGY_KEY, "operator": "In", "values": [node]}]}]}});
        }
        let pv: PersistentVolume = create_json(self.volumes(), pv).await;
        self.volumes()
            .patch_status(
                &pv_name,
                &PatchParams::default(),
                &Patch::Merge(&json!({"status": {"phase": "Bound"}})),
            )
            .await
            .unwrap();
        self.claims()
            .patch(
                claim,
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"volumeName": pv_name}})),
            )
            .await
            .unwrap();
        self.claims()
            .patch_status(
                claim,
                &PatchParams::default(),
                &Patch::Merge(&json!({"status": {"phase": "Bound"}})),
            )
            .await
            .unwrap();
        pv
    }

    /// A pod with one container and these claims; `extra` is merged into its spec.
    pub async fn pod(&self, name: &str, claims: &[&str], extra: Value) -> Pod {
        let volumes: Vec<Value> = claims
            .iter()
            .map(|c| json!({"name": c, "persistentVolumeClaim": {"claimName": c}}))
            .collect();
        let mut spec =
            json!({"containers": [{"name": "c", "image": "busybox"}], "volumes": volumes});
        for (k, v) in extra.as_object().unwrap() {
            spec[k] = v.clone();
        }
        create_json(
            self.pods(),
            json!({"metadata": {"name": name}, "spec": spec}),
        )
        .await
    }

    /// The node the pod gets bound to.
    pub async fn wait_bound(&self, pod: &str) -> String {
        let api = self.pods();
        test_support::eventually(&format!("pod {pod} bound to a node"), PATIENCE, || {
            let api = api.clone();
            async move {
                let p = api.get(pod).await.ok()?;
                p.spec?.node_name.filter(|n| !n.is_empty())
            }
        })
        .await
    }

    pub async fn node_of(&self, pod: &str) -> Option<String> {
        self.pods().get(pod).await.unwrap().spec.unwrap().node_name
    }

    /// Messages of the pod's Events with `reason`.
    pub async fn events(&self, pod: &str, reason: &str) -> Vec<Event> {
        let api: Api<Event> = Api::namespaced(self.kube.clone(), NS);
        api.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| {
                e.involved_object.name.as_deref() == Some(pod)
                    && e.reason.as_deref() == Some(reason)
            })
            .collect()
    }

    /// Waits for a FailedScheduling Event of `pod` with exactly `message`.
    pub async fn wait_failed(&self, pod: &str, message: &str) {
        test_support::eventually(
            &format!("FailedScheduling of {pod}: {message}"),
            PATIENCE,
            || async {
                let events = self.events(pod, "FailedScheduling").await;
                events
                    .iter()
                    .any(|e| e.message.as_deref() == Some(message))
                    .then_some(())
            },
        )
        .await;
    }
}

/// kube-scheduler's message for `total` nodes and `reasons` ("1 node(s) ...", sorted).
pub fn fit_error(total: usize, reasons: &[&str]) -> String {
    format!(
        "0/{total} nodes are available: {}. preemption: 0/{total} nodes are available: {total} Preemption is not helpful for scheduling.",
        reasons.join(", ")
    )
}
