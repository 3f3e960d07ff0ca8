//! What the node agent's integration tests share: apiserver-lite, the attach/detach
//! controller and csi-attacher from their libraries, and per node the real hostpath CSI
//! driver on a unix socket under the node's root dir, registered through our
//! csi-node-driver-registrar, with the node agent on top (in-process through
//! `node_agent::run`, or the real binary).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod recorder;

use std::path::{Path, PathBuf};
use std::time::Duration;
use test_support::objects::create_json;

use k8s_openapi::api::core::v1::{Event, Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, CSINode};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use test_support::ComponentTask;
use tokio_util::sync::CancellationToken;
use volume_plugins::SkipAttachMode;

pub const DRIVER: &str = hostpath_driver::DEFAULT_DRIVER_NAME;
pub const NS: &str = "default";
/// How long anything may take before a test gives up (loaded 2-core CI machines).
pub const PATIENCE: Duration = Duration::from_secs(60);

pub use test_support::init_tracing;

/// Whether this process may mount (CAP_SYS_ADMIN); otherwise the test is skipped (a failure
/// under CSI_RS_REQUIRE_ALL).
pub fn can_mount() -> bool {
    const CAP_SYS_ADMIN: u32 = 21;
    if test_support::has_capability(CAP_SYS_ADMIN) {
        return true;
    }
    test_support::skip_or_fail("the node agent's tests bind-mount volumes: run as root");
    false
}

/// A component of the test cluster as a task: cancelled when dropped; its error as text.
type Task = ComponentTask<String>;

/// One node: its root dir, the hostpath driver, the registrar, the agent.
pub struct TestNode {
    pub name: String,
    pub root: PathBuf,
    pub driver_socket: PathBuf,
    pub state_dir: PathBuf,
    /// Where the hostpath driver itself serves when a recording shim
    /// ([`Env::add_recorded_node`]) is in front of it on `driver_socket`.
    pub behind_shim: Option<PathBuf>,
    driver: Option<Task>,
    shim: Option<Task>,
    registrar: Option<Task>,
    agent: Option<Task>,
}

impl TestNode {
    pub fn registry_dir(&self) -> PathBuf {
        self.root.join("plugins_registry")
    }

    /// The hostpath driver's own socket (CreateVolume goes there directly).
    pub fn hostpath_socket(&self) -> &Path {
        self.behind_shim.as_deref().unwrap_or(&self.driver_socket)
    }
}

/// On a failed test (a panic before [`Env::shutdown`]) nothing may stay mounted.
impl Drop for Env {
    fn drop(&mut self) {
        test_support::unmount_all_below(self.dir.path());
    }
}

pub struct Env {
    server: Option<apiserver::RunningApiServer>,
    pub kube: Client,
    pub dir: tempfile::TempDir,
    pub nodes: Vec<TestNode>,
    adc: Option<Task>,
    attacher: Option<Task>,
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
            server: Some(server),
            kube,
            dir: tempfile::tempdir().expect("tempdir"),
            nodes: Vec::new(),
            adc: None,
            attacher: None,
        }
    }

    pub fn server(&self) -> &apiserver::RunningApiServer {
        self.server.as_ref().expect("api server running")
    }

    pub fn kubeconfig_file(&self) -> PathBuf {
        self.server().write_kubeconfig(self.dir.path()).unwrap()
    }

    async fn client_with_agent(&self, agent: &str) -> Client {
        let config = self.server().kube_config().unwrap();
        component_runtime::rate_limited(config, agent, -1.0, 0).unwrap()
    }

    /// The attach/detach controller in `mode`.
    pub fn start_adc(&mut self, mode: SkipAttachMode) {
        let options = attach_detach::Options {
            skip_attach: mode,
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(1),
            attach_timeout: Duration::from_secs(20),
            detach_timeout: Duration::from_secs(20),
            cache_sync_timeout: Duration::from_secs(30),
            ..attach_detach::Options::default()
        };
        let config = attach_detach::Config::new(Some(self.kubeconfig_file()), options);
        self.adc = Some(Task::spawn(|stop| async move {
            attach_detach::run(config, stop)
                .await
                .map_err(|e| e.to_string())
        }));
    }

    /// csi-attacher for the hostpath driver of node 0 (it has no ControllerPublish: the
    /// attacher's trivial handler marks VolumeAttachments attached).
    pub async fn start_attacher(&mut self) {
        let socket = self.nodes[0].driver_socket.display().to_string();
        let channel = csi_spec::connect_unix(&socket)
            .await
            .expect("dial hostpath");
        let driver = attacher::Driver::Csi {
            name: DRIVER.into(),
            channel,
            capabilities: attacher::Capabilities::from_rpc_types([]),
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
        self.attacher = Some(Task::spawn(|stop| async move {
            controller.run(stop).await.map_err(|e| e.to_string())
        }));
    }

    /// Node `name`'s directories, nothing started: the registered socket is
    /// `plugins/DRIVER/csi.sock`, and with `shimmed` the driver itself serves on
    /// `hostpath.sock` beside it.
    fn new_node(&self, name: &str, shimmed: bool) -> TestNode {
        let root = self.dir.path().join(name).join("kubelet");
        let sock_dir = root.join("plugins").join(DRIVER);
        std::fs::create_dir_all(&sock_dir).unwrap();
        std::fs::create_dir_all(root.join("plugins_registry")).unwrap();
        TestNode {
            name: name.into(),
            state_dir: self.dir.path().join(name).join("hostpath-state"),
            driver_socket: sock_dir.join("csi.sock"),
            behind_shim: shimmed.then(|| sock_dir.join("hostpath.sock")),
            root,
            driver: None,
            shim: None,
            registrar: None,
            agent: None,
        }
    }

    /// A node directory with the hostpath driver serving and registered through the
    /// registrar (the agent is started separately). Returns the node's index.
    pub async fn add_node(&mut self, name: &str) -> usize {
        let mut node = self.new_node(name, false);
        start_driver(&mut node).await;
        start_registrar(&mut node).await;
        self.nodes.push(node);
        self.nodes.len() - 1
    }

    /// [`Env::add_node`] with the recording shim (`recorder`) on the registered socket in
    /// front of the hostpath driver: returns the node's index and its NodePublishVolume
    /// requests as they arrive.
    pub async fn add_recorded_node(&mut self, name: &str) -> (usize, recorder::Publishes) {
        let publishes = recorder::Publishes::default();
        let p = publishes.clone();
        let i = self
            .add_shimmed_node(name, "recording shim", move |socket, target, stop| {
                Box::pin(async move {
                    let channel = csi_spec::connect_unix_lazy(&target)?;
                    socket
                        .serve(recorder::router(channel, p), stop.cancelled_owned())
                        .await
                })
            })
            .await;
        (i, publishes)
    }

    /// [`Env::add_node`] with a fault proxy (`csi_spec::faults`) on the registered socket in
    /// front of the hostpath driver: returns the node's index and the plan that fails calls.
    pub async fn add_faulty_node(&mut self, name: &str) -> (usize, csi_spec::faults::FaultPlan) {
        let plan = csi_spec::faults::FaultPlan::new();
        let p = plan.clone();
        let i = self
            .add_shimmed_node(name, "fault proxy", move |socket, target, stop| {
                Box::pin(async move {
                    csi_spec::faults::serve_proxy(socket, &target, p, stop.cancelled_owned()).await
                })
            })
            .await;
        (i, plan)
    }

    /// A node whose registered socket is served by `shim` (given its bound socket, the
    /// hostpath driver's own endpoint behind it and its stop token) in front of the driver.
    async fn add_shimmed_node<F>(&mut self, name: &str, what: &'static str, shim: F) -> usize
    where
        F: FnOnce(
            csi_spec::UnixSocket,
            String,
            CancellationToken,
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<(), csi_spec::Error>> + Send>,
        >,
    {
        let mut node = self.new_node(name, true);
        start_driver(&mut node).await;
        let socket =
            csi_spec::UnixSocket::bind(&format!("unix://{}", node.driver_socket.display()))
                .unwrap_or_else(|e| panic!("bind the {what}'s socket: {e}"));
        let target = format!("unix://{}", node.hostpath_socket().display());
        node.shim = Some(Task::spawn(|stop| {
            let serving = shim(socket, target, stop);
            async move { serving.await.map_err(|e| format!("{what}: {e}")) }
        }));
        start_registrar(&mut node).await;
        self.nodes.push(node);
        self.nodes.len() - 1
    }

    /// The agent's options for node `i` (fast backoff and Events).
    pub fn agent_options(&self, i: usize, mode: SkipAttachMode) -> node_agent::Options {
        let n = &self.nodes[i];
        let mut o = node_agent::Options::new(&n.name, &n.root);
        o.skip_attach = mode;
        o.backoff_initial = Duration::from_millis(100);
        o.backoff_max = Duration::from_secs(2);
        o.csi_timeout = Duration::from_secs(20);
        o.attach_timeout = Duration::from_secs(20);
        o.stuck_event_after = Duration::from_millis(500);
        o.volume_stats_period = Duration::from_millis(500);
        o.cache_sync_timeout = Duration::from_secs(30);
        o
    }

    /// Starts the agent of node `i` in-process through `node_agent::run`.
    pub fn start_agent(&mut self, i: usize, options: node_agent::Options) {
        self.start_agent_with_http(i, options, None);
    }

    /// [`Self::start_agent`] serving /metrics and /healthz on `http` (host:port).
    pub fn start_agent_with_http(
        &mut self,
        i: usize,
        options: node_agent::Options,
        http: Option<String>,
    ) {
        let mut config = node_agent::Config::new(Some(self.kubeconfig_file()), options);
        config.serving.http_endpoint = http;
        config.kube_api_qps = -1.0;
        self.nodes[i].agent = Some(Task::spawn(|stop| async move {
            node_agent::run(config, stop)
                .await
                .map_err(|e| e.to_string())
        }));
    }

    /// Stops the agent of node `i` cleanly (volumes stay mounted).
    pub async fn stop_agent(&mut self, i: usize) {
        if let Some(t) = self.nodes[i].agent.take() {
            t.stop("the node agent", PATIENCE).await;
        }
    }

    /// Stops node `i`'s driver (its socket goes away).
    pub async fn stop_driver(&mut self, i: usize) {
        if let Some(t) = self.nodes[i].driver.take() {
            t.abandon("the hostpath driver", PATIENCE).await;
        }
    }

    pub async fn restart_driver(&mut self, i: usize) {
        self.stop_driver(i).await;
        start_driver(&mut self.nodes[i]).await;
    }

    /// Stops everything and unmounts what the agents left (a failed test's leftovers).
    pub async fn shutdown(mut self) {
        for (what, t) in [
            ("the attach/detach controller", self.adc.take()),
            ("the attacher", self.attacher.take()),
        ] {
            if let Some(t) = t {
                t.abandon(what, PATIENCE).await;
            }
        }
        for n in &mut self.nodes {
            for (what, t) in [
                ("the node agent", n.agent.take()),
                ("the registrar", n.registrar.take()),
                ("the CSI shim", n.shim.take()),
                ("the hostpath driver", n.driver.take()),
            ] {
                if let Some(t) = t {
                    t.abandon(&format!("{what} of {}", n.name), PATIENCE).await;
                }
            }
        }
        test_support::unmount_all_below(self.dir.path());
        if let Some(server) = self.server.take() {
            server.shutdown().await.expect("api server shutdown");
        }
    }

    // ---- objects ----

    pub async fn create_csidriver(&self, attach_required: bool) {
        create_json::<CSIDriver>(
            Api::all(self.kube.clone()),
            // As deploy/'s hostpath CSIDriver: inline volumes allowed, the pod's info (with
            // the ephemeral flag the driver tells inline volumes by) on publish.
            json!({"metadata": {"name": DRIVER}, "spec": {
                "attachRequired": attach_required,
                "podInfoOnMount": true,
                "volumeLifecycleModes": ["Persistent", "Ephemeral"],
            }}),
        )
        .await;
    }

    /// A hostpath volume (CreateVolume on node `i`'s driver), its PV and a PVC bound to it
    /// (as the PV controller would bind them). Returns the volume handle.
    pub async fn create_bound_claim(&self, i: usize, pv: &str, pvc: &str, block: bool) -> String {
        self.create_bound_claim_with(i, pv, pvc, block, json!({}))
            .await
    }

    /// [`Env::create_bound_claim`] with `csi_extra`'s fields added to the PV's `spec.csi`
    /// (secret references, say).
    pub async fn create_bound_claim_with(
        &self,
        i: usize,
        pv: &str,
        pvc: &str,
        block: bool,
        csi_extra: Value,
    ) -> String {
        use csi_spec::v1::controller_client::ControllerClient;
        use csi_spec::v1::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
        use csi_spec::v1::{CapacityRange, CreateVolumeRequest, VolumeCapability};
        let channel =
            csi_spec::connect_unix(&self.nodes[i].hostpath_socket().display().to_string())
                .await
                .unwrap();
        let access_type = if block {
            AccessType::Block(BlockVolume {})
        } else {
            AccessType::Mount(MountVolume::default())
        };
        let created = ControllerClient::new(channel)
            .create_volume(CreateVolumeRequest {
                name: pv.into(),
                capacity_range: Some(CapacityRange {
                    required_bytes: 16 << 20,
                    limit_bytes: 0,
                }),
                volume_capabilities: vec![VolumeCapability {
                    access_type: Some(access_type),
                    access_mode: Some(AccessMode { mode: 1 }),
                }],
                ..Default::default()
            })
            .await
            .expect("CreateVolume")
            .into_inner()
            .volume
            .unwrap();
        let claim = create_json::<PersistentVolumeClaim>(
            Api::namespaced(self.kube.clone(), NS),
            json!({
                "metadata": {"name": pvc},
                "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": pv,
                         "volumeMode": if block { "Block" } else { "Filesystem" },
                         "resources": {"requests": {"storage": "16Mi"}}},
            }),
        )
        .await;
        let mut csi = json!({"driver": DRIVER, "volumeHandle": created.volume_id,
                             "volumeAttributes": created.volume_context});
        if let (Some(csi), Some(extra)) = (csi.as_object_mut(), csi_extra.as_object()) {
            csi.extend(extra.clone());
        }
        create_json::<PersistentVolume>(
            Api::all(self.kube.clone()),
            json!({
                "metadata": {"name": pv},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "capacity": {"storage": "16Mi"},
                    "volumeMode": if block { "Block" } else { "Filesystem" },
                    "claimRef": {"name": pvc, "namespace": NS, "uid": claim.metadata.uid},
                    "csi": csi,
                },
            }),
        )
        .await;
        Api::<PersistentVolumeClaim>::namespaced(self.kube.clone(), NS)
            .patch_status(
                pvc,
                &PatchParams::default(),
                &Patch::Merge(&json!({"status": {"phase": "Bound"}})),
            )
            .await
            .expect("bind PVC");
        created.volume_id
    }

    /// A pod on `node` using claim `pvc` as volume `data`.
    pub async fn create_pod(&self, name: &str, node: &str, pvc: &str) -> Pod {
        create_json::<Pod>(
            Api::namespaced(self.kube.clone(), NS),
            json!({
                "metadata": {"name": name},
                "spec": {
                    "nodeName": node,
                    "containers": [{"name": "c", "image": "busybox"}],
                    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": pvc}}],
                },
            }),
        )
        .await
    }

    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.kube.clone(), NS)
    }

    /// Waits until `node`'s CSINode lists the hostpath driver (its registration went through:
    /// NodeGetInfo answered).
    pub async fn wait_registered(&self, node: &str) {
        let csinodes: Api<CSINode> = Api::all(self.kube.clone());
        test_support::eventually("the driver on the CSINode", PATIENCE, || async {
            let c = csinodes.get_opt(node).await.ok()??;
            c.spec
                .drivers
                .iter()
                .any(|d| d.name == DRIVER)
                .then_some(())
        })
        .await;
    }

    /// The message of the first Event in the test namespace with `reason` (any reason when
    /// `None`) whose message contains `needle`, waiting for it.
    pub async fn event_message(&self, reason: Option<&str>, needle: &str) -> String {
        let events: Api<Event> = Api::namespaced(self.kube.clone(), NS);
        test_support::eventually(
            &format!("an Event ({reason:?}) saying {needle:?}"),
            PATIENCE,
            || async {
                let list = events.list(&ListParams::default()).await.ok()?;
                list.items
                    .into_iter()
                    .filter(|e| reason.is_none() || e.reason.as_deref() == reason)
                    .filter_map(|e| e.message)
                    .find(|m| m.contains(needle))
            },
        )
        .await
    }

    pub fn nodes_api(&self) -> Api<Node> {
        Api::all(self.kube.clone())
    }

    /// Waits until the pod is Ready and returns its `csi.rs/volume-paths` annotation.
    pub async fn wait_ready(&self, pod: &str) -> std::collections::BTreeMap<String, String> {
        let pods = self.pods();
        test_support::eventually(&format!("pod {pod} Ready"), PATIENCE, || async {
            let p = pods.get_opt(pod).await.ok()??;
            let ready = p
                .status
                .as_ref()?
                .conditions
                .as_ref()?
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            if !ready {
                return None;
            }
            let paths = p
                .metadata
                .annotations
                .as_ref()?
                .get("csi.rs/volume-paths")?;
            serde_json::from_str(paths).ok()
        })
        .await
    }

    /// Deletes the pod and waits until the agent confirmed the deletion (it is gone).
    pub async fn delete_pod_and_wait(&self, pod: &str) {
        let pods = self.pods();
        pods.delete(pod, &Default::default())
            .await
            .expect("delete pod");
        test_support::eventually(&format!("pod {pod} gone"), PATIENCE, || async {
            match pods.get_opt(pod).await {
                Ok(None) => Some(()),
                _ => None,
            }
        })
        .await;
    }

    /// The node's `status.volumesInUse` and `status.volumesAttached` names.
    pub async fn node_volumes(&self, node: &str) -> (Vec<String>, Vec<String>) {
        let n = self.nodes_api().get(node).await.unwrap();
        let status = n.status.unwrap_or_default();
        (
            status.volumes_in_use.unwrap_or_default(),
            status
                .volumes_attached
                .unwrap_or_default()
                .into_iter()
                .map(|a| a.name)
                .collect(),
        )
    }
}

async fn start_driver(node: &mut TestNode) {
    let config = hostpath_driver::Config {
        endpoint: format!("unix://{}", node.hostpath_socket().display()),
        node_id: node.name.clone(),
        state_dir: node.state_dir.clone(),
        ..hostpath_driver::Config::default()
    };
    let _ = std::fs::remove_file(node.hostpath_socket());
    let socket = csi_spec::UnixSocket::bind(&config.endpoint).expect("bind driver socket");
    node.driver = Some(Task::spawn(|stop| async move {
        hostpath_driver::serve(socket, config, stop.cancelled_owned())
            .await
            .map_err(|e| format!("hostpath driver: {e}"))
    }));
}

async fn start_registrar(node: &mut TestNode) {
    let config = registrar::Config {
        csi_address: node.driver_socket.display().to_string(),
        kubelet_registration_path: node.driver_socket.display().to_string(),
        plugin_registration_path: node.registry_dir(),
        timeout: Duration::from_secs(5),
        http_endpoint: None,
        mode: registrar::Mode::Registration,
        v: 0,
    };
    let running = registrar::start(&config, DRIVER.to_string())
        .await
        .expect("registrar");
    node.registrar = Some(Task::spawn(|stop| async move {
        running
            .wait(stop)
            .await
            .map_err(|e| format!("registrar: {e}"))
    }));
}

/// Whether `path` is a mount point now.
pub async fn is_mounted(path: &Path) -> bool {
    let table = mount_utils::findmnt::read().await.unwrap();
    mount_utils::findmnt::mount_at(&table, path).is_some()
}

/// GET `path` on 127.0.0.1:`port`; the body, if the status is 200.
pub async fn http_get(port: u16, path: &str) -> Option<String> {
    let (code, body) = test_support::net::try_http_get(("127.0.0.1", port), path).await?;
    (code == 200).then_some(body)
}
