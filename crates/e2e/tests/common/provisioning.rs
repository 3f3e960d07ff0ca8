//! Dynamic provisioning end to end: the PV controller and the external provisioner, both built
//! in-process from their libraries, next to a real CSI driver on a unix socket (the EBS driver
//! on ec2-sim through aws-sdk-ec2, or the hostpath driver), against apiserver-lite.
//!
//! Which path made a volume is told apart by who called: the provisioner's
//! `csi_sidecar_operations_seconds` (every CSI call it made, with `migrated`), the PV
//! controller's own EC2 client (`CloudMetrics`: the in-tree provisioner and deleter) and
//! ec2-sim's count of every EC2 call it answered.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use super::DRIVER;

/// How long anything may take before a test gives up (loaded 2-core machines, two copies of a
/// test binary at once).
pub const PATIENCE: Duration = Duration::from_secs(90);
pub const NS: &str = "default";
/// The EBS driver's own zone key (its CSINode topology key).
pub const EBS_ZONE_KEY: &str = "topology.ebs.csi.aws.com/zone";
pub const WELL_KNOWN_ZONE_KEY: &str = "topology.kubernetes.io/zone";
pub const IN_TREE_EBS: &str = "kubernetes.io/aws-ebs";
/// kube-controller-manager's default `--cluster-name`, also the driver's `--k8s-tag-cluster-id`.
pub const CLUSTER_NAME: &str = "kubernetes";
pub const CREATE_VOLUME: &str = "/csi.v1.Controller/CreateVolume";
pub const DELETE_VOLUME: &str = "/csi.v1.Controller/DeleteVolume";

pub use test_support::init_tracing;

pub async fn eventually<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    test_support::eventually(what, PATIENCE, check).await
}

/// Cancels a token when dropped: in-process controllers stop also when an assertion fails.
pub struct CancelOnDrop(pub CancellationToken);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// A controller task started from its library; stopped on drop.
/// A controller under test.
pub type Task<E> = test_support::ComponentTask<E>;

/// The provisioner's controller, with the registry its CSI call metrics live in.
pub struct Provisioner {
    pub task: Task<provisioner::Error>,
    registry: Registry,
}

impl Provisioner {
    /// CSI calls of `method` (full gRPC path) it made with outcome OK; `migrated`: only those of
    /// migrated in-tree volumes (`Some(true)`), only CSI ones (`Some(false)`), or all.
    pub fn calls(&self, method: &str, migrated: Option<bool>) -> u64 {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry).unwrap();
        text.lines()
            .filter(|l| l.starts_with("csi_sidecar_operations_seconds_count{"))
            .filter(|l| l.contains(&format!("method_name=\"{method}\"")))
            .filter(|l| l.contains("grpc_status_code=\"OK\""))
            .filter(|l| match migrated {
                Some(m) => l.contains(&format!("migrated=\"{m}\"")),
                None => true,
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    }

    /// CSI calls of `method` with any outcome.
    pub fn attempts(&self, method: &str) -> u64 {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry).unwrap();
        text.lines()
            .filter(|l| l.starts_with("csi_sidecar_operations_seconds_count{"))
            .filter(|l| l.contains(&format!("method_name=\"{method}\"")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    }
}

/// Fast retries and topology on; the rest as the Go sidecar's defaults.
pub fn provisioner_options() -> provisioner::Options {
    provisioner::Options {
        timeout: Duration::from_secs(30),
        workers: 4,
        retry_interval_start: Duration::from_millis(100),
        retry_interval_max: Duration::from_secs(1),
        extra_create_metadata: true,
        topology: true,
        ..provisioner::Options::default()
    }
}

/// `csi-provisioner`'s flags for the driver at `endpoint`, parsed as the binary parses them.
pub fn provisioner_config(endpoint: &str) -> provisioner::Config {
    use clap::Parser;
    let args = [
        "csi-provisioner".to_string(),
        format!("--csi-address={endpoint}"),
    ]
    .into_iter()
    .map(std::ffi::OsString::from);
    provisioner::Config::try_parse_from(component_runtime::normalize_go_args(args)).unwrap()
}

/// The provisioner's controller for the driver at `endpoint`, from its library.
pub async fn start_provisioner(
    kube: Client,
    endpoint: &str,
    options: provisioner::Options,
) -> Provisioner {
    let stop = CancellationToken::new();
    let driver = provisioner::connect_driver(&provisioner_config(endpoint), &stop)
        .await
        .unwrap();
    let mut registry = Registry::default();
    let operations = component_runtime::OperationMetrics::register(&mut registry, &driver.name);
    let controller =
        provisioner::Controller::new(kube, driver, options, &mut registry, Some(operations));
    Provisioner {
        task: Task::spawn(|stop| controller.run(stop)),
        registry,
    }
}

/// The PV controller's options for tests: short sync period and backoff.
pub fn pv_controller_options(feature_gates: &str) -> pv_controller::Options {
    pv_controller::Options {
        migrated: volume_plugins::MigratedPlugins::from_feature_gates(feature_gates).unwrap(),
        sync_period: Duration::from_secs(1),
        backoff_initial: Duration::from_millis(100),
        backoff_max: Duration::from_secs(1),
        cache_sync_timeout: Duration::from_secs(60),
        ..pv_controller::Options::default()
    }
}

/// The PV controller through `pv_controller::run` on its own client (its User-Agent);
/// `cloud`: its EC2 for the in-tree aws-ebs provisioner (`--cloud-provider=aws`).
pub async fn start_pv_controller(
    server: &apiserver::RunningApiServer,
    options: pv_controller::Options,
    cloud: Option<Arc<dyn ebs_cloud::Cloud>>,
) -> Task<pv_controller::Error> {
    let config = server.kube_config().unwrap();
    let client =
        component_runtime::rate_limited(config, &pv_controller::user_agent(), -1.0, 0).unwrap();
    let mut config = pv_controller::Config::new(options);
    config.cloud = cloud;
    Task::spawn(|stop| pv_controller::run(client, config, stop))
}

/// Creating and reading the Kubernetes objects of a test.
#[derive(Clone)]
pub struct Objects {
    pub kube: Client,
}

impl Objects {
    pub fn pvcs(&self) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.kube.clone(), NS)
    }

    pub fn pvs(&self) -> Api<PersistentVolume> {
        Api::all(self.kube.clone())
    }

    pub async fn create_class(&self, class: StorageClass) {
        Api::<StorageClass>::all(self.kube.clone())
            .create(&PostParams::default(), &class)
            .await
            .unwrap();
    }

    pub async fn create_pvc(&self, pvc: PersistentVolumeClaim) -> PersistentVolumeClaim {
        self.pvcs()
            .create(&PostParams::default(), &pvc)
            .await
            .unwrap()
    }

    pub async fn create_pv(&self, pv: PersistentVolume) -> PersistentVolume {
        self.pvs()
            .create(&PostParams::default(), &pv)
            .await
            .unwrap()
    }

    pub async fn delete_pvc(&self, name: &str) {
        self.pvcs()
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }

    pub async fn annotate_pvc(&self, name: &str, key: &str, value: &str) {
        let patch = serde_json::json!({"metadata": {"annotations": {key: value}}});
        self.pvcs()
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }

    pub async fn pvc(&self, name: &str) -> Option<PersistentVolumeClaim> {
        self.pvcs().get_opt(name).await.unwrap()
    }

    pub async fn pv(&self, name: &str) -> Option<PersistentVolume> {
        self.pvs().get_opt(name).await.unwrap()
    }

    /// Waits until the claim is Bound (both sides written) and returns it with its PV.
    pub async fn wait_bound(&self, name: &str) -> (PersistentVolumeClaim, PersistentVolume) {
        eventually(&format!("claim {name} Bound to a Bound PV"), || async {
            let pvc = self.pvc(name).await?;
            let phase = pvc.status.as_ref()?.phase.as_deref()?;
            let volume = pvc.spec.as_ref()?.volume_name.clone()?;
            let pv = self.pv(&volume).await?;
            (phase == "Bound" && pv.status.as_ref()?.phase.as_deref() == Some("Bound"))
                .then_some((pvc, pv))
        })
        .await
    }

    /// A Node with `labels` and its CSINode listing `driver` with `keys` (node ID `node_id`).
    pub async fn create_node(
        &self,
        name: &str,
        driver: &str,
        node_id: &str,
        labels: &[(&str, &str)],
        keys: &[&str],
    ) {
        let node = test_support::objects::node(name, labels);
        Api::<Node>::all(self.kube.clone())
            .create(&PostParams::default(), &node)
            .await
            .unwrap();
        let csinode = test_support::objects::csinode_with_topology(name, driver, node_id, keys);
        Api::<CSINode>::all(self.kube.clone())
            .create(&PostParams::default(), &csinode)
            .await
            .unwrap();
    }

    /// An EBS node in `zone`: labels and CSINode topology key as the EBS driver's node plugin
    /// and the kubelet write them.
    pub async fn create_ebs_node(&self, name: &str, zone: &str) {
        self.create_node(
            name,
            DRIVER,
            &format!("i-{name}"),
            &[(EBS_ZONE_KEY, zone), (WELL_KNOWN_ZONE_KEY, zone)],
            &[EBS_ZONE_KEY],
        )
        .await;
    }

    /// Events about the object `name`: (reason, message).
    pub async fn events_of(&self, name: &str) -> Vec<(String, String)> {
        Api::<Event>::namespaced(self.kube.clone(), NS)
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.involved_object.name.as_deref() == Some(name))
            .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
            .collect()
    }

    pub async fn wait_event(&self, name: &str, reason: &str) -> String {
        eventually(&format!("a {reason} Event on {name}"), || async {
            self.events_of(name)
                .await
                .into_iter()
                .find(|(r, _)| r == reason)
                .map(|(_, m)| m)
        })
        .await
    }
}

pub fn strings(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect()
}

/// A StorageClass; `mode`: `Immediate` or `WaitForFirstConsumer`; `reclaim`: `Delete`/`Retain`.
pub fn class(
    name: &str,
    provisioner: &str,
    mode: &str,
    reclaim: &str,
    params: &[(&str, &str)],
) -> StorageClass {
    StorageClass {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        provisioner: provisioner.into(),
        parameters: (!params.is_empty()).then(|| strings(params)),
        volume_binding_mode: Some(mode.into()),
        reclaim_policy: Some(reclaim.into()),
        ..Default::default()
    }
}

/// A ReadWriteOnce claim of `class` for `size` (no annotations: the PV controller decides).
pub fn pvc(name: &str, class: Option<&str>, size: &str) -> PersistentVolumeClaim {
    test_support::objects::claim(NS, name, class, size)
}

/// `pvc-<uid>`: the volume and PV name both provisioners give a claim.
pub fn pv_name(claim: &PersistentVolumeClaim) -> String {
    format!("pvc-{}", claim.metadata.uid.as_deref().unwrap())
}

pub fn annotation<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations.as_ref()?.get(key).map(String::as_str)
}

/// The `csi-provisioner` binary: CSI_PROVISIONER_BIN, or beside this test in the target dir
/// (`cargo build -p provisioner --bin csi-provisioner`; scripts/test builds every binary).
pub fn provisioner_bin() -> Option<PathBuf> {
    std::env::var_os("CSI_PROVISIONER_BIN")
        .map(PathBuf::from)
        .or_else(|| {
            let exe = std::env::current_exe().ok()?;
            Some(exe.parent()?.parent()?.join("csi-provisioner")).filter(|p| p.exists())
        })
}

/// A `csi-provisioner` process; killed (SIGKILL) and reaped on drop, also when an assertion
/// fails.
pub struct ProvisionerProcess(pub std::process::Child);

impl ProvisionerProcess {
    /// Starts `bin` with a kubeconfig for `server` (written into `dir`), the driver at
    /// `endpoint`, and `args`; its stderr goes to `dir/<name>.log`.
    pub fn spawn(
        bin: &Path,
        server: &apiserver::RunningApiServer,
        dir: &Path,
        name: &str,
        endpoint: &str,
        args: &[&str],
    ) -> Self {
        let kubeconfig = server.write_kubeconfig(dir).unwrap();
        let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
        Self(
            std::process::Command::new(bin)
                .arg(format!("--kubeconfig={}", kubeconfig.display()))
                .arg(format!("--csi-address={endpoint}"))
                .args(args)
                .stdout(std::process::Stdio::null())
                .stderr(log)
                .spawn()
                .unwrap(),
        )
    }

    /// SIGKILL: no clean-up of any kind, as a node crash or an OOM kill.
    pub fn kill(mut self) {
        self.0.kill().unwrap();
        self.0.wait().unwrap();
    }

    /// SIGTERM, and waits for the process to end (it releases its Lease on the way out).
    pub async fn terminate(mut self) {
        test_support::process::terminate(&mut self.0, "csi-provisioner", PATIENCE).await;
    }
}

impl Drop for ProvisionerProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
