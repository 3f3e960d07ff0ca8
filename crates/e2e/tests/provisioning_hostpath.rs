//! Dynamic provisioning with the real hostpath driver (no EC2): the PV controller and the
//! external provisioner from their libraries, the hostpath CSI driver serving one node on a
//! unix socket, apiserver-lite. Volumes are directories under the driver's state dir, so what
//! the driver made or removed is read from the filesystem.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;

use common::provisioning::*;
use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, Container, PersistentVolume, PersistentVolumeClaimVolumeSource,
    PersistentVolumeSpec, Pod, PodSpec, Volume,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use tokio_util::sync::CancellationToken;

const DRIVER: &str = hostpath_driver::DEFAULT_DRIVER_NAME;
const KEY: &str = hostpath_driver::TOPOLOGY_KEY;
/// The node the driver serves (its node ID and topology value).
const NODE: &str = "node-1";
const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";

/// The hostpath driver for [`NODE`], apiserver-lite, the PV controller and the provisioner.
struct World {
    _pv_controller: Task<pv_controller::Error>,
    provisioner: Provisioner,
    _driver: CancelOnDrop,
    o: Objects,
    state_dir: PathBuf,
    _server: apiserver::RunningApiServer,
    _dir: tempfile::TempDir,
}

impl World {
    async fn start() -> Self {
        Self::start_with(provisioner_options()).await
    }

    async fn start_with(options: provisioner::Options) -> Self {
        init_tracing();
        apiserver::install_crypto_provider();
        let dir = tempfile::tempdir().unwrap();
        let state_dir = dir.path().join("hostpath");
        std::fs::create_dir_all(&state_dir).unwrap();
        let endpoint = format!("unix://{}", dir.path().join("hostpath.sock").display());
        let socket = csi_spec::UnixSocket::bind(&endpoint).unwrap();
        let config = hostpath_driver::Config {
            endpoint: endpoint.clone(),
            node_id: NODE.into(),
            state_dir: state_dir.clone(),
            ..hostpath_driver::Config::default()
        };
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        tokio::spawn(async move {
            if let Err(e) = hostpath_driver::serve(socket, config, stopped.cancelled_owned()).await
            {
                eprintln!("hostpath driver: {e}");
            }
        });
        let server = apiserver::ApiServer::start(apiserver::Config {
            listen: ([127, 0, 0, 1], 0).into(),
            ..apiserver::Config::default()
        })
        .await
        .unwrap();
        let o = Objects {
            kube: server.client(),
        };
        // The driver's node, as its registration and the kubelet make it known.
        o.create_node(NODE, DRIVER, NODE, &[(KEY, NODE)], &[KEY])
            .await;
        let pv_controller = start_pv_controller(&server, pv_controller_options(""), None).await;
        let provisioner = start_provisioner(o.kube.clone(), &endpoint, options).await;
        Self {
            _pv_controller: pv_controller,
            provisioner,
            _driver: CancelOnDrop(stop),
            o,
            state_dir,
            _server: server,
            _dir: dir,
        }
    }

    /// The directory of the volume `handle` (the driver's `volumes/<id>/`).
    fn volume_dir(&self, handle: &str) -> PathBuf {
        self.state_dir.join("volumes").join(handle)
    }

    /// The volume directories that exist.
    fn volume_dirs(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(self.state_dir.join("volumes")) else {
            return Vec::new();
        };
        let mut out: Vec<String> = entries
            .filter_map(|e| e.ok())
            .filter(|e| e.path().is_dir())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        out.sort();
        out
    }
}

fn handle(pv: &PersistentVolume) -> String {
    pv.spec
        .as_ref()
        .unwrap()
        .csi
        .as_ref()
        .unwrap()
        .volume_handle
        .clone()
}

fn affinity(pv: &PersistentVolume) -> Vec<(String, Vec<String>)> {
    pv.spec
        .as_ref()
        .unwrap()
        .node_affinity
        .as_ref()
        .unwrap()
        .required
        .as_ref()
        .unwrap()
        .node_selector_terms
        .iter()
        .flat_map(|t| t.match_expressions.clone().unwrap_or_default())
        .map(|e| (e.key, e.values.unwrap_or_default()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn immediate_claim_gets_a_directory_on_the_drivers_node() {
    let w = World::start().await;
    w.o.create_class(class("hostpath", DRIVER, "Immediate", "Delete", &[]))
        .await;
    let claim = w.o.create_pvc(pvc("data", Some("hostpath"), "1Mi")).await;
    let (_, pv) = w.o.wait_bound("data").await;
    assert_eq!(pv.metadata.name, Some(pv_name(&claim)));
    let spec = pv.spec.clone().unwrap();
    assert_eq!(spec.csi.as_ref().unwrap().driver, DRIVER);
    assert_eq!(
        annotation(&pv.metadata, "pv.kubernetes.io/provisioned-by"),
        Some(DRIVER)
    );
    assert_eq!(
        affinity(&pv),
        vec![(KEY.to_string(), vec![NODE.to_string()])]
    );
    assert!(
        w.volume_dir(&handle(&pv)).is_dir(),
        "the volume's directory"
    );
    assert_eq!(w.volume_dirs(), vec![handle(&pv)]);
    assert!(w.provisioner.calls(CREATE_VOLUME, Some(false)) >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_first_consumer_follows_the_selected_node() {
    // --strict-topology: the requisite topology is the selected node's alone (without it the
    // other nodes' segments are requisite too, and the driver would serve any claim from its
    // own node).
    let w = World::start_with(provisioner::Options {
        strict_topology: true,
        ..provisioner_options()
    })
    .await;
    // Another node the driver does not serve: its CSINode lists the driver, with its own
    // topology value.
    w.o.create_node("node-2", DRIVER, "node-2", &[(KEY, "node-2")], &[KEY])
        .await;
    w.o.create_class(class("late", DRIVER, "WaitForFirstConsumer", "Delete", &[]))
        .await;
    w.o.create_pvc(pvc("late", Some("late"), "1Mi")).await;
    w.o.wait_event("late", "WaitForFirstConsumer").await;
    assert!(w.volume_dirs().is_empty());
    assert_eq!(w.provisioner.attempts(CREATE_VOLUME), 0);

    // The scheduler picks node-2: the driver has no room there (not its node), the claim goes
    // back to the scheduler.
    w.o.annotate_pvc("late", SELECTED_NODE, "node-2").await;
    eventually("selected-node removed again", || async {
        let c = w.o.pvc("late").await?;
        annotation(&c.metadata, SELECTED_NODE)
            .is_none()
            .then_some(())
    })
    .await;
    assert!(w.volume_dirs().is_empty());

    // Then the driver's node: provisioned there.
    w.o.annotate_pvc("late", SELECTED_NODE, NODE).await;
    let (_, pv) = w.o.wait_bound("late").await;
    assert_eq!(
        affinity(&pv),
        vec![(KEY.to_string(), vec![NODE.to_string()])]
    );
    assert_eq!(w.volume_dirs(), vec![handle(&pv)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pre_created_pv_binds_without_provisioning() {
    let w = World::start().await;
    w.o.create_class(class("hostpath", DRIVER, "Immediate", "Retain", &[]))
        .await;
    w.o.create_pv(PersistentVolume {
        metadata: ObjectMeta {
            name: Some("static".into()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            capacity: Some([("storage".to_string(), Quantity("1Mi".into()))].into()),
            csi: Some(CSIPersistentVolumeSource {
                driver: DRIVER.into(),
                volume_handle: "made-by-hand".into(),
                ..Default::default()
            }),
            storage_class_name: Some("hostpath".into()),
            persistent_volume_reclaim_policy: Some("Retain".into()),
            ..Default::default()
        }),
        ..Default::default()
    })
    .await;
    eventually("the PV is Available", || async {
        let pv = w.o.pv("static").await?;
        (pv.status?.phase.as_deref() == Some("Available")).then_some(())
    })
    .await;
    w.o.create_pvc(pvc("claim", Some("hostpath"), "1Mi")).await;
    let (claim, pv) = w.o.wait_bound("claim").await;
    assert_eq!(pv.metadata.name.as_deref(), Some("static"));
    assert!(annotation(&claim.metadata, "volume.kubernetes.io/storage-provisioner").is_none());
    assert_eq!(w.provisioner.attempts(CREATE_VOLUME), 0);
    assert!(w.volume_dirs().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_in_use_is_kept_until_its_pod_goes_then_delete_removes_the_directory() {
    let w = World::start().await;
    w.o.create_class(class("hostpath", DRIVER, "Immediate", "Delete", &[]))
        .await;
    w.o.create_pvc(pvc("used", Some("hostpath"), "1Mi")).await;
    // A witness no pod uses: deleted right after, its going shows that the PV controller has
    // seen both deletions (one watch stream, in order; every pass syncs every claim).
    w.o.create_pvc(pvc("witness", Some("hostpath"), "1Mi"))
        .await;
    let (_, witness_pv) = w.o.wait_bound("witness").await;
    let (_, pv) = w.o.wait_bound("used").await;
    let dir = w.volume_dir(&handle(&pv));
    assert!(dir.is_dir());
    std::fs::write(dir.join("data"), b"kept while in use").unwrap();

    // A pod on the node uses the claim.
    let pods: Api<Pod> = Api::namespaced(w.o.kube.clone(), NS);
    pods.create(
        &PostParams::default(),
        &Pod {
            metadata: ObjectMeta {
                name: Some("app".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some(NODE.into()),
                containers: vec![Container {
                    name: "app".into(),
                    image: Some("busybox".into()),
                    ..Default::default()
                }],
                volumes: Some(vec![Volume {
                    name: "data".into(),
                    persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                        claim_name: "used".into(),
                        read_only: None,
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    w.o.delete_pvc("used").await;
    w.o.delete_pvc("witness").await;
    eventually("the unused claim is gone", || async {
        w.o.pvc("witness").await.is_none().then_some(())
    })
    .await;
    let held = w.o.pvc("used").await.expect("held by pvc-protection");
    assert!(held.metadata.deletion_timestamp.is_some());
    assert!(
        held.metadata
            .finalizers
            .unwrap_or_default()
            .contains(&"kubernetes.io/pvc-protection".to_string())
    );
    // Still there, still Bound, the data in place, while the pod runs.
    let c = w.o.pvc("used").await.expect("held by pvc-protection");
    assert_eq!(c.status.unwrap().phase.as_deref(), Some("Bound"));
    assert!(dir.join("data").is_file());
    let witness_dir = w.volume_dir(&handle(&witness_pv));
    eventually("the witness's directory removed", || async {
        (!witness_dir.exists()).then_some(())
    })
    .await;
    assert!(dir.join("data").is_file(), "the used claim's data stays");
    assert!(w.o.pvc("used").await.is_some(), "still held");
    let used_pv = w.o.pv(pv.metadata.name.as_deref().unwrap()).await.unwrap();
    assert_eq!(used_pv.status.unwrap().phase.as_deref(), Some("Bound"));

    // The pod goes: the claim goes, the PV is released and deleted with its directory.
    pods.delete(
        "app",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        },
    )
    .await
    .unwrap();
    let name = pv.metadata.name.clone().unwrap();
    eventually("claim, PV and directory gone", || async {
        (w.o.pvc("used").await.is_none() && w.o.pv(&name).await.is_none() && !dir.exists())
            .then_some(())
    })
    .await;
    assert!(w.provisioner.calls(DELETE_VOLUME, Some(false)) >= 2);
    assert!(w.volume_dirs().is_empty());
}
