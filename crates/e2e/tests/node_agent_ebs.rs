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
use std::time::Duration;

use common::{DRIVER, ZONE, aws_config, start_attacher, start_driver};
use ebs_cloud::{Cloud, CloudMetrics, DiskOptions};
use ebs_cloud_aws::AwsCloud;
use ebs_driver::{DriverConfig, Mode as DriverMode, NodeConfig, NodeInfo};
use ec2_sim::{Backing, DeviceLayout, SimConfig, Simulator, Timing};
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
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
        let Ok(bytes) = std::fs::read("/proc/self/mountinfo") else {
            return;
        };
        let Ok(table) = mount_utils::findmnt::parse(&bytes) else {
            return;
        };
        let root = mount_utils::findmnt::canonical(&self.dir);
        let mut points: Vec<PathBuf> = table
            .into_iter()
            .map(|e| e.mount_point)
            .filter(|p| p.starts_with(&root))
            .collect();
        points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for p in points {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&p)
                .status();
        }
    }
}

async fn create<K>(api: Api<K>, obj: Value) -> K
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let obj: K = serde_json::from_value(obj).unwrap();
    api.create(&PostParams::default(), &obj).await.unwrap()
}

/// One node: the EBS driver's node service for its instance, our registrar, the node agent.
async fn start_node(
    kubeconfig: &Path,
    dir: &Path,
    name: &str,
    instance: &str,
    dev_root: PathBuf,
    stop: &CancellationToken,
) -> PathBuf {
    let root = dir.join(name).join("kubelet");
    let sock_dir = root.join("plugins").join(DRIVER);
    std::fs::create_dir_all(&sock_dir).unwrap();
    std::fs::create_dir_all(root.join("plugins_registry")).unwrap();
    std::fs::create_dir_all(&dev_root).unwrap();
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
    create::<Pod>(
        Api::namespaced(kube.clone(), NS),
        json!({
            "metadata": {"name": name},
            "spec": {
                "nodeName": node,
                "containers": [{"name": "c", "image": "busybox"}],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "claim-1"}}],
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ebs_volume_moves_from_node_a_to_node_b_with_its_data() {
    if !Path::new("/dev/loop-control").exists() {
        test_support::skip_or_fail("needs loop devices (/dev/loop-control) and root");
        return;
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
    let cloud = AwsCloud::new(aws.clone(), CloudMetrics::new())
        .await
        .unwrap();
    let instance_a = cloud
        .run_instance("e2e-a", Some(ZONE))
        .await
        .unwrap()
        .instance_id;
    let instance_b = cloud
        .run_instance("e2e-b", Some(ZONE))
        .await
        .unwrap()
        .instance_id;
    let volume_id = cloud
        .create_disk(
            "e2e-node-agent",
            &DiskOptions {
                size_gib: 1,
                volume_type: "gp3".into(),
                zone: ZONE.into(),
                ..Default::default()
            },
        )
        .await
        .unwrap()
        .volume_id;

    let server = apiserver::ApiServer::start(apiserver::Config {
        listen: ([127, 0, 0, 1], 0).into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let kube = server.client();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, server.kubeconfig_yaml()).unwrap();

    // The control plane: the EBS driver's controller service, csi-attacher, the ADC.
    let ctrl_endpoint = format!("unix://{}", dir.path().join("ctrl.sock").display());
    let _driver = start_driver(&ctrl_endpoint, aws).await;
    start_attacher(kube.clone(), &ctrl_endpoint, None, stop.clone()).await;
    let adc_options = attach_detach::Options {
        skip_attach: SkipAttachMode::BypassAdc,
        backoff_initial: Duration::from_millis(100),
        backoff_max: Duration::from_secs(2),
        ..attach_detach::Options::default()
    };
    tokio::spawn(attach_detach::run(
        attach_detach::Config::new(Some(kubeconfig.clone()), adc_options),
        stop.clone(),
    ));
    create::<CSIDriver>(
        Api::all(kube.clone()),
        json!({"metadata": {"name": DRIVER}, "spec": {"attachRequired": true}}),
    )
    .await;

    let root_a = start_node(
        &kubeconfig,
        dir.path(),
        "node-a",
        &instance_a,
        sim.node_dev_root(&instance_a),
        &stop,
    )
    .await;
    let root_b = start_node(
        &kubeconfig,
        dir.path(),
        "node-b",
        &instance_b,
        sim.node_dev_root(&instance_b),
        &stop,
    )
    .await;

    let claim = create::<PersistentVolumeClaim>(
        Api::namespaced(kube.clone(), NS),
        json!({"metadata": {"name": "claim-1"},
               "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": "pv-1",
                        "resources": {"requests": {"storage": "1Gi"}}}}),
    )
    .await;
    create::<PersistentVolume>(
        Api::all(kube.clone()),
        json!({"metadata": {"name": "pv-1"},
               "spec": {"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"},
                        "claimRef": {"name": "claim-1", "namespace": NS, "uid": claim.metadata.uid},
                        "csi": {"driver": DRIVER, "volumeHandle": volume_id, "fsType": "ext4"}}}),
    )
    .await;
    Api::<PersistentVolumeClaim>::namespaced(kube.clone(), NS)
        .patch_status(
            "claim-1",
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"phase": "Bound"}})),
        )
        .await
        .unwrap();
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
    test_support::eventually("the volume detached in EC2", PATIENCE, || async {
        let v = cloud.get_disk_by_id(&volume_id).await.ok()?;
        v.attachments.is_empty().then_some(())
    })
    .await;

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
    test_support::eventually("detached from instance B", PATIENCE, || async {
        let v = cloud.get_disk_by_id(&volume_id).await.ok()?;
        v.attachments.is_empty().then_some(())
    })
    .await;
    drop(cleanup);
    server.shutdown().await.unwrap();
    sim.shutdown().await.unwrap();
}
