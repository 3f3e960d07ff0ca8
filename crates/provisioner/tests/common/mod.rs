//! Shared setup: the embedded API server, a CSI driver on a real unix socket (the hostpath
//! driver or the CSI mock), and the provisioner controller built in-process from the library.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use csi_mock::{MockConfig, MockDriver};
use k8s_openapi::api::core::v1::{Event, Node, PersistentVolume, PersistentVolumeClaim, Secret};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use prometheus_client::registry::Registry;
use provisioner::{Controller, Driver, Options};
use test_support::ComponentTask;
use tokio_util::sync::CancellationToken;

#[allow(unused_imports)]
pub use provisioner::{
    MIGRATED_TO_ANNOTATION, PROVISIONED_BY_ANNOTATION, PV_FINALIZER, SELECTED_NODE_ANNOTATION,
    STORAGE_PROVISIONER_ANNOTATION,
};

/// How long anything may take before a test gives up (generous: loaded 2-core machines).
pub const PATIENCE: Duration = Duration::from_secs(60);
pub const NS: &str = "default";

pub use test_support::init_tracing;

pub async fn eventually<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    test_support::eventually(what, PATIENCE, check).await
}

/// Fast retries, topology on, the rest as in Go.
pub fn fast_options() -> Options {
    Options {
        timeout: Duration::from_secs(5),
        workers: 4,
        retry_interval_start: Duration::from_millis(50),
        retry_interval_max: Duration::from_millis(500),
        topology: true,
        ..Options::default()
    }
}

/// A mock that provisions.
pub fn provisioning_mock(name: &str) -> MockConfig {
    MockConfig {
        name: name.into(),
        create_delete_volume: true,
        accessibility_constraints: true,
        clone_volume: true,
        ..MockConfig::default()
    }
}

pub type Running = ComponentTask<provisioner::Error>;

/// A hostpath driver served in-process.
pub struct Hostpath {
    pub endpoint: String,
    pub state_dir: std::path::PathBuf,
    _task: ComponentTask<hostpath_driver::Error>,
}

impl Drop for Hostpath {
    fn drop(&mut self) {
        test_support::unmount_all_below(&self.state_dir);
    }
}

pub struct Env {
    pub server: apiserver::RunningApiServer,
    pub kube: Client,
    pub dir: tempfile::TempDir,
    pub mock: Option<MockDriver>,
    pub hostpath: Option<Hostpath>,
    pub running: Option<Running>,
}

impl Env {
    pub async fn bare() -> Self {
        Self::on(apiserver::Config::default()).await
    }

    /// [`Self::bare`] on an API server started with `config`.
    pub async fn on(config: apiserver::Config) -> Self {
        init_tracing();
        let server = apiserver::ApiServer::start(config)
            .await
            .expect("api server");
        let kube = server.client();
        Self {
            server,
            kube,
            dir: tempfile::tempdir().expect("tempdir"),
            mock: None,
            hostpath: None,
            running: None,
        }
    }

    /// Stops the API server and starts it again on the same address with `config` (which must
    /// keep its `data_dir`, so objects, certificates and tokens survive): what the
    /// controllers' watches see when the API server restarts.
    pub async fn restart_server(&mut self, config: apiserver::Config) {
        let addr = self.server.addr();
        let stand_in = apiserver::ApiServer::start(apiserver::Config::default())
            .await
            .expect("stand-in api server");
        let old = std::mem::replace(&mut self.server, stand_in);
        old.shutdown().await.expect("api server stopped");
        let again = apiserver::ApiServer::start(apiserver::Config {
            listen: addr,
            ..config
        })
        .await
        .expect("api server started again");
        let stand_in = std::mem::replace(&mut self.server, again);
        stand_in.shutdown().await.expect("stand-in stopped");
    }

    pub async fn with_mock(config: MockConfig) -> Self {
        Self::with_mock_on(apiserver::Config::default(), config).await
    }

    /// [`Self::with_mock`] on an API server started with `server`.
    pub async fn with_mock_on(server: apiserver::Config, config: MockConfig) -> Self {
        let mut env = Self::on(server).await;
        let mock_dir = env.dir.path().join("mock");
        std::fs::create_dir_all(&mock_dir).unwrap();
        env.mock = Some(csi_mock::start(&mock_dir, config).await.expect("mock"));
        env
    }

    /// The hostpath driver for node `node` (its node ID and topology value).
    pub async fn with_hostpath(node: &str) -> Self {
        let mut env = Self::bare().await;
        let state_dir = env.dir.path().join("hostpath");
        std::fs::create_dir_all(&state_dir).unwrap();
        let endpoint = format!("unix://{}", env.dir.path().join("hostpath.sock").display());
        let socket = csi_spec::UnixSocket::bind(&endpoint).unwrap();
        let config = hostpath_driver::Config {
            endpoint: endpoint.clone(),
            node_id: node.into(),
            state_dir: state_dir.clone(),
            ..hostpath_driver::Config::default()
        };
        env.hostpath = Some(Hostpath {
            endpoint,
            state_dir,
            // Never stopped on purpose (dropped with the Env): an error is printed.
            _task: ComponentTask::spawn(|stop| async move {
                let served = hostpath_driver::serve(socket, config, stop.cancelled_owned()).await;
                if let Err(e) = &served {
                    eprintln!("hostpath driver: {e}");
                }
                served
            }),
        });
        env
    }

    pub fn mock(&self) -> &MockDriver {
        self.mock.as_ref().expect("mock")
    }

    pub fn endpoint(&self) -> String {
        match (&self.mock, &self.hostpath) {
            (Some(m), _) => m.endpoint(),
            (None, Some(h)) => h.endpoint.clone(),
            _ => panic!("no driver"),
        }
    }

    /// A flags-built config for this driver.
    pub fn config(&self, extra: &[&str]) -> provisioner::Config {
        use clap::Parser;
        let endpoint = format!("--csi-address={}", self.endpoint());
        let args = ["csi-provisioner", endpoint.as_str()]
            .into_iter()
            .chain(extra.iter().copied())
            .map(std::ffi::OsString::from);
        provisioner::Config::try_parse_from(component_runtime::normalize_go_args(args)).unwrap()
    }

    pub async fn driver(&self) -> Driver {
        provisioner::connect_driver(&self.config(&[]), &CancellationToken::new())
            .await
            .expect("driver")
    }

    pub async fn start(&mut self, options: Options) {
        assert!(self.running.is_none(), "already running");
        let driver = self.driver().await;
        let mut registry = Registry::default();
        let controller = Controller::new(self.kube.clone(), driver, options, &mut registry, None);
        self.running = Some(ComponentTask::spawn(|stop| controller.run(stop)));
    }

    pub async fn stop(&mut self) {
        if let Some(r) = self.running.take() {
            r.stop("the provisioner", PATIENCE).await;
        }
    }

    pub async fn create_class(&self, class: StorageClass) {
        Api::<StorageClass>::all(self.kube.clone())
            .create(&PostParams::default(), &class)
            .await
            .expect("create class");
    }

    pub async fn create_pvc(&self, pvc: PersistentVolumeClaim) -> PersistentVolumeClaim {
        Api::<PersistentVolumeClaim>::namespaced(self.kube.clone(), NS)
            .create(&PostParams::default(), &pvc)
            .await
            .expect("create pvc")
    }

    pub async fn annotate_pvc(&self, name: &str, key: &str, value: &str) {
        let patch = serde_json::json!({"metadata": {"annotations": {key: value}}});
        Api::<PersistentVolumeClaim>::namespaced(self.kube.clone(), NS)
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("annotate pvc");
    }

    pub async fn delete_pvc(&self, name: &str) {
        Api::<PersistentVolumeClaim>::namespaced(self.kube.clone(), NS)
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete pvc");
    }

    pub async fn create_secret(&self, ns: &str, name: &str, data: &[(&str, &str)]) {
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                ..Default::default()
            },
            string_data: Some(
                data.iter()
                    .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                    .collect(),
            ),
            ..Default::default()
        };
        Api::<Secret>::namespaced(self.kube.clone(), ns)
            .create(&PostParams::default(), &secret)
            .await
            .expect("create secret");
    }

    /// A Node with `labels` and its CSINode listing `driver` with `keys`.
    pub async fn create_node(
        &self,
        name: &str,
        driver: &str,
        labels: &[(&str, &str)],
        keys: &[&str],
    ) {
        let node = test_support::objects::node(name, labels);
        Api::<Node>::all(self.kube.clone())
            .create(&PostParams::default(), &node)
            .await
            .expect("create node");
        let csinode = test_support::objects::csinode_with_topology(name, driver, name, keys);
        Api::<CSINode>::all(self.kube.clone())
            .create(&PostParams::default(), &csinode)
            .await
            .expect("create csinode");
    }

    pub async fn pv(&self, name: &str) -> Option<PersistentVolume> {
        Api::<PersistentVolume>::all(self.kube.clone())
            .get_opt(name)
            .await
            .expect("get pv")
    }

    pub async fn wait_pv(&self, name: &str) -> PersistentVolume {
        eventually(&format!("PV {name}"), || async { self.pv(name).await }).await
    }

    /// Sets the PV's phase as the PV controller would (status subresource).
    pub async fn set_pv_phase(&self, name: &str, phase: &str) {
        let patch = serde_json::json!({"status": {"phase": phase}});
        Api::<PersistentVolume>::all(self.kube.clone())
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("pv status");
    }

    /// Events on the claim `name`: (reason, message).
    pub async fn events_of(&self, name: &str) -> Vec<(String, String)> {
        Api::<Event>::namespaced(self.kube.clone(), NS)
            .list(&Default::default())
            .await
            .expect("events")
            .items
            .into_iter()
            .filter(|e| e.involved_object.name.as_deref() == Some(name))
            .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
            .collect()
    }

    pub async fn wait_event(&self, claim: &str, reason: &str, needle: &str) -> String {
        eventually(
            &format!("{reason} Event on {claim} containing {needle:?}"),
            || async {
                self.events_of(claim)
                    .await
                    .into_iter()
                    .find(|(r, m)| r == reason && m.contains(needle))
                    .map(|(_, m)| m)
            },
        )
        .await
    }
}

pub fn class(name: &str, provisioner: &str, params: &[(&str, &str)]) -> StorageClass {
    StorageClass {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        provisioner: provisioner.into(),
        parameters: (!params.is_empty()).then(|| {
            params
                .iter()
                .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                .collect()
        }),
        ..Default::default()
    }
}

/// A claim of `class` for `size`, annotated for `provisioner` as the PV controller does.
pub fn pvc(
    name: &str,
    class: &str,
    size: &str,
    provisioner: Option<&str>,
) -> PersistentVolumeClaim {
    let mut claim = test_support::objects::claim(NS, name, Some(class), size);
    claim.metadata.annotations = Some(
        provisioner
            .map(|p| (STORAGE_PROVISIONER_ANNOTATION.to_string(), p.to_string()))
            .into_iter()
            .collect(),
    );
    claim
}

/// The PV name the provisioner gives a claim.
pub fn pv_name(pvc: &PersistentVolumeClaim) -> String {
    format!("pvc-{}", pvc.metadata.uid.as_deref().unwrap())
}
