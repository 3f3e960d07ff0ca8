//! Shared setup: the embedded API server, the CSI mock on a real unix socket, and the attacher
//! controller built in-process from the library (or the `csi-attacher` binary).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use attacher::{Capabilities, Controller, Driver, Options};
use csi_mock::{MockConfig, MockDriver};
use csi_spec::v1::ControllerGetCapabilitiesRequest;
use csi_spec::v1::controller_client::ControllerClient;
use k8s_openapi::api::core::v1::{Event, PersistentVolume};
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use prometheus_client::registry::Registry;
use test_support::ComponentTask;

pub const DRIVER: &str = "mock.csi.rs";
pub const FINALIZER: &str = "external-attacher/mock-csi-rs";
pub const NODE: &str = "node-1";
pub const NODE_ID: &str = "mock-node-1";
pub const NODE_ID_ANNOTATION: &str = "csi.alpha.kubernetes.io/node-id";
/// User-Agent of the controller's client, to pick its requests out of the audit trail.
pub const UA: &str = "csi-attacher-under-test";

/// How long anything may take before a test gives up (generous: loaded 2-core CI machines).
pub const PATIENCE: Duration = Duration::from_secs(60);

pub use test_support::init_tracing;

/// Options for fast tests: 50 ms first retry, 1 s max, 5 s CSI timeout, no periodic work.
pub fn fast_options() -> Options {
    Options {
        timeout: Duration::from_secs(5),
        workers: 4,
        retry_interval_start: Duration::from_millis(50),
        retry_interval_max: Duration::from_secs(1),
        resync: Duration::ZERO,
        reconcile_sync: Duration::ZERO,
        max_entries: 0,
        default_fstype: String::new(),
    }
}

pub struct Running {
    task: ComponentTask<attacher::Error>,
    pub registry: Arc<Registry>,
}

/// One CSI call as the controller's metrics observer saw it: (method path, code, migrated).
pub type ObservedCall = (String, tonic::Code, bool);

pub struct Env {
    /// Every CSI call the in-process controller reported to its metrics observer.
    pub observed: Arc<std::sync::Mutex<Vec<ObservedCall>>>,
    pub server: apiserver::RunningApiServer,
    /// The test's own client (a different User-Agent from the controller's).
    pub kube: Client,
    pub mock: Option<MockDriver>,
    pub dir: tempfile::TempDir,
    pub running: Option<Running>,
}

impl Env {
    /// API server, a mock driver, and the CSINode of `node-1` registering it.
    pub async fn new(mock: MockConfig) -> Self {
        init_tracing();
        let server = apiserver::ApiServer::start(apiserver::Config::default())
            .await
            .expect("api server");
        let kube = server.client();
        let dir = tempfile::tempdir().expect("tempdir");
        let driver_name = mock.name.clone();
        let mock = csi_mock::start(dir.path(), mock).await.expect("mock");
        let env = Self {
            observed: Arc::default(),
            server,
            kube,
            mock: Some(mock),
            dir,
            running: None,
        };
        env.create_csinode(NODE, &[(&driver_name, NODE_ID)]).await;
        env
    }

    /// Without a driver (dummy mode).
    pub async fn without_driver() -> Self {
        init_tracing();
        let server = apiserver::ApiServer::start(apiserver::Config::default())
            .await
            .expect("api server");
        let kube = server.client();
        Self {
            observed: Arc::default(),
            server,
            kube,
            mock: None,
            dir: tempfile::tempdir().expect("tempdir"),
            running: None,
        }
    }

    pub fn mock(&self) -> &MockDriver {
        self.mock.as_ref().expect("mock driver")
    }

    /// A client like the binary's: our User-Agent, no rate limit.
    pub async fn controller_client(&self) -> Client {
        let config = self.server.kube_config().unwrap();
        component_runtime::rate_limited(config, UA, -1.0, 0).expect("client")
    }

    pub fn kubeconfig_file(&self) -> PathBuf {
        self.server
            .write_kubeconfig(self.dir.path())
            .expect("write kubeconfig")
    }

    /// The mock as a [`Driver`], capabilities asked over the socket like the binary does.
    pub async fn driver(&self) -> Driver {
        let mock = self.mock();
        let channel = csi_spec::connect_unix(&mock.endpoint())
            .await
            .expect("dial");
        let caps = ControllerClient::new(channel.clone())
            .controller_get_capabilities(ControllerGetCapabilitiesRequest {})
            .await
            .map(|r| {
                r.into_inner()
                    .capabilities
                    .iter()
                    .filter_map(|c| c.rpc_type().map(|t| t as i32))
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        Driver::Csi {
            name: mock.config().name.clone(),
            channel,
            capabilities: Capabilities::from_rpc_types(caps),
        }
    }

    /// Starts the controller for the mock with `options`.
    pub async fn start(&mut self, options: Options) {
        let driver = self.driver().await;
        self.start_with(driver, options).await;
    }

    pub async fn start_with(&mut self, driver: Driver, options: Options) {
        let client = self.controller_client().await;
        self.start_on(client, driver, options);
    }

    pub fn start_on(&mut self, client: Client, driver: Driver, options: Options) {
        assert!(self.running.is_none(), "controller already running");
        let mut registry = Registry::default();
        let observed = self.observed.clone();
        let observer: attacher::metrics::CsiCallObserver =
            Arc::new(move |method: &str, code, _took, migrated| {
                observed
                    .lock()
                    .expect("observed")
                    .push((method.to_string(), code, migrated));
            });
        let controller = Controller::new(client, driver, options, &mut registry, Some(observer));
        self.running = Some(Running {
            task: ComponentTask::spawn(|stop| controller.run(stop)),
            registry: Arc::new(registry),
        });
    }

    /// Stops the controller gracefully (keys in progress finish) and checks it ended cleanly.
    pub async fn stop(&mut self) {
        if let Some(r) = self.running.take() {
            r.task.stop("the attacher", PATIENCE).await;
        }
    }

    pub async fn shutdown(mut self) {
        self.stop().await;
        if let Some(mock) = self.mock.take() {
            mock.shutdown().await;
        }
        self.server.shutdown().await.expect("api server shutdown");
    }

    // ---- objects ----

    pub fn vas(&self) -> Api<VolumeAttachment> {
        Api::all(self.kube.clone())
    }

    pub fn pvs(&self) -> Api<PersistentVolume> {
        Api::all(self.kube.clone())
    }

    pub fn csinodes(&self) -> Api<CSINode> {
        Api::all(self.kube.clone())
    }

    pub async fn create_csinode(&self, node: &str, drivers: &[(&str, &str)]) {
        let csinode = test_support::objects::csinode(node, drivers);
        self.csinodes()
            .create(&PostParams::default(), &csinode)
            .await
            .expect("create CSINode");
    }

    pub async fn create_pv(&self, pv: &PersistentVolume) -> PersistentVolume {
        self.pvs()
            .create(&PostParams::default(), pv)
            .await
            .expect("create PV")
    }

    pub async fn create_va(&self, va: &VolumeAttachment) -> VolumeAttachment {
        self.vas()
            .create(&PostParams::default(), va)
            .await
            .expect("create VA")
    }

    /// A CSI PV of the mock driver and a VolumeAttachment for it on node-1.
    pub async fn create_pair(&self, name: &str) -> (PersistentVolume, VolumeAttachment) {
        let pv = self.create_pv(&csi_pv(&pv_name(name), &vol_id(name))).await;
        let va = self
            .create_va(&va_for_pv(&va_name(name), &pv_name(name), NODE))
            .await;
        (pv, va)
    }

    pub async fn get_va(&self, name: &str) -> Option<VolumeAttachment> {
        self.vas().get_opt(name).await.expect("get VA")
    }

    pub async fn get_pv(&self, name: &str) -> Option<PersistentVolume> {
        self.pvs().get_opt(name).await.expect("get PV")
    }

    pub async fn delete_va(&self, name: &str) {
        self.vas()
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete VA");
    }

    pub async fn delete_pv(&self, name: &str) {
        self.pvs()
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete PV");
    }

    /// Waits until the VolumeAttachment reports attached.
    pub async fn wait_attached(&self, name: &str) -> VolumeAttachment {
        let vas = self.vas();
        eventually(&format!("VolumeAttachment {name} attached"), || async {
            let va = vas.get_opt(name).await.ok().flatten()?;
            va.status.as_ref().filter(|s| s.attached)?;
            Some(va)
        })
        .await
    }

    pub async fn wait_va_gone(&self, name: &str) {
        let vas = self.vas();
        eventually(&format!("VolumeAttachment {name} gone"), || async {
            match vas.get_opt(name).await {
                Ok(None) => Some(()),
                _ => None,
            }
        })
        .await;
    }

    pub async fn wait_pv_gone(&self, name: &str) {
        let pvs = self.pvs();
        eventually(&format!("PersistentVolume {name} gone"), || async {
            match pvs.get_opt(name).await {
                Ok(None) => Some(()),
                _ => None,
            }
        })
        .await;
    }

    /// Waits for `status.attachError` with a message containing `needle`.
    pub async fn wait_attach_error(&self, name: &str, needle: &str) -> VolumeAttachment {
        let vas = self.vas();
        eventually(
            &format!("VolumeAttachment {name} attachError containing {needle:?}"),
            || async {
                let va = vas.get_opt(name).await.ok().flatten()?;
                let msg = va.status.as_ref()?.attach_error.as_ref()?.message.clone()?;
                msg.contains(needle).then_some(va)
            },
        )
        .await
    }

    /// Write requests (create/update/patch/delete) of the controller's client so far.
    pub fn controller_writes(&self) -> Vec<apiserver::AuditRecord> {
        self.server
            .audit()
            .into_iter()
            .filter(|r| r.user_agent.starts_with(UA))
            .filter(|r| matches!(r.verb.as_str(), "create" | "update" | "patch" | "delete"))
            .collect()
    }

    /// Events recorded for an object.
    pub async fn events_for(&self, name: &str) -> Vec<Event> {
        let api: Api<Event> = Api::namespaced(self.kube.clone(), "default");
        api.list(&Default::default())
            .await
            .expect("list events")
            .items
            .into_iter()
            .filter(|e| e.involved_object.name.as_deref() == Some(name))
            .collect()
    }

    /// Sets `status.attached` directly (a status written by someone else, or a prior run).
    pub async fn set_attached(&self, name: &str, attached: bool) {
        let patch = serde_json::json!({"status": {"attached": attached}});
        self.vas()
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("patch status");
    }
}

/// Describes an audit record: `patch volumeattachments/va-1/status`.
pub fn describe(r: &apiserver::AuditRecord) -> String {
    let mut s = format!("{} {}", r.verb, r.resource);
    if let Some(n) = &r.name {
        s.push('/');
        s.push_str(n);
    }
    if let Some(sub) = &r.subresource {
        s.push('/');
        s.push_str(sub);
    }
    s
}

pub fn pv_name(n: &str) -> String {
    format!("pv-{n}")
}
pub fn va_name(n: &str) -> String {
    format!("va-{n}")
}
pub fn vol_id(n: &str) -> String {
    format!("vol-{n}")
}

pub fn csi_pv(name: &str, handle: &str) -> PersistentVolume {
    csi_pv_of(name, handle, DRIVER)
}

pub fn csi_pv_of(name: &str, handle: &str, driver: &str) -> PersistentVolume {
    test_support::objects::csi_pv(name, driver, handle)
}

pub fn va_for_pv(name: &str, pv: &str, node: &str) -> VolumeAttachment {
    va_of(name, DRIVER, pv, node)
}

pub fn va_of(name: &str, attacher: &str, pv: &str, node: &str) -> VolumeAttachment {
    test_support::objects::volume_attachment(name, attacher, pv, node)
}

pub fn finalizers_of<K: kube::Resource>(obj: &K) -> Vec<String> {
    obj.meta().finalizers.clone().unwrap_or_default()
}

/// Polls `check` every 20 ms until it returns `Some`, or panics after [`PATIENCE`].
pub async fn eventually<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    test_support::eventually(what, PATIENCE, check).await
}

/// Encodes the registry's metrics (OpenMetrics text).
pub fn metrics_text(registry: &Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry).expect("encode metrics");
    out
}

/// The attacher process of [`spawn_attacher`]: killed when dropped (SIGKILL: no graceful
/// anything), or stopped with [`terminate`].
pub use test_support::process::ChildGuard;

/// SIGTERM to the attacher, then its exit status; panics after [`PATIENCE`].
pub async fn terminate(attacher: &mut ChildGuard) -> std::process::ExitStatus {
    test_support::process::terminate(&mut attacher.0, "csi-attacher", PATIENCE).await
}

/// Starts the real `csi-attacher` binary with `args` (stderr to a file in `dir`).
pub fn spawn_attacher(dir: &std::path::Path, tag: &str, args: &[String]) -> ChildGuard {
    let log = std::fs::File::create(dir.join(format!("attacher-{tag}.log"))).expect("log file");
    let child = Command::new(env!("CARGO_BIN_EXE_csi-attacher"))
        .args(args)
        .env("RUST_LOG", "attacher=debug,component_runtime=debug,info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn csi-attacher");
    ChildGuard(child)
}

/// The attacher log written by [`spawn_attacher`].
pub fn attacher_log(dir: &std::path::Path, tag: &str) -> String {
    std::fs::read_to_string(dir.join(format!("attacher-{tag}.log"))).unwrap_or_default()
}
