//! Shared setup: the embedded API server with its audit trail, the real csi-attacher library
//! fulfilling VolumeAttachments against csi-mock on a real unix socket, and the controller run
//! in-process through `attach_detach::run` (the binary's path, kubeconfig file and all).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use test_support::objects::create_json;

use attach_detach::{CONTROLLER_MANAGED_ANNOTATION, Config, Options};
use csi_mock::{MockConfig, MockDriver};
use k8s_openapi::api::core::v1::{Event, Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, CSINode, VolumeAttachment};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use test_support::ComponentTask;
use volume_plugins::SkipAttachMode;

pub const DRIVER: &str = "mock.csi.rs";
pub const NS: &str = "default";
/// The controller's User-Agent prefix in the audit trail.
pub const ADC_UA: &str = "attach-detach-controller/";

/// How long anything may take before a test gives up (loaded 2-core CI machines).
pub const PATIENCE: Duration = Duration::from_secs(60);

pub use test_support::init_tracing;

/// Options for fast tests: short backoff and waits.
pub fn fast_options(mode: SkipAttachMode) -> Options {
    Options {
        skip_attach: mode,
        backoff_initial: Duration::from_millis(100),
        backoff_max: Duration::from_secs(1),
        attach_timeout: Duration::from_secs(20),
        detach_timeout: Duration::from_secs(20),
        cache_sync_timeout: Duration::from_secs(30),
        ..Options::default()
    }
}

pub struct Env {
    pub server: apiserver::RunningApiServer,
    /// The test's own client (a User-Agent other than the controller's).
    pub kube: Client,
    pub dir: tempfile::TempDir,
    mocks: Vec<MockDriver>,
    attachers: Vec<ComponentTask<attacher::Error>>,
    adc: Option<ComponentTask<attach_detach::Error>>,
}

impl Env {
    pub async fn new() -> Self {
        init_tracing();
        let server = apiserver::ApiServer::start(apiserver::Config {
            audit: true,
            ..Default::default()
        })
        .await
        .expect("api server");
        let kube = server.client();
        Self {
            server,
            kube,
            dir: tempfile::tempdir().expect("tempdir"),
            mocks: Vec::new(),
            attachers: Vec::new(),
            adc: None,
        }
    }

    /// Starts csi-mock named `driver` and the real csi-attacher library for it.
    pub async fn start_attacher(&mut self, driver: &str) {
        self.start_attacher_with_delay(driver, Duration::ZERO).await;
    }

    /// [`Self::start_attacher`] with every ControllerPublish/Unpublish taking `delay`.
    pub async fn start_attacher_with_delay(&mut self, driver: &str, delay: Duration) {
        let sock_dir = self.dir.path().join(format!("mock-{}", self.mocks.len()));
        std::fs::create_dir_all(&sock_dir).unwrap();
        let mock = csi_mock::start(
            &sock_dir,
            MockConfig {
                name: driver.into(),
                delay,
                ..MockConfig::default()
            },
        )
        .await
        .expect("csi-mock");
        let channel = csi_spec::connect_unix(&mock.endpoint())
            .await
            .expect("dial csi-mock");
        let driver = attacher::Driver::Csi {
            name: driver.into(),
            channel,
            capabilities: attacher::Capabilities::from_rpc_types([
                csi_spec::v1::controller_service_capability::rpc::Type::PublishUnpublishVolume
                    as i32,
            ]),
        };
        let options = attacher::Options {
            timeout: Duration::from_secs(5),
            workers: 4,
            retry_interval_start: Duration::from_millis(50),
            retry_interval_max: Duration::from_secs(1),
            resync: Duration::ZERO,
            reconcile_sync: Duration::ZERO,
            max_entries: 0,
            default_fstype: String::new(),
        };
        let client = self.client_with_agent("csi-attacher-under-test").await;
        let mut registry = prometheus_client::registry::Registry::default();
        let controller = attacher::Controller::new(client, driver, options, &mut registry, None);
        self.mocks.push(mock);
        self.attachers
            .push(ComponentTask::spawn(|stop| controller.run(stop)));
    }

    /// The `i`th csi-mock started.
    pub fn mock(&self, i: usize) -> &MockDriver {
        &self.mocks[i]
    }

    async fn client_with_agent(&self, agent: &str) -> Client {
        let config = self.server.kube_config().unwrap();
        component_runtime::rate_limited(config, agent, -1.0, 0).unwrap()
    }

    pub fn kubeconfig_file(&self) -> PathBuf {
        self.server.write_kubeconfig(self.dir.path()).unwrap()
    }

    /// Starts the controller through `attach_detach::run`, as the binary does.
    pub fn start_adc(&mut self, options: Options) {
        assert!(self.adc.is_none(), "controller already running");
        let config = Config::new(Some(self.kubeconfig_file()), options);
        self.adc = Some(ComponentTask::spawn(|stop| {
            attach_detach::run(config, stop)
        }));
    }

    /// Starts the controller alone on `client` (a client the test built, e.g. with a layer
    /// that holds back some responses), without the binary's clients and leader election.
    pub fn start_adc_on(&mut self, client: Client, options: Options) {
        assert!(self.adc.is_none(), "controller already running");
        let mut registry = prometheus_client::registry::Registry::default();
        let controller = attach_detach::Controller::new(client, options, None, &mut registry);
        self.adc = Some(ComponentTask::spawn(|stop| controller.run(stop)));
    }

    /// A config for the controller's own client: the server's kubeconfig with the controller's
    /// User-Agent (so the audit trail names its requests).
    pub async fn adc_config(&self) -> kube::Config {
        self.server
            .kube_config_as(&format!("{ADC_UA}test"))
            .unwrap()
    }

    /// Stops the controller and checks it ended without error.
    pub async fn stop_adc(&mut self) {
        if let Some(t) = self.adc.take() {
            t.stop("the attach/detach controller", PATIENCE).await;
        }
    }

    pub async fn shutdown(mut self) {
        self.stop_adc().await;
        for t in self.attachers.drain(..) {
            t.abandon("an attacher", PATIENCE).await;
        }
        for m in self.mocks.drain(..) {
            m.shutdown().await;
        }
        self.server.shutdown().await.expect("api server shutdown");
    }

    // ---- objects ----

    /// A controller-managed node and its CSINode registering `drivers` (node ID `<driver>-<node>`)
    /// with the migrated-plugins annotation when given.
    pub async fn create_node(&self, name: &str, drivers: &[&str], migrated: Option<&str>) {
        create_json::<Node>(
            Api::all(self.kube.clone()),
            json!({
                "metadata": {"name": name, "annotations": {CONTROLLER_MANAGED_ANNOTATION: "true"}},
                "spec": {"providerID": format!("aws:///us-east-1a/i-{}", name.replace('-', ""))}
            }),
        )
        .await;
        if drivers.is_empty() && migrated.is_none() {
            return;
        }
        let annotations =
            migrated.map(|m| json!({csi_translation::MIGRATED_PLUGINS_ANNOTATION: m}));
        let drivers: Vec<Value> = drivers
            .iter()
            .map(|d| json!({"name": d, "nodeID": format!("{d}-{name}")}))
            .collect();
        create_json::<CSINode>(
            Api::all(self.kube.clone()),
            json!({"metadata": {"name": name, "annotations": annotations}, "spec": {"drivers": drivers}}),
        )
        .await;
    }

    /// A node whose kubelet attaches its own volumes (no controller-managed annotation).
    pub async fn create_unmanaged_node(&self, name: &str) {
        create_json::<Node>(
            Api::all(self.kube.clone()),
            json!({"metadata": {"name": name}}),
        )
        .await;
    }

    /// Writes `status.volumesAttached` as a kubelet that attaches itself would.
    pub async fn set_volumes_attached(&self, node: &str, volumes: &[&str]) {
        let list: Vec<Value> = volumes
            .iter()
            .map(|v| json!({"name": v, "devicePath": "/dev/kubelet"}))
            .collect();
        Api::<Node>::all(self.kube.clone())
            .patch_status(
                node,
                &PatchParams::default(),
                &Patch::Merge(&json!({"status": {"volumesAttached": list}})),
            )
            .await
            .expect("patch volumesAttached");
    }

    pub async fn create_csidriver(&self, name: &str, attach_required: bool) {
        create_json::<CSIDriver>(
            Api::all(self.kube.clone()),
            json!({"metadata": {"name": name}, "spec": {"attachRequired": attach_required}}),
        )
        .await;
    }

    pub async fn delete_csidriver(&self, name: &str) {
        Api::<CSIDriver>::all(self.kube.clone())
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete CSIDriver");
    }

    /// A PV with `source` (e.g. `{"csi": {...}}`) pre-bound to PVC `claim`, both Bound.
    pub async fn create_bound_pv(&self, pv: &str, claim: &str, access_mode: &str, source: Value) {
        let mut spec = json!({
            "accessModes": [access_mode],
            "capacity": {"storage": "1Gi"},
            "claimRef": {"namespace": NS, "name": claim},
            "persistentVolumeReclaimPolicy": "Retain",
        });
        for (k, v) in source.as_object().expect("source object") {
            spec[k] = v.clone();
        }
        create_json::<PersistentVolume>(
            Api::all(self.kube.clone()),
            json!({"metadata": {"name": pv}, "spec": spec}),
        )
        .await;
        create_json::<PersistentVolumeClaim>(
            Api::namespaced(self.kube.clone(), NS),
            json!({
                "metadata": {"name": claim, "namespace": NS},
                "spec": {
                    "accessModes": [access_mode],
                    "resources": {"requests": {"storage": "1Gi"}},
                    "volumeName": pv,
                    "storageClassName": "",
                }
            }),
        )
        .await;
        let bound = json!({"status": {"phase": "Bound"}});
        Api::<PersistentVolume>::all(self.kube.clone())
            .patch_status(pv, &PatchParams::default(), &Patch::Merge(&bound))
            .await
            .expect("PV status");
        Api::<PersistentVolumeClaim>::namespaced(self.kube.clone(), NS)
            .patch_status(claim, &PatchParams::default(), &Patch::Merge(&bound))
            .await
            .expect("PVC status");
    }

    /// A CSI PV of `driver` with handle `handle`, bound to `claim`.
    pub async fn create_csi_pv(
        &self,
        pv: &str,
        claim: &str,
        driver: &str,
        handle: &str,
        access_mode: &str,
    ) {
        self.create_bound_pv(
            pv,
            claim,
            access_mode,
            json!({"csi": {"driver": driver, "volumeHandle": handle}}),
        )
        .await;
    }

    /// A pod on `node` with `volumes` (pod volume JSON).
    pub async fn create_pod_with(&self, name: &str, node: &str, volumes: Vec<Value>) {
        create_json::<Pod>(
            Api::namespaced(self.kube.clone(), NS),
            json!({
                "metadata": {"name": name, "namespace": NS},
                "spec": {
                    "nodeName": node,
                    "containers": [{"name": "c", "image": "busybox"}],
                    "volumes": volumes,
                }
            }),
        )
        .await;
    }

    /// A pod on `node` using `claim`.
    pub async fn create_pod(&self, name: &str, node: &str, claim: &str) {
        self.create_pod_with(name, node, vec![claim_volume(claim)])
            .await;
    }

    /// Deletes the pod as a user does: it gets a deletionTimestamp (bound pods are deleted
    /// gracefully), then it is removed with grace period 0, as the kubelet does.
    pub async fn delete_pod(&self, name: &str) {
        let api = Api::<Pod>::namespaced(self.kube.clone(), NS);
        api.delete(name, &DeleteParams::default())
            .await
            .expect("delete pod");
        let _ = api
            .delete(name, &DeleteParams::default().grace_period(0))
            .await;
    }

    pub async fn delete_node(&self, name: &str) {
        Api::<Node>::all(self.kube.clone())
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete node");
    }

    /// Sets the node's `status.volumesInUse`, as the kubelet (node agent) does.
    pub async fn set_volumes_in_use(&self, node: &str, volumes: &[&str]) {
        let value = if volumes.is_empty() {
            Value::Null
        } else {
            json!(volumes)
        };
        Api::<Node>::all(self.kube.clone())
            .patch_status(
                node,
                &PatchParams::default(),
                &Patch::Merge(&json!({"status": {"volumesInUse": value}})),
            )
            .await
            .expect("patch volumesInUse");
    }

    // ---- observations ----

    pub async fn vas(&self) -> Vec<VolumeAttachment> {
        Api::<VolumeAttachment>::all(self.kube.clone())
            .list(&ListParams::default())
            .await
            .expect("list VAs")
            .items
    }

    /// VolumeAttachments the controller created (201s in the audit trail).
    pub fn va_creates(&self) -> usize {
        self.adc_requests("create", "volumeattachments")
            .iter()
            .filter(|r| r.code < 300)
            .count()
    }

    /// Requests of the controller with `verb` on `resource` (any answer).
    pub fn adc_requests(&self, verb: &str, resource: &str) -> Vec<apiserver::AuditRecord> {
        self.server
            .audit()
            .into_iter()
            .filter(|r| {
                r.user_agent.starts_with(ADC_UA) && r.verb == verb && r.resource == resource
            })
            .collect()
    }

    /// `node.status.volumesAttached` as (name, devicePath).
    pub async fn volumes_attached(&self, node: &str) -> Vec<(String, String)> {
        let node = Api::<Node>::all(self.kube.clone())
            .get(node)
            .await
            .expect("get node");
        node.status
            .and_then(|s| s.volumes_attached)
            .unwrap_or_default()
            .into_iter()
            .map(|v| (v.name, v.device_path))
            .collect()
    }

    /// (reason, message) of the Events on a pod.
    pub async fn pod_events(&self, pod: &str) -> Vec<(String, String)> {
        Api::<Event>::namespaced(self.kube.clone(), NS)
            .list(&ListParams::default())
            .await
            .expect("list events")
            .items
            .into_iter()
            .filter(|e| {
                e.involved_object.name.as_deref() == Some(pod)
                    && e.involved_object.kind.as_deref() == Some("Pod")
            })
            .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
            .collect()
    }

    /// Waits for a pod Event with `reason` whose message contains `needle`.
    pub async fn wait_pod_event(&self, pod: &str, reason: &str, needle: &str) -> String {
        eventually(
            &format!("Event {reason} containing {needle:?} on pod {pod}"),
            || async {
                self.pod_events(pod)
                    .await
                    .into_iter()
                    .find(|(r, m)| r == reason && m.contains(needle))
                    .map(|(_, m)| m)
            },
        )
        .await
    }

    /// Waits until `node.status.volumesAttached` is exactly `names` (devicePath "").
    pub async fn wait_volumes_attached(&self, node: &str, names: &[&str]) {
        let mut want: Vec<(String, String)> = names
            .iter()
            .map(|n| (n.to_string(), String::new()))
            .collect();
        want.sort();
        eventually(
            &format!("node {node} status.volumesAttached == {names:?}"),
            || async {
                let mut got = self.volumes_attached(node).await;
                got.sort();
                (got == want).then_some(())
            },
        )
        .await;
    }

    /// Waits until the VolumeAttachment for (handle, driver, node) says attached.
    pub async fn wait_va_attached(
        &self,
        handle: &str,
        driver: &str,
        node: &str,
    ) -> VolumeAttachment {
        let name = volume_plugins::names::volume_attachment_name(handle, driver, node);
        let api = Api::<VolumeAttachment>::all(self.kube.clone());
        eventually(
            &format!("VolumeAttachment {name} ({handle} on {node}) attached"),
            || async {
                let va = api.get_opt(&name).await.ok().flatten()?;
                va.status.as_ref().filter(|s| s.attached)?;
                Some(va)
            },
        )
        .await
    }

    /// Waits until the VolumeAttachment for (handle, driver, node) is gone.
    pub async fn wait_va_gone(&self, handle: &str, driver: &str, node: &str) {
        let name = volume_plugins::names::volume_attachment_name(handle, driver, node);
        let api = Api::<VolumeAttachment>::all(self.kube.clone());
        eventually(
            &format!("VolumeAttachment {name} ({handle} on {node}) gone"),
            || async { matches!(api.get_opt(&name).await, Ok(None)).then_some(()) },
        )
        .await;
    }

    pub async fn va_exists(&self, handle: &str, driver: &str, node: &str) -> bool {
        let name = volume_plugins::names::volume_attachment_name(handle, driver, node);
        Api::<VolumeAttachment>::all(self.kube.clone())
            .get_opt(&name)
            .await
            .expect("get VA")
            .is_some()
    }
}

pub fn claim_volume(claim: &str) -> Value {
    json!({"name": claim, "persistentVolumeClaim": {"claimName": claim}})
}

/// `kubernetes.io/csi/<driver>^<handle>`.
pub fn csi_name(driver: &str, handle: &str) -> String {
    volume_plugins::names::csi_unique_volume_name(driver, handle)
}

/// Polls `check` every 20 ms until it returns `Some`, or panics after [`PATIENCE`].
pub async fn eventually<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    test_support::eventually(what, PATIENCE, check).await
}

/// Checks `check` stays true for `period` (a bounded "nothing happens").
pub async fn stays<F, Fut>(what: &str, period: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + period;
    while Instant::now() < deadline {
        assert!(check().await, "no longer true: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub fn sorted<T: Ord>(mut v: Vec<T>) -> Vec<T> {
    v.sort();
    v
}

pub fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}
