//! `csi-cluster demo`: one EBS volume through its whole life (provisioned for a pod on node-1,
//! written, detached, attached to node-2 where the file is still there, then reached through
//! an in-tree `awsElasticBlockStore` PV with migration on, and deleted through CSI), then
//! hostpath volumes with `attachRequired: false` (no VolumeAttachment) and, after a restart of
//! the cluster on the same data dir, `attachRequired: true`.

use std::path::PathBuf;
use std::time::Duration;

use ebs_cloud::Cloud as _;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::CSIDriver;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::DemoFlags;
use super::narrator::Narrator;
use super::observe;
use crate::kube_ops::{self, wait_for};
use crate::{EBS_DRIVER, Error, HOSTPATH_DRIVER, RunningCluster, UpConfig};

/// How long any one step may take (realistic timing attaches in up to 4 s per EC2 call).
const PATIENCE: Duration = Duration::from_secs(180);

/// The file the demo writes and reads back.
const FILE: &str = "hello.txt";

/// Runs the demo on a throw-away cluster; the cluster is stopped (no mount, loop device or
/// process left) also when a step fails or Ctrl-C arrives.
pub async fn run(flags: DemoFlags, shutdown: CancellationToken) -> Result<(), Error> {
    let (data_dir, ephemeral) = super::data_dir(flags.data_dir.as_deref())?;
    let mut config = UpConfig::new(flags.nodes, &data_dir);
    config.ephemeral = false;
    config.timing = flags.timing;
    // One zone, so the EBS volume can move between any two nodes.
    config.zones = 1;
    config.port = Some(0);
    let mut n = Narrator::new();
    println!(
        "csi-cluster demo: {} nodes on {} (EC2 timing {:?}); logs in {}/logs",
        config.nodes,
        data_dir.display(),
        config.timing,
        data_dir.display()
    );

    n.step("start a cluster: API server, ec2-sim, controllers, and per node a node agent with the EBS and hostpath drivers");
    let cluster = RunningCluster::start(config.clone()).await?;
    let outcome = tokio::select! {
        r = async {
            cluster.wait_ready().await?;
            n.show(format!("nodes Ready with both drivers registered: {}", cluster.node_names().join(", ")));
            n.show(format!("try it yourself meanwhile: kubectl --kubeconfig {} get pods,pvc,pv,volumeattachments", cluster.kubeconfig().display()));
            n.proves("every component starts, registers its drivers through the plugin registration API and reports its node Ready");
            ebs_story(&cluster, &mut n).await?;
            hostpath_story(&cluster, &mut n, false).await
        } => Some(r),
        () = shutdown.cancelled() => None,
    };
    let first = finish(cluster, &mut n, outcome).await;
    if let Err(e) = first {
        return Err(cleanup_data_dir(e, &data_dir, ephemeral));
    }

    n.step("restart the cluster on the same data dir with --hostpath-attach-required");
    config.hostpath_attach_required = true;
    let cluster = RunningCluster::start(config).await?;
    let outcome = tokio::select! {
        r = async {
            cluster.wait_ready().await?;
            let driver = Api::<CSIDriver>::all(cluster.client()?)
                .get(HOSTPATH_DRIVER)
                .await
                .map_err(|e| Error::kube(format!("reading CSIDriver {HOSTPATH_DRIVER}"), e))?;
            let required = driver.spec.attach_required.unwrap_or(true);
            n.show(format!("CSIDriver {HOSTPATH_DRIVER}: attachRequired {required}"));
            if !required {
                return Err(Error::Check(format!(
                    "--hostpath-attach-required did not set CSIDriver {HOSTPATH_DRIVER}'s attachRequired"
                )));
            }
            n.proves("the cluster comes back from its data dir (API objects, EC2 state), now with a csi-attacher for the hostpath driver");
            hostpath_story(&cluster, &mut n, true).await?;
            leftovers(&cluster, &mut n).await
        } => Some(r),
        () = shutdown.cancelled() => None,
    };
    let second = finish(cluster, &mut n, outcome).await;
    if let Err(e) = second {
        return Err(cleanup_data_dir(e, &data_dir, ephemeral));
    }
    if ephemeral {
        std::fs::remove_dir_all(&data_dir)
            .map_err(|e| Error::io("removing the demo's data dir", &data_dir, e))?;
    }
    println!();
    println!(
        "csi-cluster demo: done, {} steps in {:.1} s; nothing left behind.",
        n.steps(),
        n.elapsed_secs()
    );
    Ok(())
}

/// Stops the cluster whatever happened; the first error wins.
async fn finish(
    cluster: RunningCluster,
    n: &mut Narrator,
    outcome: Option<Result<(), Error>>,
) -> Result<(), Error> {
    n.step("stop the cluster");
    let stopped = cluster.stop().await;
    match outcome {
        None => Err(Error::Interrupted(
            "the cluster was stopped and cleaned".into(),
        )),
        Some(Err(e)) => Err(e),
        Some(Ok(())) => {
            stopped?;
            n.proves("every component stops in order: no mount, loop device, socket or task is left below the data dir");
            Ok(())
        }
    }
}

/// A failed demo still removes its own temporary data dir when nothing is mounted there.
fn cleanup_data_dir(e: Error, data_dir: &std::path::Path, ephemeral: bool) -> Error {
    if ephemeral && crate::teardown::mounts_below(data_dir).is_empty() {
        let _ = std::fs::remove_dir_all(data_dir);
    }
    e
}

/// The EBS volume's story: provision, attach, write, move, in-tree PV, delete.
async fn ebs_story(cluster: &RunningCluster, n: &mut Narrator) -> Result<(), Error> {
    let client = cluster.client()?;
    let ec2 = cluster.ec2_client().await?;
    let nodes = cluster.node_names();
    let (first, second, third) = pick_three(&nodes);

    n.step(&format!(
        "a claim on ebs-sc (the default class, WaitForFirstConsumer) and a pod on {first}"
    ));
    kube_ops::create_claim(&client, "demo-data", Some("ebs-sc"), None).await?;
    kube_ops::create_pod(&client, "writer", "demo-data", first).await?;
    let pod = kube_ops::wait_pod_ready(&client, "writer", PATIENCE).await?;
    let pv = kube_ops::bound_volume(&client, "demo-data", PATIENCE).await?;
    let pv_name = pv.metadata.name.clone().unwrap_or_default();
    let volume_id = observe::volume_id(&pv)?;
    let disk = ec2
        .get_disk_by_id(&volume_id)
        .await
        .map_err(|e| Error::start("reading the EBS volume from ec2-sim", e))?;
    n.show(format!(
        "pod writer Ready on {first}; claim demo-data bound to {pv_name} = EBS {volume_id} ({} GiB {} in {}, {})",
        disk.size_gib, disk.volume_type, disk.zone, disk.state
    ));
    n.show(format!(
        "VolumeAttachments: {}",
        kube_ops::describe_attachments(&kube_ops::attachments_of(&client, &pv_name).await?)
    ));
    n.proves("the scheduler picked the node, csi-provisioner created the volume in that node's zone, csi-attacher attached it (ControllerPublishVolume → EC2 AttachVolume), the node agent staged (mkfs.ext4, mount) and published it");

    n.step(&format!("write {FILE} into the volume on {first}"));
    let path = kube_ops::data_path(&pod)?.join(FILE);
    let content = format!("written on {first} through {EBS_DRIVER} by csi-cluster demo\n");
    std::fs::write(&path, &content).map_err(|e| Error::io("writing", &path, e))?;
    n.show(format!("{} ({} bytes)", path.display(), content.len()));

    n.step(&format!(
        "delete the pod: the volume is unpublished, unstaged and detached from {first}"
    ));
    kube_ops::delete_pod(&client, "writer", PATIENCE).await?;
    observe::wait_detached(&client, &ec2, first, &pv_name, &volume_id, PATIENCE).await?;
    n.show(format!(
        "no VolumeAttachment for {pv_name}; EC2 says {volume_id} is available"
    ));
    n.proves("the attach/detach controller detached once no pod on the node used the volume, after the node agent unmounted it");

    n.step(&format!("a new pod on {second} with the same claim"));
    kube_ops::create_pod(&client, "reader", "demo-data", second).await?;
    let pod = kube_ops::wait_pod_ready(&client, "reader", PATIENCE).await?;
    check_file(n, &pod, &content)?;
    n.show(format!(
        "VolumeAttachments: {}",
        kube_ops::describe_attachments(&kube_ops::attachments_of(&client, &pv_name).await?)
    ));
    n.proves(format!(
        "the data followed the volume from {first} to {second}"
    ));

    n.step("the same EBS volume as an in-tree awsElasticBlockStore PV (migration on: served by the CSI driver)");
    kube_ops::delete_pod(&client, "reader", PATIENCE).await?;
    observe::wait_detached(&client, &ec2, second, &pv_name, &volume_id, PATIENCE).await?;
    // Keep the EBS volume while its CSI PV goes away, then hand it to an in-tree PV as a
    // cluster upgraded from in-tree days would have it.
    Api::<PersistentVolume>::all(client.clone())
        .patch(
            &pv_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"persistentVolumeReclaimPolicy": "Retain"}})),
        )
        .await
        .map_err(|e| Error::kube(format!("setting {pv_name}'s reclaim policy to Retain"), e))?;
    kube_ops::delete_claim(&client, "demo-data", PATIENCE).await?;
    Api::<PersistentVolume>::all(client.clone())
        .delete(&pv_name, &DeleteParams::default())
        .await
        .map_err(|e| Error::kube(format!("deleting PersistentVolume {pv_name}"), e))?;
    wait_pv_gone(&client, &pv_name).await?;
    kube_ops::create_pv(&client, in_tree_pv("demo-in-tree", &volume_id, &disk.zone)).await?;
    kube_ops::create_claim(&client, "demo-in-tree", None, Some("demo-in-tree")).await?;
    kube_ops::create_pod(&client, "in-tree-reader", "demo-in-tree", third).await?;
    let pod = kube_ops::wait_pod_ready(&client, "in-tree-reader", PATIENCE).await?;
    check_file(n, &pod, &content)?;
    let vas = kube_ops::attachments_of(&client, "demo-in-tree").await?;
    n.show(format!(
        "PV demo-in-tree says awsElasticBlockStore aws://{}/{volume_id}; VolumeAttachments: {}",
        disk.zone,
        kube_ops::describe_attachments(&vas)
    ));
    if !vas.iter().any(|va| va.spec.attacher == EBS_DRIVER) {
        return Err(Error::Check(format!(
            "the in-tree PV was not attached through {EBS_DRIVER}: {}",
            kube_ops::describe_attachments(&vas)
        )));
    }
    n.proves("with CSIMigrationAWS on, the attach/detach controller and the node agent translate the in-tree PV to ebs.csi.aws.com: the same volume, the same file");

    n.step("delete the pod and the claim: the in-tree PV's Delete policy deletes the EBS volume through CSI");
    kube_ops::delete_pod(&client, "in-tree-reader", PATIENCE).await?;
    kube_ops::delete_claim(&client, "demo-in-tree", PATIENCE).await?;
    wait_pv_gone(&client, "demo-in-tree").await?;
    observe::wait_volume_gone(&ec2, &volume_id, PATIENCE).await?;
    n.show(format!(
        "PV demo-in-tree is gone; EC2 no longer has {volume_id}"
    ));
    n.proves("the migrated PV controller handed the delete to csi-provisioner, which called DeleteVolume");
    Ok(())
}

/// A hostpath claim and pod; with `attach_required` the hostpath CSIDriver says
/// attachRequired: true and a VolumeAttachment must appear, else none may.
async fn hostpath_story(
    cluster: &RunningCluster,
    n: &mut Narrator,
    attach_required: bool,
) -> Result<(), Error> {
    let client = cluster.client()?;
    let nodes = cluster.node_names();
    let (node, _, _) = pick_three(&nodes);
    let suffix = if attach_required {
        "attach"
    } else {
        "noattach"
    };
    let (claim, pod_name) = (format!("hp-{suffix}"), format!("hp-pod-{suffix}"));
    n.step(&format!(
        "a hostpath claim and pod on {node} (CSIDriver {HOSTPATH_DRIVER}: attachRequired {attach_required})"
    ));
    kube_ops::create_claim(&client, &claim, Some("hostpath"), None).await?;
    kube_ops::create_pod(&client, &pod_name, &claim, node).await?;
    let pod = kube_ops::wait_pod_ready(&client, &pod_name, PATIENCE).await?;
    let pv = kube_ops::bound_volume(&client, &claim, PATIENCE).await?;
    let pv_name = pv.metadata.name.clone().unwrap_or_default();
    let path = kube_ops::data_path(&pod)?.join(FILE);
    std::fs::write(&path, "hostpath\n").map_err(|e| Error::io("writing", &path, e))?;
    let vas = kube_ops::attachments_of(&client, &pv_name).await?;
    n.show(format!(
        "pod {pod_name} Ready; {pv_name} provisioned by {node}'s hostpath driver; wrote {}",
        path.display()
    ));
    n.show(format!(
        "VolumeAttachments for {pv_name}: {}",
        kube_ops::describe_attachments(&vas)
    ));
    if attach_required {
        if !vas
            .iter()
            .any(|va| va.status.as_ref().is_some_and(|s| s.attached))
        {
            return Err(Error::Check(format!(
                "attachRequired is true but {pv_name} has no attached VolumeAttachment"
            )));
        }
        n.proves("attachRequired: true → the attach/detach controller created a VolumeAttachment and csi-attacher called ControllerPublishVolume before the mount");
    } else {
        if !vas.is_empty() {
            return Err(Error::Check(format!(
                "attachRequired is false but {pv_name} has VolumeAttachments: {}",
                kube_ops::describe_attachments(&vas)
            )));
        }
        n.proves("attachRequired: false → no VolumeAttachment at all (the skip-attach design, docs/design/skip-attach.md); the node agent mounted without waiting for one");
    }
    kube_ops::delete_pod(&client, &pod_name, PATIENCE).await?;
    kube_ops::delete_claim(&client, &claim, PATIENCE).await?;
    wait_pv_gone(&client, &pv_name).await?;
    wait_for(
        &format!("VolumeAttachments of {pv_name} gone"),
        PATIENCE,
        || async {
            Ok(kube_ops::attachments_of(&client, &pv_name)
                .await?
                .is_empty()
                .then_some(()))
        },
    )
    .await?;
    n.show(format!("deleted: pod, claim, {pv_name} and its directory"));
    Ok(())
}

/// Nothing of the demo is left in the API.
async fn leftovers(cluster: &RunningCluster, n: &mut Narrator) -> Result<(), Error> {
    let client = cluster.client()?;
    n.step("check the API is clean");
    let pvs = Api::<PersistentVolume>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| Error::kube("listing PersistentVolumes", e))?
        .items
        .len();
    let claims = Api::<PersistentVolumeClaim>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| Error::kube("listing claims", e))?
        .items
        .len();
    let vas = kube_ops::all_attachments(&client).await?.len();
    n.show(format!(
        "PersistentVolumes {pvs}, claims {claims}, VolumeAttachments {vas}"
    ));
    if pvs + claims + vas > 0 {
        return Err(Error::Check(format!(
            "left in the API: {pvs} PVs, {claims} claims, {vas} VolumeAttachments"
        )));
    }
    Ok(())
}

/// Node names for the three roles (fewer nodes: reused).
fn pick_three(nodes: &[String]) -> (&str, &str, &str) {
    let at = |i: usize| {
        nodes
            .get(i % nodes.len().max(1))
            .map_or("node-0", String::as_str)
    };
    (at(1), at(2), at(0))
}

/// An in-tree PV as kube-controller-manager's aws-ebs provisioner would have made it: the
/// volume's zone label and the provisioned-by annotation that lets the migrated
/// csi-provisioner delete it.
fn in_tree_pv(name: &str, volume_id: &str, zone: &str) -> serde_json::Value {
    json!({
        "metadata": {
            "name": name,
            "annotations": {"pv.kubernetes.io/provisioned-by": "kubernetes.io/aws-ebs"},
            "labels": {"topology.kubernetes.io/zone": zone, "topology.kubernetes.io/region": crate::REGION},
        },
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": "",
            "awsElasticBlockStore": {"volumeID": format!("aws://{zone}/{volume_id}"), "fsType": "ext4"},
        },
    })
}

async fn wait_pv_gone(client: &Client, name: &str) -> Result<(), Error> {
    let pvs = Api::<PersistentVolume>::all(client.clone());
    wait_for(
        &format!("PersistentVolume {name} gone"),
        PATIENCE,
        || async {
            match pvs.get_opt(name).await {
                Ok(None) => Ok(Some(())),
                Ok(Some(pv)) => Err(Error::Check(format!(
                    "{name} is {}",
                    pv.status.and_then(|s| s.phase).unwrap_or_default()
                ))),
                Err(e) => Err(Error::kube(format!("reading PersistentVolume {name}"), e)),
            }
        },
    )
    .await
}

/// The demo's file in the pod's volume has `content`.
fn check_file(
    n: &Narrator,
    pod: &k8s_openapi::api::core::v1::Pod,
    content: &str,
) -> Result<(), Error> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default();
    let path: PathBuf = kube_ops::data_path(pod)?.join(FILE);
    let found = std::fs::read_to_string(&path).map_err(|e| Error::io("reading", &path, e))?;
    if found != content {
        return Err(Error::Check(format!(
            "{} holds {found:?}, not {content:?}",
            path.display()
        )));
    }
    n.show(format!(
        "pod {name} Ready on {node}; {FILE} reads back: {:?}",
        found.trim_end()
    ));
    Ok(())
}
