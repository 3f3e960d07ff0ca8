//! The external attacher against the real EBS CSI driver: the embedded API server, the attacher
//! controller from its library, `ebs-csi-driver` in controller mode on a unix socket, and
//! ec2-sim behind the real aws-sdk-ec2. The volumes are created with CSI CreateVolume, attached
//! because VolumeAttachments appear, and EC2 itself is asked where they ended up.
//!
//! Covers: two CSI PVs on two nodes, one in-tree `awsElasticBlockStore` PV translated by the
//! attacher (the migration design, docs/design/migration.md), detach on VolumeAttachment deletion,
//! PV finalizers released on PV deletion, and an attach that EC2 refuses (a volume in another zone)
//! recorded on the object.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{DRIVER, ZONE, aws_config, meta, start_attacher, start_driver};
use csi_spec::v1::controller_client::ControllerClient;
use csi_spec::v1::volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode};
use csi_spec::v1::{
    CapacityRange, CreateVolumeRequest, Topology, TopologyRequirement, VolumeCapability,
};
use ebs_cloud::{AttachmentState, Cloud, CloudMetrics};
use ebs_cloud_aws::AwsCloud;
use ec2_sim::{Backing, SimConfig, Simulator, Timing};
use k8s_openapi::api::core::v1::{
    AWSElasticBlockStoreVolumeSource, CSIPersistentVolumeSource, PersistentVolume,
    PersistentVolumeSpec,
};
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client, ResourceExt};
use tokio_util::sync::CancellationToken;

const FINALIZER: &str = "external-attacher/ebs-csi-aws-com";
const OTHER_ZONE: &str = "us-east-1b";
const GIB: i64 = 1 << 30;
const PATIENCE: Duration = Duration::from_secs(90);

fn mount_cap() -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: "ext4".into(),
            ..Default::default()
        })),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    }
}

async fn create_volume(
    csi: &mut ControllerClient<tonic::transport::Channel>,
    name: &str,
    zone: &str,
) -> String {
    let topology = Topology {
        segments: [("topology.kubernetes.io/zone".to_string(), zone.to_string())].into(),
    };
    csi.create_volume(CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: GIB,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![mount_cap()],
        accessibility_requirements: Some(TopologyRequirement {
            requisite: vec![topology.clone()],
            preferred: vec![topology],
        }),
        ..Default::default()
    })
    .await
    .unwrap()
    .into_inner()
    .volume
    .unwrap()
    .volume_id
}

fn pv_spec() -> PersistentVolumeSpec {
    PersistentVolumeSpec {
        access_modes: Some(vec!["ReadWriteOnce".into()]),
        capacity: Some([("storage".to_string(), Quantity("1Gi".into()))].into()),
        ..Default::default()
    }
}

fn csi_pv(name: &str, volume_id: &str) -> PersistentVolume {
    PersistentVolume {
        metadata: meta(name),
        spec: Some(PersistentVolumeSpec {
            csi: Some(CSIPersistentVolumeSource {
                driver: DRIVER.into(),
                volume_handle: volume_id.into(),
                fs_type: Some("ext4".into()),
                ..Default::default()
            }),
            ..pv_spec()
        }),
        ..Default::default()
    }
}

/// An in-tree EBS PV that migration hands to our driver (the attach/detach controller names
/// the CSI driver on the VolumeAttachment and the PV carries `migrated-to`).
fn in_tree_pv(name: &str, volume_id: &str) -> PersistentVolume {
    let mut m = meta(name);
    m.annotations = Some(BTreeMap::from([(
        "pv.kubernetes.io/migrated-to".to_string(),
        DRIVER.to_string(),
    )]));
    PersistentVolume {
        metadata: m,
        spec: Some(PersistentVolumeSpec {
            aws_elastic_block_store: Some(AWSElasticBlockStoreVolumeSource {
                volume_id: format!("aws://{ZONE}/{volume_id}"),
                fs_type: Some("ext4".into()),
                ..Default::default()
            }),
            ..pv_spec()
        }),
        ..Default::default()
    }
}

fn va(name: &str, pv: &str, node: &str) -> VolumeAttachment {
    test_support::objects::volume_attachment(name, DRIVER, pv, node)
}

/// Polls `check` on the object until it returns Some, or fails after PATIENCE.
async fn wait_for<T, F>(api: &Api<VolumeAttachment>, name: &str, what: &str, check: F) -> T
where
    F: Fn(Option<&VolumeAttachment>) -> Option<T>,
{
    let deadline = Instant::now() + PATIENCE;
    loop {
        let got = api.get_opt(name).await.unwrap();
        if let Some(v) = check(got.as_ref()) {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "{name}: never {what}; last seen {got:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn wait_gone<K>(api: &Api<K>, name: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let deadline = Instant::now() + PATIENCE;
    while let Some(o) = api.get_opt(name).await.unwrap() {
        assert!(
            Instant::now() < deadline,
            "{name} was never deleted: {o:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn attached_device(va: Option<&VolumeAttachment>) -> Option<String> {
    let status = va?.status.as_ref()?;
    if !status.attached {
        return None;
    }
    status
        .attachment_metadata
        .as_ref()?
        .get("devicePath")
        .cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn attacher_drives_the_ebs_driver_through_a_whole_life() {
    apiserver::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();

    // EC2: the simulator (file backing: the control plane is what is under test here) and two
    // instances in one zone, one per Kubernetes node.
    let sim = Simulator::start(
        SimConfig {
            state_dir: dir.path().join("ec2"),
            timing: Timing::Fast,
            backing: Backing::File,
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
    let node_a = cloud.run_instance("e2e-node-a", Some(ZONE)).await.unwrap();
    let node_b = cloud.run_instance("e2e-node-b", Some(ZONE)).await.unwrap();

    // The driver in controller mode, and three volumes made through CSI.
    let endpoint = format!("unix://{}", dir.path().join("csi.sock").display());
    let _driver = start_driver(&endpoint, aws).await;
    let channel = csi_spec::connect_unix(&endpoint).await.unwrap();
    let mut csi = ControllerClient::new(channel.clone());
    let vol_a = create_volume(&mut csi, "pvc-e2e-a", ZONE).await;
    let vol_b = create_volume(&mut csi, "pvc-e2e-b", ZONE).await;
    let vol_intree = create_volume(&mut csi, "pvc-e2e-intree", ZONE).await;
    let vol_far = create_volume(&mut csi, "pvc-e2e-far", OTHER_ZONE).await;

    // Kubernetes: CSINodes that map node names to instance IDs, PVs, and the attacher.
    let server = apiserver::ApiServer::start(apiserver::Config::default())
        .await
        .unwrap();
    let kube: Client = server.client();
    let csinodes: Api<CSINode> = Api::all(kube.clone());
    for (node, instance) in [("node-a", &node_a), ("node-b", &node_b)] {
        let c = test_support::objects::csinode(node, &[(DRIVER, &instance.instance_id)]);
        csinodes.create(&PostParams::default(), &c).await.unwrap();
    }
    let pvs: Api<PersistentVolume> = Api::all(kube.clone());
    let vas: Api<VolumeAttachment> = Api::all(kube.clone());
    for pv in [
        csi_pv("pv-a", &vol_a),
        csi_pv("pv-b", &vol_b),
        in_tree_pv("pv-intree", &vol_intree),
        csi_pv("pv-far", &vol_far),
    ] {
        pvs.create(&PostParams::default(), &pv).await.unwrap();
    }

    let stop = CancellationToken::new();
    let controller_task = start_attacher(kube.clone(), &endpoint, None, stop.clone()).await;
    let _stop_on_panic = stop.clone().drop_guard();

    // Attach: a on node-a, b on node-b, the in-tree one on node-a, the far one on node-b.
    for v in [
        va("va-a", "pv-a", "node-a"),
        va("va-b", "pv-b", "node-b"),
        va("va-intree", "pv-intree", "node-a"),
        va("va-far", "pv-far", "node-b"),
    ] {
        vas.create(&PostParams::default(), &v).await.unwrap();
    }
    let mut devices = BTreeMap::new();
    for (name, vol, instance) in [
        ("va-a", &vol_a, &node_a.instance_id),
        ("va-b", &vol_b, &node_b.instance_id),
        ("va-intree", &vol_intree, &node_a.instance_id),
    ] {
        let device = wait_for(&vas, name, "attached", attached_device).await;
        // EC2 agrees: the volume is attached to that node's instance under that device name.
        let disk = cloud.get_disk_by_id(vol).await.unwrap();
        let att = disk
            .attachment_to(instance)
            .unwrap_or_else(|| panic!("{vol} not attached to {instance}: {disk:?}"));
        assert_eq!(att.state, AttachmentState::Attached, "{disk:?}");
        assert_eq!(
            att.device, device,
            "{name}: device in attachmentMetadata vs EC2"
        );
        assert_eq!(disk.attachments.len(), 1, "{disk:?}");
        let obj = vas.get(name).await.unwrap();
        assert!(obj.finalizers().iter().any(|f| f == FINALIZER), "{obj:?}");
        devices.insert(name, device);
    }
    // Two volumes on node-a got distinct device names.
    assert_ne!(devices["va-a"], devices["va-intree"]);
    for pv in ["pv-a", "pv-b", "pv-intree"] {
        let p = pvs.get(pv).await.unwrap();
        assert!(p.finalizers().iter().any(|f| f == FINALIZER), "{pv}: {p:?}");
    }

    // A volume in another zone: EC2 refuses the attach; the error is on the object, with the
    // gRPC code, and the volume stays detached.
    let err = wait_for(&vas, "va-far", "attachError set", |v| {
        v?.status.as_ref()?.attach_error.as_ref()?.message.clone()
    })
    .await;
    assert!(!err.is_empty());
    let far = vas.get("va-far").await.unwrap();
    assert!(!far.status.as_ref().unwrap().attached);
    assert!(
        cloud
            .get_disk_by_id(&vol_far)
            .await
            .unwrap()
            .attachments
            .is_empty(),
        "a refused attach left an attachment"
    );

    // Detach: deleting the VolumeAttachments detaches in EC2, then the objects go away.
    for name in ["va-a", "va-b", "va-intree", "va-far"] {
        vas.delete(name, &DeleteParams::default()).await.unwrap();
    }
    for name in ["va-a", "va-b", "va-intree", "va-far"] {
        wait_gone(&vas, name).await;
    }
    for vol in [&vol_a, &vol_b, &vol_intree, &vol_far] {
        let disk = cloud.get_disk_by_id(vol).await.unwrap();
        assert!(
            disk.attachments.is_empty(),
            "{vol} still attached: {disk:?}"
        );
        assert_eq!(disk.state, "available", "{disk:?}");
    }

    // PVs: deleting them releases the attacher's finalizers (nothing uses them any more).
    for pv in ["pv-a", "pv-b", "pv-intree", "pv-far"] {
        pvs.delete(pv, &DeleteParams::default()).await.unwrap();
    }
    for pv in ["pv-a", "pv-b", "pv-intree", "pv-far"] {
        wait_gone(&pvs, pv).await;
    }

    stop.cancel();
    tokio::time::timeout(PATIENCE, controller_task)
        .await
        .expect("controller stops")
        .unwrap()
        .unwrap();
    server.shutdown().await.unwrap();
    sim.shutdown().await.unwrap();
}
