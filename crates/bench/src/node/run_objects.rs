//! The run's objects: a CSI volume per pod (CreateVolume on the driver's socket, as the
//! external-provisioner would), its PV and a PVC bound to it (status.phase Bound, as the PV
//! controller would bind them), and the pods, already scheduled (spec.nodeName). With
//! `--background N`, also N PVs, bound PVCs and pods of other nodes (no volume behind them),
//! the rest of a big cluster that the measured agents must not pay for.

use std::collections::HashMap;

use csi_spec::v1::controller_client::ControllerClient;
use csi_spec::v1::volume_capability::{AccessMode, AccessType, MountVolume};
use csi_spec::v1::{
    CapacityRange, CreateVolumeRequest, Topology, TopologyRequirement, VolumeCapability,
};
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{DeleteParams, ListParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use super::{Error, Scenario, ebs};
use crate::harness::objects::{BoundPair, OwnWrites, object};

pub(crate) const NS: &str = "default";
/// The label on every pod of the run (the pods watch selects it).
pub(crate) const POD_LABEL: &str = "app.kubernetes.io/created-by";
pub(crate) const POD_LABEL_VALUE: &str = "csi-bench-node";

pub(crate) fn pod_name(i: usize) -> String {
    format!("pod-{i:05}")
}

fn pv_name(i: usize) -> String {
    format!("pv-{i:05}")
}

fn pvc_name(i: usize) -> String {
    format!("pvc-{i:05}")
}

/// The node pod `i` runs on.
pub(crate) fn node_of(i: usize, nodes: usize) -> usize {
    i % nodes
}

/// What one volume needs: where to create it and how big.
struct VolumeSpec {
    endpoint: String,
    bytes: i64,
    fs_type: Option<&'static str>,
    zone: Option<&'static str>,
}

struct Created {
    handle: String,
    context: HashMap<String, String>,
}

async fn create_volume(name: String, spec: &VolumeSpec) -> Result<Created, Error> {
    let err = |reason: String| Error::Csi {
        op: format!("CreateVolume {name} at {}", spec.endpoint),
        reason,
    };
    let channel = csi_spec::connect_unix(&spec.endpoint)
        .await
        .map_err(|e| err(e.to_string()))?;
    let topology = spec.zone.map(|zone| {
        let t = Topology {
            segments: [(ebs::ZONE_KEY.to_string(), zone.to_string())].into(),
        };
        TopologyRequirement {
            requisite: vec![t.clone()],
            preferred: vec![t],
        }
    });
    let created = ControllerClient::new(channel)
        .create_volume(CreateVolumeRequest {
            name: name.clone(),
            capacity_range: Some(CapacityRange {
                required_bytes: spec.bytes,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![VolumeCapability {
                access_type: Some(AccessType::Mount(MountVolume {
                    fs_type: spec.fs_type.unwrap_or_default().to_string(),
                    ..MountVolume::default()
                })),
                access_mode: Some(AccessMode { mode: 1 }),
            }],
            accessibility_requirements: topology,
            ..Default::default()
        })
        .await
        .map_err(|e| err(e.to_string()))?
        .into_inner()
        .volume
        .ok_or_else(|| err("no volume in the answer".into()))?;
    Ok(Created {
        handle: created.volume_id,
        context: created.volume_context,
    })
}

/// Volume, PVC, PV and the PVC's Bound status for pod `i`.
async fn bind_one(
    kube: &Client,
    scenario: Scenario,
    driver: &str,
    spec: &VolumeSpec,
    i: usize,
) -> Result<(), Error> {
    let pv = pv_name(i);
    let created = create_volume(pv.clone(), spec).await?;
    let size = if scenario.is_ebs() { "1Gi" } else { "16Mi" };
    let mut csi = json!({"driver": driver, "volumeHandle": created.handle,
                         "volumeAttributes": created.context});
    if let Some(fs) = spec.fs_type {
        csi["fsType"] = json!(fs);
    }
    create_bound(kube, &pv, &pvc_name(i), None, size, csi).await
}

/// A PVC `pvc` and a PV `pv` bound to it (`harness::objects::OwnWrites::create_bound`),
/// labelled `POD_LABEL=label` if `label` is set.
async fn create_bound(
    kube: &Client,
    pv: &str,
    pvc: &str,
    label: Option<&str>,
    size: &str,
    csi: Value,
) -> Result<(), Error> {
    let pair = BoundPair {
        namespace: NS,
        claim: pvc,
        volume: pv,
        size,
        labels: label.map(|l| json!({POD_LABEL: l})),
        csi,
    };
    OwnWrites::default().create_bound(kube, pair).await
}

/// A volume, PV and bound PVC for every pod, `parallelism` at a time. Hostpath volumes are
/// created on the node the pod will run on (they are node-local); EBS volumes through the
/// controller, in the instances' zone.
pub(crate) async fn bind_all(
    kube: &Client,
    scenario: Scenario,
    driver: &str,
    endpoints: &[String],
    pods: usize,
    parallelism: usize,
) -> Result<(), Error> {
    let specs: Vec<VolumeSpec> = endpoints
        .iter()
        .map(|e| VolumeSpec {
            endpoint: e.clone(),
            bytes: if scenario.is_ebs() { 1 << 30 } else { 16 << 20 },
            fs_type: scenario.is_ebs().then_some("ext4"),
            zone: scenario.is_ebs().then_some(ebs::ZONE),
        })
        .collect();
    let specs = &specs;
    futures::stream::iter(0..pods)
        .map(|i| async move {
            let spec = specs
                .get(i % specs.len().max(1))
                .ok_or_else(|| Error::Config("no driver endpoint".into()))?;
            bind_one(kube, scenario, driver, spec, i).await
        })
        .buffer_unordered(parallelism)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// Pod `i` on `node`, with its PVC as volume `data`.
pub(crate) fn pod(i: usize, node: &str) -> Result<Pod, Error> {
    object(json!({
        "metadata": {"name": pod_name(i), "labels": {POD_LABEL: POD_LABEL_VALUE}},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "image": "busybox"}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": pvc_name(i)}}],
        },
    }))
}

/// The label value of the background objects (`POD_LABEL=csi-bench-node-background`): not the
/// measured pods' value, so the pods watch and the measured teardown never see them.
pub(crate) const BACKGROUND_LABEL_VALUE: &str = "csi-bench-node-background";
/// Background pod `i` runs on `elsewhere-(i % BACKGROUND_NODES)`.
pub(crate) const BACKGROUND_NODES: usize = 10;

fn background_pv_name(i: usize) -> String {
    format!("bg-pv-{i:05}")
}

fn background_pvc_name(i: usize) -> String {
    format!("bg-pvc-{i:05}")
}

fn background_pod_name(i: usize) -> String {
    format!("bg-pod-{i:05}")
}

/// Background object `i`: a PV of `driver` with a made-up volume handle (no volume exists:
/// nobody mounts it), a PVC bound to it, and a pod using the claim on `elsewhere-(i % 10)`, a
/// node with no agent and no Node object (the attach/detach controller attaches only for
/// Nodes it manages, so it leaves these pods alone).
async fn background_one(kube: &Client, driver: &str, i: usize) -> Result<(), Error> {
    let (pv, pvc) = (background_pv_name(i), background_pvc_name(i));
    let csi = json!({"driver": driver, "volumeHandle": format!("bg-vol-{i:05}")});
    create_bound(kube, &pv, &pvc, Some(BACKGROUND_LABEL_VALUE), "16Mi", csi).await?;
    let pod = json!({
        "metadata": {"name": background_pod_name(i),
                     "labels": {POD_LABEL: BACKGROUND_LABEL_VALUE}},
        "spec": {
            "nodeName": format!("elsewhere-{}", i % BACKGROUND_NODES),
            "containers": [{"name": "c", "image": "busybox"}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": pvc}}],
        },
    });
    let pods: Api<Pod> = Api::namespaced(kube.clone(), NS);
    OwnWrites::default().create(&pods, pod).await.map(drop)
}

/// `n` background objects (PV, bound PVC, pod on another node), `parallelism` at a time.
pub(crate) async fn create_background(
    kube: &Client,
    driver: &str,
    n: usize,
    parallelism: usize,
) -> Result<(), Error> {
    futures::stream::iter(0..n)
        .map(|i| background_one(kube, driver, i))
        .buffer_unordered(parallelism)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// Deletes every background object: pods (grace period 0: no agent runs on their nodes to
/// confirm a graceful deletion), then PVCs, then PVs, one deletecollection by label each; then
/// checks that none is left.
pub(crate) async fn delete_background(kube: &Client) -> Result<(), Error> {
    let kerr = |op: &str| {
        let op = op.to_string();
        move |source| Error::Kube { op, source }
    };
    let selector = format!("{POD_LABEL}={BACKGROUND_LABEL_VALUE}");
    let lp = ListParams::default().labels(&selector);
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    let pods: Api<Pod> = Api::namespaced(kube.clone(), NS);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(kube.clone(), NS);
    let volumes: Api<PersistentVolume> = Api::all(kube.clone());
    pods.delete_collection(&now, &lp)
        .await
        .map_err(kerr("deleting the background pods"))?;
    claims
        .delete_collection(&now, &lp)
        .await
        .map_err(kerr("deleting the background PVCs"))?;
    volumes
        .delete_collection(&now, &lp)
        .await
        .map_err(kerr("deleting the background PVs"))?;
    let left = [
        pods.list(&lp)
            .await
            .map_err(kerr("listing the background pods"))?
            .items
            .len(),
        claims
            .list(&lp)
            .await
            .map_err(kerr("listing the background PVCs"))?
            .items
            .len(),
        volumes
            .list(&lp)
            .await
            .map_err(kerr("listing the background PVs"))?
            .items
            .len(),
    ];
    if left != [0, 0, 0] {
        return Err(Error::Other(format!(
            "background objects left after their deletion: {} pods, {} PVCs, {} PVs",
            left[0], left[1], left[2]
        )));
    }
    Ok(())
}
