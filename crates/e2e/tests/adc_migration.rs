//! The "ADC and Kubelet CSI/In-tree Sync" of the migration design (docs/design/migration.md) end to
//! end: the attach/detach controller with the in-tree `kubernetes.io/aws-ebs` plugin on a real
//! aws-sdk-ec2 client, the external attacher and the EBS CSI driver in controller mode, all against
//! ec2-sim and the embedded API server.
//!
//! One node per row of the decision table, each with a pod that uses an in-tree
//! `awsElasticBlockStore` PV and a pod with the same kind of volume inline. Which path served
//! each volume is read from where the EC2 calls came from: the controller's own EC2 client
//! (in-tree plugin) or the driver's, reached through a VolumeAttachment and the attacher's
//! ControllerPublishVolume calls.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use attach_detach::{Controller, Options};
use common::{DRIVER, DriverTask, ZONE, aws_config, meta, start_attacher, start_driver};
use ebs_cloud::{AttachmentState, Cloud, CloudMetrics, DiskOptions};
use ebs_cloud_aws::AwsCloud;
use ec2_sim::{Backing, SimConfig, Simulator, Timing};
use k8s_openapi::api::core::v1::{
    AWSElasticBlockStoreVolumeSource, Event, Node, NodeSpec, ObjectReference, PersistentVolume,
    PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeClaimVolumeSource,
    PersistentVolumeSpec, Pod, PodSpec, Volume, VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;
use volume_plugins::MigratedPlugins;
use volume_plugins::names::{
    aws_ebs_unique_volume_name, csi_unique_volume_name, volume_attachment_name,
};

const PLUGIN: &str = "kubernetes.io/aws-ebs";
const NS: &str = "default";
const PATIENCE: Duration = Duration::from_secs(60);

/// Where a volume should end up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    InTree,
    Csi,
    Refused,
}

/// One row of the table: the node's CSINode / annotation and the expected path.
struct Row {
    node: &'static str,
    csinode: Option<bool>, // None: no CSINode; Some(listed): CSINode, annotation lists aws-ebs
    want: Want,
}

struct Placed {
    row_node: &'static str,
    instance: String,
    pod: String,
    pv: Option<String>,
    volume_id: String,
    want: Want,
}

/// Stops the in-process servers when the test ends, also on a failed assertion.
struct Stop(CancellationToken);

impl Drop for Stop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

fn ebs_source(volume_id: &str) -> AWSElasticBlockStoreVolumeSource {
    AWSElasticBlockStoreVolumeSource {
        volume_id: format!("aws://{ZONE}/{volume_id}"),
        fs_type: Some("ext4".into()),
        ..Default::default()
    }
}

async fn eventually<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + PATIENCE;
    loop {
        match probe().await {
            Ok(v) => return v,
            Err(last) if Instant::now() > deadline => panic!("never {what}; last: {last}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Everything but the attach/detach controller, which each phase starts with its own gates.
struct World {
    _driver: DriverTask,
    _dir: tempfile::TempDir,
    _sim: Simulator,
    kube: Client,
    _server: apiserver::RunningApiServer,
    /// The controller's EC2 client: only the in-tree plugin uses it.
    adc_cloud: Arc<AwsCloud>,
    adc_ec2: CloudMetrics,
    /// Successful ControllerPublishVolume calls from the attacher to the driver.
    publishes: Arc<AtomicU64>,
    stop: Stop,
}

async fn world() -> World {
    apiserver::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
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
    let adc_ec2 = CloudMetrics::new();
    let adc_cloud = Arc::new(AwsCloud::new(aws.clone(), adc_ec2.clone()).await.unwrap());
    let stop = Stop(CancellationToken::new());

    // The EBS driver's controller service on a unix socket, with its own EC2 client.
    let endpoint = format!("unix://{}", dir.path().join("csi.sock").display());
    let driver = start_driver(&endpoint, aws).await;

    let server = apiserver::ApiServer::start(apiserver::Config {
        listen: ([127, 0, 0, 1], 0).into(),
        ..apiserver::Config::default()
    })
    .await
    .unwrap();
    let kube = server.client();

    // The external attacher for the driver: the CSI path of a migrated volume.
    // The attacher's CSI calls, as its csi_sidecar_operations_seconds would count them.
    let publishes = Arc::new(AtomicU64::new(0));
    let counted = publishes.clone();
    let observer: attacher::metrics::CsiCallObserver =
        Arc::new(move |method: &str, code, _took, _migrated| {
            if method.ends_with("ControllerPublishVolume") && code == tonic::Code::Ok {
                counted.fetch_add(1, Ordering::Relaxed);
            }
        });
    start_attacher(kube.clone(), &endpoint, Some(observer), stop.0.clone()).await;
    World {
        _driver: driver,
        _dir: dir,
        _sim: sim,
        kube,
        _server: server,
        adc_cloud,
        adc_ec2,
        publishes,
        stop,
    }
}

impl World {
    /// Starts the controller with these migrated plugins; cancel the token to stop it.
    fn start_adc(&self, migrated: &str) -> CancellationToken {
        let options = Options {
            migrated: MigratedPlugins::from_feature_gates(migrated).unwrap(),
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(1),
            attach_timeout: Duration::from_secs(30),
            detach_timeout: Duration::from_secs(30),
            ..Options::default()
        };
        let cloud: Arc<dyn Cloud> = self.adc_cloud.clone();
        let mut registry = prometheus_client::registry::Registry::default();
        let adc = Controller::new(self.kube.clone(), options, Some(cloud), &mut registry);
        let stop = self.stop.0.child_token();
        tokio::spawn(adc.run(stop.clone()));
        stop
    }

    /// ControllerPublishVolume calls the attacher made to the driver so far.
    fn controller_publishes(&self) -> u64 {
        self.publishes.load(Ordering::Relaxed)
    }

    async fn node(&self, row: &Row) -> String {
        let instance = self
            .adc_cloud
            .run_instance(&format!("e2e-{}", row.node), Some(ZONE))
            .await
            .unwrap()
            .instance_id;
        let mut m = meta(row.node);
        m.annotations = Some(BTreeMap::from([(
            attach_detach::CONTROLLER_MANAGED_ANNOTATION.to_string(),
            "true".to_string(),
        )]));
        let node = Node {
            metadata: m,
            spec: Some(NodeSpec {
                provider_id: Some(format!("aws:///{ZONE}/{instance}")),
                ..Default::default()
            }),
            ..Default::default()
        };
        Api::<Node>::all(self.kube.clone())
            .create(&PostParams::default(), &node)
            .await
            .unwrap();
        if let Some(listed) = row.csinode {
            let mut csinode = test_support::objects::csinode(row.node, &[(DRIVER, &instance)]);
            if listed {
                csinode.metadata.annotations = Some(BTreeMap::from([(
                    "storage.alpha.kubernetes.io/migrated-plugins".to_string(),
                    PLUGIN.to_string(),
                )]));
            }
            Api::<CSINode>::all(self.kube.clone())
                .create(&PostParams::default(), &csinode)
                .await
                .unwrap();
        }
        instance
    }

    async fn volume(&self, name: &str) -> String {
        let options = DiskOptions {
            size_gib: 1,
            volume_type: "gp3".into(),
            zone: ZONE.into(),
            ..Default::default()
        };
        self.adc_cloud
            .create_disk(name, &options)
            .await
            .unwrap()
            .volume_id
    }

    /// A pod on the row's node with an in-tree PV (bound through a PVC), or inline.
    async fn place(&self, row: &Row, instance: &str, inline: bool) -> Placed {
        let kind = if inline { "inline" } else { "pv" };
        let name = format!("{}-{kind}", row.node);
        let volume_id = self.volume(&name).await;
        let source = if inline {
            Volume {
                name: "data".into(),
                aws_elastic_block_store: Some(ebs_source(&volume_id)),
                ..Default::default()
            }
        } else {
            self.bound_pv(&name, &volume_id).await;
            Volume {
                name: "data".into(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: name.clone(),
                    read_only: None,
                }),
                ..Default::default()
            }
        };
        let pod = Pod {
            metadata: meta(&name),
            spec: Some(PodSpec {
                node_name: Some(row.node.into()),
                containers: vec![k8s_openapi::api::core::v1::Container {
                    name: "app".into(),
                    image: Some("busybox".into()),
                    ..Default::default()
                }],
                volumes: Some(vec![source]),
                ..Default::default()
            }),
            ..Default::default()
        };
        Api::<Pod>::namespaced(self.kube.clone(), NS)
            .create(&PostParams::default(), &pod)
            .await
            .unwrap();
        Placed {
            row_node: row.node,
            instance: instance.to_string(),
            pod: name.clone(),
            pv: (!inline).then_some(name),
            volume_id,
            want: row.want,
        }
    }

    async fn bound_pv(&self, name: &str, volume_id: &str) {
        let pvcs = Api::<PersistentVolumeClaim>::namespaced(self.kube.clone(), NS);
        let claim = pvcs
            .create(
                &PostParams::default(),
                &PersistentVolumeClaim {
                    metadata: meta(name),
                    spec: Some(PersistentVolumeClaimSpec {
                        access_modes: Some(vec!["ReadWriteOnce".into()]),
                        volume_name: Some(name.into()),
                        storage_class_name: Some(String::new()),
                        resources: Some(VolumeResourceRequirements {
                            requests: Some(
                                [("storage".to_string(), Quantity("1Gi".into()))].into(),
                            ),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        let pv = PersistentVolume {
            metadata: meta(name),
            spec: Some(PersistentVolumeSpec {
                access_modes: Some(vec!["ReadWriteOnce".into()]),
                capacity: Some([("storage".to_string(), Quantity("1Gi".into()))].into()),
                aws_elastic_block_store: Some(ebs_source(volume_id)),
                claim_ref: Some(ObjectReference {
                    namespace: Some(NS.into()),
                    name: Some(name.into()),
                    uid: claim.metadata.uid.clone(),
                    ..Default::default()
                }),
                storage_class_name: Some(String::new()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let pvs = Api::<PersistentVolume>::all(self.kube.clone());
        pvs.create(&PostParams::default(), &pv).await.unwrap();
        let bound = serde_json::json!({"status": {"phase": "Bound"}});
        pvs.patch_status(name, &PatchParams::default(), &Patch::Merge(&bound))
            .await
            .unwrap();
        pvcs.patch_status(name, &PatchParams::default(), &Patch::Merge(&bound))
            .await
            .unwrap();
    }

    async fn volumes_attached(&self, node: &str) -> BTreeMap<String, String> {
        let node = Api::<Node>::all(self.kube.clone()).get(node).await.unwrap();
        node.status
            .and_then(|s| s.volumes_attached)
            .unwrap_or_default()
            .into_iter()
            .map(|v| (v.name, v.device_path))
            .collect()
    }

    async fn ec2_attachment(
        &self,
        volume_id: &str,
        instance: &str,
    ) -> Option<(AttachmentState, String)> {
        let disk = self.adc_cloud.get_disk_by_id(volume_id).await.unwrap();
        disk.attachment_to(instance)
            .map(|a| (a.state, a.device.clone()))
    }

    async fn pod_events(&self, pod: &str) -> Vec<Event> {
        Api::<Event>::namespaced(self.kube.clone(), NS)
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.involved_object.name.as_deref() == Some(pod))
            .collect()
    }

    /// A node per row, with a pod using an in-tree PV and one with an inline volume; waits
    /// until each volume is where its row says.
    async fn place_and_check(&self, rows: &[Row]) -> Vec<Placed> {
        let mut placed = Vec::new();
        for row in rows {
            let instance = self.node(row).await;
            placed.push(self.place(row, &instance, false).await);
            placed.push(self.place(row, &instance, true).await);
        }
        for p in &placed {
            self.check_attached(p).await;
        }
        placed
    }

    /// Waits until the volume is where the row says, and checks how it got there.
    async fn check_attached(&self, p: &Placed) {
        let csi_name = csi_unique_volume_name(DRIVER, &p.volume_id);
        // Kubernetes names an in-tree volume by its spec's volumeID as written (zone and all).
        let in_tree_name = aws_ebs_unique_volume_name(&ebs_source(&p.volume_id).volume_id);
        let va_name = volume_attachment_name(&p.volume_id, DRIVER, p.row_node);
        let vas = Api::<VolumeAttachment>::all(self.kube.clone());
        match p.want {
            Want::InTree => {
                let what = format!("{} attached in-tree on {}", p.pod, p.row_node);
                let device = eventually(&what, || async {
                    let listed = self.volumes_attached(p.row_node).await;
                    listed
                        .get(&in_tree_name)
                        .cloned()
                        .ok_or_else(|| format!("{listed:?}"))
                })
                .await;
                let (state, ec2_device) = self
                    .ec2_attachment(&p.volume_id, &p.instance)
                    .await
                    .unwrap();
                assert_eq!(state, AttachmentState::Attached, "{}", p.pod);
                assert_eq!(
                    device, ec2_device,
                    "{}: devicePath in node status vs EC2",
                    p.pod
                );
                let va = vas.get_opt(&va_name).await.unwrap();
                assert!(
                    va.is_none(),
                    "{}: the in-tree path made a VA: {va:?}",
                    p.pod
                );
                let listed = self.volumes_attached(p.row_node).await;
                assert!(!listed.contains_key(&csi_name), "{}: {listed:?}", p.pod);
            }
            Want::Csi => {
                let what = format!("{} attached through CSI on {}", p.pod, p.row_node);
                let device = eventually(&what, || async {
                    let listed = self.volumes_attached(p.row_node).await;
                    listed
                        .get(&csi_name)
                        .cloned()
                        .ok_or_else(|| format!("{listed:?}"))
                })
                .await;
                assert_eq!(device, "", "{}: a CSI volume's devicePath is empty", p.pod);
                let va = vas.get(&va_name).await.unwrap();
                assert!(va.status.as_ref().is_some_and(|s| s.attached), "{va:?}");
                assert_eq!(va.spec.attacher, DRIVER);
                match &p.pv {
                    Some(pv) => {
                        assert_eq!(va.spec.source.persistent_volume_name.as_ref(), Some(pv));
                        assert!(va.spec.source.inline_volume_spec.is_none(), "{va:?}");
                    }
                    None => {
                        assert!(va.spec.source.persistent_volume_name.is_none(), "{va:?}");
                        let spec = va.spec.source.inline_volume_spec.as_ref().unwrap();
                        let csi = spec
                            .csi
                            .as_ref()
                            .expect("the inline spec is translated to CSI");
                        assert_eq!(csi.driver, DRIVER);
                        assert_eq!(csi.volume_handle, p.volume_id);
                    }
                }
                let (state, _) = self
                    .ec2_attachment(&p.volume_id, &p.instance)
                    .await
                    .unwrap();
                assert_eq!(state, AttachmentState::Attached, "{}", p.pod);
            }
            Want::Refused => {
                let what = format!("a FailedAttachVolume Event on {}", p.pod);
                let message = eventually(&what, || async {
                    self.pod_events(&p.pod)
                        .await
                        .into_iter()
                        .find(|e| e.reason.as_deref() == Some("FailedAttachVolume"))
                        .and_then(|e| e.message)
                        .ok_or_else(|| "no Event yet".to_string())
                })
                .await;
                assert!(message.contains("migrat"), "{}: {message}", p.pod);
                let va = vas.get_opt(&va_name).await.unwrap();
                assert!(va.is_none(), "{}: refused, yet a VA: {va:?}", p.pod);
                assert!(
                    self.ec2_attachment(&p.volume_id, &p.instance)
                        .await
                        .is_none()
                );
                assert!(self.volumes_attached(p.row_node).await.is_empty());
            }
        }
    }

    /// Deletes the pod (as the kubelet finishes it: grace period 0) and waits until the volume
    /// is detached in EC2 and gone from node status and VolumeAttachments.
    async fn remove(&self, p: &Placed) {
        Api::<Pod>::namespaced(self.kube.clone(), NS)
            .delete(&p.pod, &DeleteParams::default().grace_period(0))
            .await
            .unwrap();
        let va_name = volume_attachment_name(&p.volume_id, DRIVER, p.row_node);
        let vas = Api::<VolumeAttachment>::all(self.kube.clone());
        eventually(&format!("{} detached", p.pod), || async {
            let ec2 = self.ec2_attachment(&p.volume_id, &p.instance).await;
            let va = vas.get_opt(&va_name).await.unwrap();
            let listed = self.volumes_attached(p.row_node).await;
            let ours = listed.keys().any(|k| k.ends_with(&p.volume_id));
            if ec2.is_none() && va.is_none() && !ours {
                Ok(())
            } else {
                Err(format!(
                    "EC2 {ec2:?}, VA {:?}, node status {listed:?}",
                    va.map(|v| v.status)
                ))
            }
        })
        .await;
    }
}

/// The migration design's table with the controller migrated (`CSIMigrationAWS=true`): the node
/// decides. Then the same volumes are detached, each by the path that attached it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_node_decides_when_the_controller_is_migrated() {
    let w = world().await;
    let rows = [
        Row {
            node: "no-csinode",
            csinode: None,
            want: Want::InTree,
        },
        Row {
            node: "not-migrated",
            csinode: Some(false),
            want: Want::InTree,
        },
        Row {
            node: "migrated",
            csinode: Some(true),
            want: Want::Csi,
        },
    ];
    let adc = w.start_adc("CSIMigrationAWS=true");
    let placed = w.place_and_check(&rows).await;
    // The in-tree rows called EC2 AttachVolume from the controller itself (PV + inline on two
    // nodes); the migrated row went through the attacher to the driver.
    assert_eq!(w.adc_ec2.calls("AttachVolume"), 4);
    assert_eq!(w.controller_publishes(), 2);
    for p in &placed {
        w.remove(p).await;
    }
    assert_eq!(w.adc_ec2.calls("DetachVolume"), 4);
    adc.cancel();
}

/// The rest of the table, with the controller not migrated: a node that has not migrated is
/// served in-tree; a node that has is refused (an Event, nothing attached anywhere).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_migrated_node_is_refused_by_a_controller_that_is_not() {
    let w = world().await;
    let rows = [
        Row {
            node: "not-migrated",
            csinode: Some(false),
            want: Want::InTree,
        },
        Row {
            node: "migrated",
            csinode: Some(true),
            want: Want::Refused,
        },
    ];
    let _adc = w.start_adc("CSIMigrationAWS=false");
    let placed = w.place_and_check(&rows).await;
    // The migration design's caveat: a VolumeAttachment the CSI path made for an in-tree volume (a
    // migrated controller before a downgrade without a drain) goes with the in-tree detach. The
    // attacher fulfils it (EC2 answers with the attachment that is already there).
    let in_tree_pv = placed
        .iter()
        .find(|p| p.want == Want::InTree && p.pv.is_some())
        .unwrap();
    let stale = volume_plugins::csi_plugin::new_volume_attachment(
        &volume_attachment_name(&in_tree_pv.volume_id, DRIVER, in_tree_pv.row_node),
        &volume_plugins::CsiVolume {
            driver: DRIVER.into(),
            volume_handle: in_tree_pv.volume_id.clone(),
            source: volume_plugins::AttachSource::PersistentVolume(in_tree_pv.pv.clone().unwrap()),
        },
        in_tree_pv.row_node,
    );
    let vas = Api::<VolumeAttachment>::all(w.kube.clone());
    vas.create(&PostParams::default(), &stale).await.unwrap();
    eventually(
        "the stale VolumeAttachment attached by the attacher",
        || async {
            let va = vas
                .get(stale.metadata.name.as_deref().unwrap())
                .await
                .unwrap();
            va.status
                .as_ref()
                .filter(|s| s.attached)
                .map(|_| ())
                .ok_or_else(|| format!("{:?}", va.status))
        },
    )
    .await;
    assert_eq!(w.adc_ec2.calls("AttachVolume"), 2);
    assert_eq!(
        w.controller_publishes(),
        1,
        "only the stale VolumeAttachment"
    );
    // Every detach by the path that attached (refused pods had nothing); remove() also waits
    // for the stale VolumeAttachment to be gone.
    for p in &placed {
        w.remove(p).await;
    }
    assert_eq!(w.adc_ec2.calls("DetachVolume"), 2);
    let left = vas.list(&Default::default()).await.unwrap();
    assert!(left.items.is_empty(), "{:?}", left.items);
}
