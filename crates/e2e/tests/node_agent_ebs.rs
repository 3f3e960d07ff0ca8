//! An EBS volume through the whole node side, twice: a pod on node A gets the volume attached
//! (VolumeAttachment, csi-attacher, the EBS driver's ControllerPublish on ec2-sim through the
//! real aws-sdk-ec2), staged and published by node A's agent through node A's EBS driver node
//! service on a real loop device; a file is written; the pod is deleted, and the agent
//! unpublishes, unstages and clears volumesInUse so the attach/detach controller detaches it;
//! then a pod on node B gets the same volume and reads the file. Two EC2 instances, each node
//! with its own device directory (ec2-sim's per-instance layout), so node B can only see the
//! volume once EC2 attached it to instance B.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use test_support::objects::create_json;

use common::{DRIVER, ZONE, aws_config, start_attacher, start_driver};
use ebs_cloud::{Cloud, CloudMetrics, DiskOptions};
use ebs_cloud_aws::AwsCloud;
use ebs_driver::{DriverConfig, Mode as DriverMode, NodeConfig, NodeInfo};
use ec2_sim::{Backing, DeviceLayout, SimConfig, Simulator, Timing};
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use volume_plugins::SkipAttachMode;
use volume_plugins::names::csi_unique_volume_name;

const NS: &str = "default";
const PATIENCE: Duration = Duration::from_secs(90);

/// Cancels everything in-process when the test ends, and unmounts what is left below the
/// temp dir (a failed test's leftovers) before the loop devices go with ec2-sim.
struct Cleanup {
    stop: CancellationToken,
    dir: PathBuf,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        self.stop.cancel();
        test_support::unmount_all_below(&self.dir);
    }
}

/// One node: the EBS driver's node service for its instance, our registrar, the node agent.
async fn start_node(
    kubeconfig: &Path,
    dir: &Path,
    name: &str,
    instance: &str,
    dev_root: PathBuf,
    gates: &str,
    stop: &CancellationToken,
) -> PathBuf {
    let root = dir.join(name).join("kubelet");
    let sock_dir = root.join("plugins").join(DRIVER);
    std::fs::create_dir_all(&sock_dir).unwrap();
    std::fs::create_dir_all(root.join("plugins_registry")).unwrap();
    std::fs::create_dir_all(&dev_root).unwrap();
    let agent_dev_root = dev_root.clone();
    let socket = sock_dir.join("csi.sock");
    let endpoint = format!("unix://{}", socket.display());
    let config = DriverConfig {
        endpoint: endpoint.clone(),
        mode: DriverMode::Node,
        node: NodeConfig {
            dev_root,
            device_wait: Duration::from_secs(30),
            device_poll: Duration::from_millis(50),
            ..NodeConfig::default()
        },
        node_info: NodeInfo {
            node_id: instance.to_string(),
            zone: Some(ZONE.into()),
            max_volumes_per_node: 25,
        },
        ..DriverConfig::default()
    };
    let bound = csi_spec::UnixSocket::bind(&endpoint).unwrap();
    let s = stop.clone();
    tokio::spawn(async move {
        if let Err(e) = ebs_driver::serve(bound, config, s.cancelled_owned()).await {
            eprintln!("EBS node driver stopped: {e}");
        }
    });
    let reg = registrar::Config {
        csi_address: socket.display().to_string(),
        kubelet_registration_path: socket.display().to_string(),
        plugin_registration_path: root.join("plugins_registry"),
        timeout: Duration::from_secs(10),
        http_endpoint: None,
        mode: registrar::Mode::Registration,
        v: 0,
    };
    let running = registrar::start(&reg, DRIVER.to_string()).await.unwrap();
    let s = stop.clone();
    tokio::spawn(async move {
        let _ = running.wait(s).await;
    });
    let mut options = node_agent::Options::new(name, &root);
    options.provider_id = Some(format!("aws:///{ZONE}/{instance}"));
    options.backoff_initial = Duration::from_millis(100);
    options.backoff_max = Duration::from_secs(2);
    options.stuck_event_after = Duration::from_secs(1);
    options.migrated = volume_plugins::MigratedPlugins::from_feature_gates(gates).unwrap();
    options.dev_root = agent_dev_root;
    let config = node_agent::Config::new(Some(kubeconfig.to_path_buf()), options);
    tokio::spawn(node_agent::run(config, stop.clone()));
    root
}

async fn wait_ready(pods: &Api<Pod>, name: &str) -> PathBuf {
    let paths: std::collections::BTreeMap<String, String> =
        test_support::eventually(&format!("pod {name} Ready"), PATIENCE, || async {
            let p = pods.get_opt(name).await.ok()??;
            let ready = p
                .status
                .as_ref()?
                .conditions
                .as_ref()?
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            let a = p
                .metadata
                .annotations
                .as_ref()?
                .get("csi.rs/volume-paths")?;
            if !ready {
                return None;
            }
            serde_json::from_str(a).ok()
        })
        .await;
    PathBuf::from(&paths["data"])
}

async fn pod_on(kube: &Client, name: &str, node: &str) {
    pod_with_claim(kube, name, node, "claim-1").await;
}

async fn pod_with_claim(kube: &Client, name: &str, node: &str, claim: &str) {
    create_json::<Pod>(
        Api::namespaced(kube.clone(), NS),
        json!({
            "metadata": {"name": name},
            "spec": {
                "nodeName": node,
                "containers": [{"name": "c", "image": "busybox"}],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
            }
        }),
    )
    .await;
}

async fn node_volumes(kube: &Client, node: &str) -> (Vec<String>, Vec<String>) {
    let n = Api::<Node>::all(kube.clone()).get(node).await.unwrap();
    let s = n.status.unwrap_or_default();
    (
        s.volumes_in_use.unwrap_or_default(),
        s.volumes_attached
            .unwrap_or_default()
            .into_iter()
            .map(|a| a.name)
            .collect(),
    )
}

/// ec2-sim (loop devices, one device dir per instance), two instances, the API server, the
/// EBS driver's controller service, csi-attacher, the attach/detach controller (with EC2 for
/// its in-tree plugin when `adc_gates` is set) and two nodes with their agents.
struct World {
    // Dropped first: stops the tasks and unmounts leftovers before ec2-sim goes.
    cleanup: Cleanup,
    sim: Simulator,
    server: apiserver::RunningApiServer,
    cloud: Arc<AwsCloud>,
    kube: Client,
    roots: [PathBuf; 2],
    _driver: common::DriverTask,
    _dir: tempfile::TempDir,
}

impl World {
    async fn start(adc_gates: &str, node_gates: [&str; 2]) -> Option<World> {
        if !Path::new("/dev/loop-control").exists() {
            test_support::skip_or_fail("needs loop devices (/dev/loop-control) and root");
            return None;
        }
        apiserver::install_crypto_provider();
        let dir = tempfile::tempdir().unwrap();
        let cleanup = Cleanup {
            stop: CancellationToken::new(),
            dir: dir.path().to_path_buf(),
        };
        let stop = cleanup.stop.clone();
        let sim = Simulator::start(
            SimConfig {
                state_dir: dir.path().join("ec2"),
                device_dir: Some(dir.path().join("dev")),
                timing: Timing::Fast,
                backing: Backing::Loop,
                device_layout: DeviceLayout::PerInstance,
                ..SimConfig::default()
            },
            ([127, 0, 0, 1], 0).into(),
        )
        .await
        .unwrap();
        let aws = aws_config(&sim.endpoint());
        let cloud = Arc::new(
            AwsCloud::new(aws.clone(), CloudMetrics::new())
                .await
                .unwrap(),
        );
        let mut instances = Vec::new();
        for n in ["a", "b"] {
            let i = cloud
                .run_instance(&format!("e2e-{n}"), Some(ZONE))
                .await
                .unwrap();
            instances.push(i.instance_id);
        }
        let server = apiserver::ApiServer::start(apiserver::Config {
            listen: ([127, 0, 0, 1], 0).into(),
            ..Default::default()
        })
        .await
        .unwrap();
        let kube = server.client();
        let kubeconfig = server.write_kubeconfig(dir.path()).unwrap();

        // The control plane: the EBS driver's controller service, csi-attacher, the ADC.
        let ctrl_endpoint = format!("unix://{}", dir.path().join("ctrl.sock").display());
        let driver = start_driver(&ctrl_endpoint, aws).await;
        start_attacher(kube.clone(), &ctrl_endpoint, None, stop.clone()).await;
        let adc_options = attach_detach::Options {
            skip_attach: SkipAttachMode::BypassAdc,
            migrated: volume_plugins::MigratedPlugins::from_feature_gates(adc_gates).unwrap(),
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(2),
            ..attach_detach::Options::default()
        };
        let mut adc_config = attach_detach::Config::new(Some(kubeconfig.clone()), adc_options);
        adc_config.cloud = Some(cloud.clone());
        tokio::spawn(attach_detach::run(adc_config, stop.clone()));
        create_json::<CSIDriver>(
            Api::all(kube.clone()),
            json!({"metadata": {"name": DRIVER}, "spec": {"attachRequired": true}}),
        )
        .await;
        let mut roots = Vec::new();
        for (i, name) in ["node-a", "node-b"].into_iter().enumerate() {
            let root = start_node(
                &kubeconfig,
                dir.path(),
                name,
                &instances[i],
                sim.node_dev_root(&instances[i]),
                node_gates[i],
                &stop,
            )
            .await;
            roots.push(root);
        }
        let roots: [PathBuf; 2] = roots.try_into().unwrap();
        Some(World {
            cleanup,
            sim,
            server,
            cloud,
            kube,
            roots,
            _driver: driver,
            _dir: dir,
        })
    }

    async fn disk(&self, name: &str) -> String {
        self.cloud
            .create_disk(
                name,
                &DiskOptions {
                    size_gib: 1,
                    volume_type: "gp3".into(),
                    zone: ZONE.into(),
                    ..Default::default()
                },
            )
            .await
            .unwrap()
            .volume_id
    }

    /// A PVC bound to a PV with the given volume source (as the PV controller binds them).
    async fn bound_claim(&self, claim: &str, pv: &str, source: Value) {
        let c = create_json::<PersistentVolumeClaim>(
            Api::namespaced(self.kube.clone(), NS),
            json!({"metadata": {"name": claim},
                   "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": pv,
                            "resources": {"requests": {"storage": "1Gi"}}}}),
        )
        .await;
        let mut spec = json!({"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"},
                              "claimRef": {"name": claim, "namespace": NS, "uid": c.metadata.uid}});
        for (k, v) in source.as_object().unwrap() {
            spec[k] = v.clone();
        }
        create_json::<PersistentVolume>(
            Api::all(self.kube.clone()),
            json!({"metadata": {"name": pv}, "spec": spec}),
        )
        .await;
        Api::<PersistentVolumeClaim>::namespaced(self.kube.clone(), NS)
            .patch_status(
                claim,
                &PatchParams::default(),
                &Patch::Merge(&json!({"status": {"phase": "Bound"}})),
            )
            .await
            .unwrap();
    }

    async fn wait_detached(&self, volume_id: &str) {
        test_support::eventually(
            &format!("{volume_id} detached in EC2"),
            PATIENCE,
            || async {
                let v = self.cloud.get_disk_by_id(volume_id).await.ok()?;
                v.attachments.is_empty().then_some(())
            },
        )
        .await;
    }

    async fn wait_node_clean(&self, i: usize) {
        let root = self.roots[i].clone();
        test_support::eventually("nothing mounted on the node", PATIENCE, || async {
            let table = mount_utils::findmnt::read().await.ok()?;
            (!table.iter().any(|e| e.mount_point.starts_with(&root))).then_some(())
        })
        .await;
    }

    async fn shutdown(self) {
        let World {
            cleanup,
            sim,
            server,
            ..
        } = self;
        drop(cleanup);
        server.shutdown().await.unwrap();
        sim.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ebs_volume_moves_from_node_a_to_node_b_with_its_data() {
    let Some(w) = World::start("", ["", ""]).await else {
        return;
    };
    let kube = w.kube.clone();
    let (root_a, root_b) = (w.roots[0].clone(), w.roots[1].clone());
    let volume_id = w.disk("e2e-node-agent").await;
    w.bound_claim(
        "claim-1",
        "pv-1",
        json!({"csi": {"driver": DRIVER, "volumeHandle": volume_id, "fsType": "ext4"}}),
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(kube.clone(), NS);
    let unique = csi_unique_volume_name(DRIVER, &volume_id);

    // Node A: attach, stage (mkfs on the loop device), publish, write.
    pod_on(&kube, "pod-a", "node-a").await;
    let path_a = wait_ready(&pods, "pod-a").await;
    assert!(path_a.starts_with(&root_a), "{path_a:?}");
    std::fs::write(path_a.join("hello.txt"), b"written on node-a").unwrap();
    let (in_use, attached) = node_volumes(&kube, "node-a").await;
    assert!(in_use.contains(&unique) && attached.contains(&unique));
    let vas = Api::<VolumeAttachment>::all(kube.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(vas.items.len(), 1);
    let va = &vas.items[0];
    assert_eq!(va.spec.node_name, "node-a");
    assert!(va.status.as_ref().is_some_and(|s| s.attached));
    let staging_a = mount_utils::findmnt::read()
        .await
        .unwrap()
        .into_iter()
        .find(|e| e.mount_point.ends_with("globalmount") && e.mount_point.starts_with(&root_a))
        .expect("staged on node-a");
    assert_eq!(staging_a.fs_type, "ext4");

    // Pod deleted: unpublished, unstaged, volumesInUse cleared, detached from instance A.
    pods.delete("pod-a", &Default::default()).await.unwrap();
    test_support::eventually("pod-a gone", PATIENCE, || async {
        pods.get_opt("pod-a").await.ok()?.is_none().then_some(())
    })
    .await;
    test_support::eventually(
        "volumesInUse and volumesAttached of node-a cleared",
        PATIENCE,
        || async {
            let (in_use, attached) = node_volumes(&kube, "node-a").await;
            (!in_use.contains(&unique) && !attached.contains(&unique)).then_some(())
        },
    )
    .await;
    let left_on_a: Vec<_> = mount_utils::findmnt::read()
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.mount_point.starts_with(&root_a))
        .collect();
    assert!(
        left_on_a.is_empty(),
        "nothing stays mounted on node-a: {left_on_a:?}"
    );
    w.wait_detached(&volume_id).await;

    // Node B: the same volume, with the file.
    pod_on(&kube, "pod-b", "node-b").await;
    let path_b = wait_ready(&pods, "pod-b").await;
    assert!(path_b.starts_with(&root_b), "{path_b:?}");
    assert_eq!(
        std::fs::read_to_string(path_b.join("hello.txt")).unwrap(),
        "written on node-a"
    );
    pods.delete("pod-b", &Default::default()).await.unwrap();
    test_support::eventually("pod-b gone and node-b clean", PATIENCE, || async {
        pods.get_opt("pod-b").await.ok()?.is_none().then_some(())?;
        let table = mount_utils::findmnt::read().await.ok()?;
        (!table.iter().any(|e| e.mount_point.starts_with(&root_b))).then_some(())
    })
    .await;
    w.wait_detached(&volume_id).await;
    w.shutdown().await;
}

/// The migration design (docs/design/migration.md) on real nodes: the attach/detach controller
/// migrated aws-ebs and has EC2 for its in-tree plugin; node A's agent did not migrate it, node B's
/// did. An in-tree EBS PV on node A is attached by the controller itself (no VolumeAttachment) and
/// mounted by the agent's in-tree path (device under the instance's device dir, ext4, the plugin's
/// staging path); one on node B is translated, attached through a VolumeAttachment by the EBS
/// driver and staged and published through CSI. Both are written, torn down and detached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_tree_ebs_volumes_follow_each_nodes_migration_gate() {
    let Some(w) = World::start("CSIMigrationAWS=true", ["", "CSIMigrationAWS=true"]).await else {
        return;
    };
    let kube = w.kube.clone();
    let pods: Api<Pod> = Api::namespaced(kube.clone(), NS);
    let vol_a = w.disk("e2e-in-tree-a").await;
    let vol_b = w.disk("e2e-in-tree-b").await;
    for (claim, pv, vol) in [("claim-a", "pv-a", &vol_a), ("claim-b", "pv-b", &vol_b)] {
        w.bound_claim(
            claim,
            pv,
            json!({"awsElasticBlockStore": {"volumeID": format!("aws://{ZONE}/{vol}"), "fsType": "ext4"}}),
        )
        .await;
    }
    pod_with_claim(&kube, "pod-a", "node-a", "claim-a").await;
    pod_with_claim(&kube, "pod-b", "node-b", "claim-b").await;
    let path_a = wait_ready(&pods, "pod-a").await;
    let path_b = wait_ready(&pods, "pod-b").await;

    // Node A: in-tree all the way.
    assert!(
        path_a
            .to_string_lossy()
            .contains("/volumes/kubernetes.io~aws-ebs/pv-a"),
        "{path_a:?}"
    );
    let staging_a = w.roots[0]
        .join("plugins/kubernetes.io/aws-ebs/mounts/aws")
        .join(ZONE)
        .join(&vol_a);
    let table = mount_utils::findmnt::read().await.unwrap();
    let staged = mount_utils::findmnt::mount_at(&table, &staging_a).expect("in-tree staging mount");
    assert_eq!(staged.fs_type, "ext4");
    let (_, attached_a) = node_volumes(&kube, "node-a").await;
    assert!(
        attached_a.contains(&format!("kubernetes.io/aws-ebs/aws://{ZONE}/{vol_a}")),
        "{attached_a:?}"
    );
    // Node B: through CSI.
    assert!(
        path_b
            .to_string_lossy()
            .ends_with("/volumes/kubernetes.io~csi/pv-b/mount"),
        "{path_b:?}"
    );
    let (_, attached_b) = node_volumes(&kube, "node-b").await;
    assert!(
        attached_b.contains(&csi_unique_volume_name(DRIVER, &vol_b)),
        "{attached_b:?}"
    );
    let vas = Api::<VolumeAttachment>::all(kube.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    let va_volumes: Vec<String> = vas.items.iter().map(|v| v.spec.node_name.clone()).collect();
    assert_eq!(
        va_volumes,
        vec!["node-b"],
        "a VolumeAttachment only for the migrated node"
    );
    std::fs::write(path_a.join("a.txt"), b"in-tree").unwrap();
    std::fs::write(path_b.join("b.txt"), b"csi").unwrap();

    for p in ["pod-a", "pod-b"] {
        pods.delete(p, &Default::default()).await.unwrap();
    }
    w.wait_node_clean(0).await;
    w.wait_node_clean(1).await;
    w.wait_detached(&vol_a).await;
    w.wait_detached(&vol_b).await;
    test_support::eventually("both pods gone", PATIENCE, || async {
        let left = pods.list(&ListParams::default()).await.ok()?.items.len();
        (left == 0).then_some(())
    })
    .await;
    w.shutdown().await;
}
