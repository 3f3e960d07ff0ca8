//! Shared setup: apiserver-lite in-process on 127.0.0.1:0, the controller in-process through
//! `pv_controller::run` on its own client, and helpers to create objects and wait for states.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;
use test_support::objects::create_json;

use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim};
use kube::api::{DeleteParams, ListParams};
use kube::{Api, Client};
use pv_controller::{Config, Options};
use serde_json::{Value, json};
use test_support::ComponentTask;

pub const NS: &str = "default";
/// How long anything may take before a test gives up (loaded 2-core CI machines).
pub const PATIENCE: Duration = Duration::from_secs(60);

pub use test_support::init_tracing;

/// Options for fast tests: short backoff. The sync period is longer than any test, so every
/// step a test waits for is driven by the change that caused it (the passes sync what changed),
/// not by a periodic pass that visits everything.
pub fn fast_options() -> Options {
    Options {
        sync_period: Duration::from_secs(600),
        backoff_initial: Duration::from_millis(100),
        backoff_max: Duration::from_secs(1),
        cache_sync_timeout: Duration::from_secs(30),
        ..Options::default()
    }
}

type Running = ComponentTask<pv_controller::Error>;

/// A controller started beside the main one.
pub struct Controller(Running);

impl Controller {
    /// Stops it and checks it ended without error.
    pub async fn stop(self) {
        self.0.stop("the second PV controller", PATIENCE).await;
    }
}

pub struct Env {
    pub server: apiserver::RunningApiServer,
    /// The test's own client.
    pub kube: Client,
    controller: Option<Running>,
}

impl Env {
    pub async fn new() -> Self {
        init_tracing();
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

    async fn controller_client(&self) -> Client {
        let config = self.server.kube_config().unwrap();
        component_runtime::rate_limited(config, &pv_controller::user_agent(), -1.0, 0).unwrap()
    }

    /// Starts the controller in-process through `pv_controller::run`.
    pub async fn start(&mut self, options: Options) {
        self.start_with(Config::new(options)).await;
    }

    pub async fn start_with(&mut self, config: Config) {
        assert!(self.controller.is_none(), "controller already running");
        let client = self.controller_client().await;
        self.controller = Some(ComponentTask::spawn(|stop| {
            pv_controller::run(client, config, stop)
        }));
    }

    /// Another controller on the same API server (a second replica), stopped by the caller.
    pub async fn second_controller(&self, config: Config) -> Controller {
        let client = self.controller_client().await;
        Controller(ComponentTask::spawn(|stop| {
            pv_controller::run(client, config, stop)
        }))
    }

    /// Stops the controller and checks it ended without error.
    pub async fn stop(&mut self) {
        if let Some(r) = self.controller.take() {
            r.stop("the PV controller", PATIENCE).await;
        }
    }

    pub async fn shutdown(mut self) {
        self.stop().await;
        self.server.shutdown().await.expect("api server shutdown");
    }

    // ---- objects ----

    pub fn pvs(&self) -> Api<PersistentVolume> {
        Api::all(self.kube.clone())
    }

    pub fn pvcs(&self) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.kube.clone(), NS)
    }

    pub async fn pv(&self, name: &str) -> Option<PersistentVolume> {
        self.pvs().get_opt(name).await.unwrap()
    }

    pub async fn pvc(&self, name: &str) -> Option<PersistentVolumeClaim> {
        self.pvcs().get_opt(name).await.unwrap()
    }

    /// A hostPath PV (an in-tree source the controller never deletes itself).
    pub async fn create_pv(
        &self,
        name: &str,
        size: &str,
        modes: &[&str],
        class: &str,
    ) -> PersistentVolume {
        create_json(self.pvs(), pv_json(name, size, modes, class)).await
    }

    pub async fn create_pv_json(&self, v: Value) -> PersistentVolume {
        create_json(self.pvs(), v).await
    }

    pub async fn create_pvc(
        &self,
        name: &str,
        size: &str,
        modes: &[&str],
        class: Option<&str>,
    ) -> PersistentVolumeClaim {
        create_json(self.pvcs(), pvc_json(name, size, modes, class)).await
    }

    pub async fn create_pvc_json(&self, v: Value) -> PersistentVolumeClaim {
        create_json(self.pvcs(), v).await
    }

    pub async fn create_class(&self, name: &str, provisioner: &str, mode: &str, params: Value) {
        let api: Api<k8s_openapi::api::storage::v1::StorageClass> = Api::all(self.kube.clone());
        create_json(
            api,
            json!({
                "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                "metadata": {"name": name},
                "provisioner": provisioner,
                "volumeBindingMode": mode,
                "parameters": params,
            }),
        )
        .await;
    }

    pub async fn delete_pvc(&self, name: &str) {
        self.pvcs()
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }

    // ---- waiting ----

    pub async fn pv_phase(&self, name: &str) -> Option<String> {
        self.pv(name).await?.status?.phase
    }

    pub async fn pvc_phase(&self, name: &str) -> Option<String> {
        self.pvc(name).await?.status?.phase
    }

    /// Waits until the PV has `phase` and returns it.
    pub async fn wait_pv_phase(&self, name: &str, phase: &str) -> PersistentVolume {
        test_support::eventually(&format!("PV {name} {phase}"), PATIENCE, || async {
            let pv = self.pv(name).await?;
            (pv.status.as_ref()?.phase.as_deref() == Some(phase)).then_some(pv)
        })
        .await
    }

    /// Waits until the PVC has `phase` and returns it.
    pub async fn wait_pvc_phase(&self, name: &str, phase: &str) -> PersistentVolumeClaim {
        test_support::eventually(&format!("PVC {name} {phase}"), PATIENCE, || async {
            let pvc = self.pvc(name).await?;
            (pvc.status.as_ref()?.phase.as_deref() == Some(phase)).then_some(pvc)
        })
        .await
    }

    /// Waits until the PVC carries annotation `key` and returns its value.
    pub async fn wait_pvc_annotation(&self, name: &str, key: &str) -> String {
        test_support::eventually(
            &format!("PVC {name} annotation {key}"),
            PATIENCE,
            || async {
                self.pvc(name)
                    .await?
                    .metadata
                    .annotations?
                    .get(key)
                    .cloned()
            },
        )
        .await
    }

    /// Events about object `name` with `reason`.
    pub async fn events(&self, namespace: &str, name: &str, reason: &str) -> Vec<Event> {
        let api: Api<Event> = Api::namespaced(self.kube.clone(), namespace);
        api.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| {
                e.involved_object.name.as_deref() == Some(name)
                    && e.reason.as_deref() == Some(reason)
            })
            .collect()
    }

    /// Waits for an Event about `name` with `reason` whose message contains `needle`.
    pub async fn wait_event_containing(
        &self,
        namespace: &str,
        name: &str,
        reason: &str,
        needle: &str,
    ) -> String {
        let what = format!("{reason} Event on {name} saying {needle:?}");
        test_support::eventually(&what, PATIENCE, || async {
            self.events(namespace, name, reason)
                .await
                .into_iter()
                .filter_map(|e| e.message)
                .find(|m| m.contains(needle))
        })
        .await
    }

    /// Waits for an Event about `name` with `reason` and returns its message.
    pub async fn wait_event(&self, namespace: &str, name: &str, reason: &str) -> String {
        test_support::eventually(&format!("{reason} Event on {name}"), PATIENCE, || async {
            self.events(namespace, name, reason)
                .await
                .first()
                .and_then(|e| e.message.clone())
        })
        .await
    }
}

pub fn pv_json(name: &str, size: &str, modes: &[&str], class: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": name, "labels": {"tier": "gold"}},
        "spec": {
            "capacity": {"storage": size},
            "accessModes": modes,
            "storageClassName": class,
            "persistentVolumeReclaimPolicy": "Retain",
            "hostPath": {"path": format!("/tmp/{name}")}
        }
    })
}

pub fn pvc_json(name: &str, size: &str, modes: &[&str], class: Option<&str>) -> Value {
    let mut v = json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "accessModes": modes,
            "resources": {"requests": {"storage": size}}
        }
    });
    if let Some(c) = class {
        v["spec"]["storageClassName"] = json!(c);
    }
    v
}

pub fn annotation<K: kube::Resource>(obj: &K, key: &str) -> Option<String> {
    obj.meta().annotations.as_ref()?.get(key).cloned()
}
