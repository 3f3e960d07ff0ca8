//! Shared setup of the plugin registration tests: the embedded API server with a Node, the
//! node agent's NodeInfoManager and PluginManager on a temporary registry directory, a CSI
//! node service on a real unix socket, and registration sockets written by the test in the
//! kubelet's wire format.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use csi_spec::v1::identity_server::{Identity, IdentityServer};
use csi_spec::v1::node_server::{Node as CsiNode, NodeServer};
use csi_spec::v1::node_service_capability::rpc::Type as NodeRpc;
use csi_spec::v1::{
    GetPluginInfoRequest, GetPluginInfoResponse, NodeGetCapabilitiesRequest,
    NodeGetCapabilitiesResponse, NodeGetInfoRequest, NodeGetInfoResponse, NodeServiceCapability,
    Topology,
};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver};
use kube::api::{Api, PostParams};
use node_agent::nodeinfomanager::NodeInfoManager;
use node_agent::pluginmanager::PluginManager;
use node_agent::{DriverRegistry, RegisteredDriver};
use registrar::pluginregistration::registration_server::{Registration, RegistrationServer};
use registrar::pluginregistration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use test_support::ComponentTask;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use volume_plugins::MigratedPlugins;

pub const NODE: &str = "node-1";
/// How long anything may take before a test gives up (loaded 2-core CI machines).
pub const PATIENCE: Duration = Duration::from_secs(30);
pub const ZONE_KEY: &str = "topology.test.csi.rs/zone";
pub const RACK_KEY: &str = "topology.test.csi.rs/rack";

pub use test_support::init_tracing;

/// The agent's migration gates in these tests: AWS EBS migrated.
pub fn migrated() -> MigratedPlugins {
    MigratedPlugins::from_feature_gates("CSIMigrationAWS=true").unwrap()
}

/// The API server and a client to it.
pub struct ApiEnv {
    pub server: apiserver::RunningApiServer,
    pub kube: kube::Client,
}

pub async fn api_server() -> ApiEnv {
    init_tracing();
    let server = apiserver::ApiServer::start(apiserver::Config {
        audit: false,
        ..Default::default()
    })
    .await
    .expect("api server");
    let kube = server.client();
    ApiEnv { server, kube }
}

/// Creates the Node with these labels.
pub async fn create_node(kube: &kube::Client, labels: &[(&str, &str)]) -> Node {
    let node = test_support::objects::node(NODE, labels);
    Api::<Node>::all(kube.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap()
}

/// A running plugin manager with everything it needs; stops it on drop.
pub struct Env {
    pub api: ApiEnv,
    pub dir: tempfile::TempDir,
    pub registry_dir: PathBuf,
    pub drivers: DriverRegistry,
    pub node_info: NodeInfoManager,
    pub metrics: prometheus_client::registry::Registry,
    task: ComponentTask<std::convert::Infallible>,
}

impl Env {
    /// A Node with these labels, its CSINode initialized, and the plugin manager polling every
    /// 50 ms with a 100 ms … 1 s retry backoff.
    pub async fn start(node_labels: &[(&str, &str)]) -> Self {
        Self::start_polling(node_labels, Duration::from_millis(50)).await
    }

    pub async fn start_polling(node_labels: &[(&str, &str)], poll: Duration) -> Self {
        let api = api_server().await;
        create_node(&api.kube, node_labels).await;
        let node_info = NodeInfoManager::new(api.kube.clone(), NODE, migrated());
        node_info.init_csinode().await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let registry_dir = dir.path().join("plugins_registry");
        let drivers = DriverRegistry::default();
        let mut metrics = prometheus_client::registry::Registry::default();
        let manager = PluginManager::new(
            registry_dir.clone(),
            drivers.clone(),
            node_info.clone(),
            &mut metrics,
        )
        .with_poll_interval(poll)
        .with_retry_backoff(Duration::from_millis(100), Duration::from_secs(1));
        let task = ComponentTask::spawn(|stop| async move {
            manager.run(stop).await;
            Ok(())
        });
        // run() creates the directory.
        let dir_ready = registry_dir.clone();
        test_support::eventually("the registry directory exists", PATIENCE, || {
            let dir_ready = dir_ready.clone();
            async move { dir_ready.is_dir().then_some(()) }
        })
        .await;
        Self {
            api,
            dir,
            registry_dir,
            drivers,
            node_info,
            metrics,
            task,
        }
    }

    pub fn kube(&self) -> kube::Client {
        self.api.kube.clone()
    }

    pub async fn csinode(&self) -> CSINode {
        Api::<CSINode>::all(self.kube()).get(NODE).await.unwrap()
    }

    pub async fn node(&self) -> Node {
        Api::<Node>::all(self.kube()).get(NODE).await.unwrap()
    }

    pub async fn csinode_drivers(&self) -> Vec<CSINodeDriver> {
        self.csinode().await.spec.drivers
    }

    /// Waits until the CSINode has exactly one entry named `driver` and `check` accepts it.
    pub async fn wait_for_entry(
        &self,
        driver: &str,
        check: impl Fn(&CSINodeDriver) -> bool,
    ) -> CSINodeDriver {
        test_support::eventually(&format!("CSINode entry of {driver}"), PATIENCE, || async {
            let drivers = self.csinode_drivers().await;
            let mine: Vec<&CSINodeDriver> = drivers.iter().filter(|d| d.name == driver).collect();
            match mine.as_slice() {
                [entry] if check(entry) => Some((*entry).clone()),
                _ => None,
            }
        })
        .await
    }

    pub async fn wait_for_no_entry(&self, driver: &str) {
        test_support::eventually(
            &format!("no CSINode entry of {driver}"),
            PATIENCE,
            || async {
                (!self
                    .csinode_drivers()
                    .await
                    .iter()
                    .any(|d| d.name == driver))
                .then_some(())
            },
        )
        .await;
    }

    pub async fn wait_for_driver(
        &self,
        driver: &str,
        check: impl Fn(&RegisteredDriver) -> bool,
    ) -> RegisteredDriver {
        test_support::eventually(
            &format!("{driver} in the DriverRegistry"),
            PATIENCE,
            || async { self.drivers.get(driver).filter(|d| check(d)) },
        )
        .await
    }

    pub fn metrics_text(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.metrics).unwrap();
        text
    }

    pub fn socket(&self, name: &str) -> PathBuf {
        self.registry_dir.join(name)
    }

    /// Stops the plugin manager and waits for it.
    pub async fn stop(self) {
        self.task.stop("the plugin manager", PATIENCE).await;
    }
}

/// What the test's CSI node service answers.
#[derive(Clone, Debug)]
pub struct DriverAnswers {
    pub name: String,
    pub node_id: Arc<Mutex<String>>,
    pub topology: BTreeMap<String, String>,
    pub max_volumes_per_node: i64,
}

impl DriverAnswers {
    pub fn new(name: &str, node_id: &str, topology: &[(&str, &str)], max: i64) -> Self {
        Self {
            name: name.into(),
            node_id: Arc::new(Mutex::new(node_id.into())),
            topology: topology
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            max_volumes_per_node: max,
        }
    }

    pub fn set_node_id(&self, id: &str) {
        *self.node_id.lock().unwrap() = id.into();
    }
}

#[tonic::async_trait]
impl Identity for DriverAnswers {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: self.name.clone(),
            vendor_version: "1.0.0".into(),
            ..Default::default()
        }))
    }
}

#[tonic::async_trait]
impl CsiNode for DriverAnswers {
    async fn node_get_info(
        &self,
        _: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        Ok(Response::new(NodeGetInfoResponse {
            node_id: self.node_id.lock().unwrap().clone(),
            max_volumes_per_node: self.max_volumes_per_node,
            accessible_topology: (!self.topology.is_empty())
                .then(|| Topology::from_segments(self.topology.clone())),
        }))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        Ok(Response::new(NodeGetCapabilitiesResponse {
            capabilities: vec![NodeServiceCapability::rpc(NodeRpc::StageUnstageVolume)],
        }))
    }
}

/// What the test's registration socket answers and what it was told.
#[derive(Clone)]
pub struct FakeRegistration {
    pub info: PluginInfo,
    pub statuses: Arc<Mutex<Vec<RegistrationStatus>>>,
}

#[tonic::async_trait]
impl Registration for FakeRegistration {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        self.statuses.lock().unwrap().push(request.into_inner());
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

/// A gRPC server on a real unix socket; stops (and removes the socket) on drop.
pub struct Served {
    pub socket: PathBuf,
    stop: CancellationToken,
    task: Option<JoinHandle<Result<(), csi_spec::Error>>>,
}

impl Served {
    /// Stops serving; the socket file is removed.
    pub async fn stop(mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            tokio::time::timeout(PATIENCE, task)
                .await
                .unwrap()
                .unwrap()
                .unwrap();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn serve(socket: &Path, router: tonic::transport::server::Router) -> Served {
    let bound = csi_spec::UnixSocket::bind(&socket.display().to_string()).unwrap();
    let stop = CancellationToken::new();
    let stopped = stop.clone();
    let task = tokio::spawn(bound.serve(router, async move { stopped.cancelled().await }));
    Served {
        socket: socket.to_path_buf(),
        stop,
        task: Some(task),
    }
}

/// A CSI driver's node side (Identity + Node) at `socket`.
pub fn start_driver(socket: &Path, answers: &DriverAnswers) -> Served {
    serve(
        socket,
        tonic::transport::Server::builder()
            .add_service(IdentityServer::new(answers.clone()))
            .add_service(NodeServer::new(answers.clone())),
    )
}

/// A registration socket at `socket` answering `info`; with `csi`, the same socket also
/// serves the driver (the case of an empty `endpoint`).
pub fn start_registration(
    socket: &Path,
    info: PluginInfo,
    csi: Option<&DriverAnswers>,
) -> (Served, Arc<Mutex<Vec<RegistrationStatus>>>) {
    let statuses = Arc::new(Mutex::new(Vec::new()));
    let registration = RegistrationServer::new(FakeRegistration {
        info,
        statuses: Arc::clone(&statuses),
    });
    let mut builder = tonic::transport::Server::builder();
    let router = match csi {
        Some(answers) => builder
            .add_service(registration)
            .add_service(IdentityServer::new(answers.clone()))
            .add_service(NodeServer::new(answers.clone())),
        None => builder.add_service(registration),
    };
    (serve(socket, router), statuses)
}

pub fn plugin_info(kind: &str, name: &str, endpoint: &str, versions: &[&str]) -> PluginInfo {
    PluginInfo {
        r#type: kind.into(),
        name: name.into(),
        endpoint: endpoint.into(),
        supported_versions: versions.iter().map(|v| (*v).to_owned()).collect(),
    }
}

/// Waits until the registration socket was told something that `check` accepts.
pub async fn wait_for_status(
    statuses: &Arc<Mutex<Vec<RegistrationStatus>>>,
    what: &str,
    check: impl Fn(&RegistrationStatus) -> bool,
) -> RegistrationStatus {
    test_support::eventually(what, PATIENCE, || async {
        statuses.lock().unwrap().iter().find(|s| check(s)).cloned()
    })
    .await
}
