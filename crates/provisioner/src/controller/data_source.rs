//! `spec.dataSource` (or `dataSourceRef`) → CreateVolume's `volume_content_source`: a PVC in
//! the same namespace (CLONE_VOLUME), or a VolumeSnapshot (CREATE_DELETE_SNAPSHOT).

use csi_spec::v1::VolumeContentSource;
use csi_spec::v1::volume_content_source::{SnapshotSource, Type, VolumeSource};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::reflector::ObjectRef;

use super::Ctx;
use crate::{Error, claim, create_request};

const SNAPSHOT_GROUP: &str = "snapshot.storage.k8s.io";

pub(crate) async fn content_source(
    ctx: &Ctx,
    pvc: &PersistentVolumeClaim,
) -> Result<Option<VolumeContentSource>, Error> {
    let spec = pvc.spec.clone().unwrap_or_default();
    let (kind, group, name) = match (&spec.data_source_ref, &spec.data_source) {
        (Some(r), _) => (
            r.kind.clone(),
            r.api_group.clone().unwrap_or_default(),
            r.name.clone(),
        ),
        (None, Some(r)) => (
            r.kind.clone(),
            r.api_group.clone().unwrap_or_default(),
            r.name.clone(),
        ),
        (None, None) => return Ok(None),
    };
    let ns = pvc.metadata.namespace.clone().unwrap_or_default();
    match (kind.as_str(), group.as_str()) {
        ("PersistentVolumeClaim", "") => clone_source(ctx, pvc, &ns, &name).map(Some),
        ("VolumeSnapshot", SNAPSHOT_GROUP) => snapshot_source(ctx, &ns, &name).await.map(Some),
        // Another populator's data source: not ours to fill (the Go sidecar ignores it too).
        _ => Ok(None),
    }
}

fn clone_source(
    ctx: &Ctx,
    pvc: &PersistentVolumeClaim,
    ns: &str,
    name: &str,
) -> Result<VolumeContentSource, Error> {
    let bad = |why: String| {
        Error::InvalidClaim(format!(
            "error getting handle for DataSource Type PersistentVolumeClaim by Name {name}: {why}"
        ))
    };
    if !ctx.driver.capabilities.clone_volume {
        return Err(bad(format!(
            "the driver {} does not support cloning (no CLONE_VOLUME capability)",
            ctx.driver.name
        )));
    }
    let source = ctx
        .pvcs
        .get(&ObjectRef::new(name).within(ns))
        .ok_or_else(|| bad(format!("PersistentVolumeClaim {ns}/{name} not found")))?;
    let volume_name = source
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .filter(|v| !v.is_empty())
        .ok_or_else(|| bad("the source claim is not bound".into()))?;
    if claim::class_name(&source) != claim::class_name(pvc) {
        return Err(bad(
            "the source claim's StorageClass differs from the claim's".into(),
        ));
    }
    let (wanted, _) = create_request::capacity(pvc)?;
    let (source_size, _) = create_request::capacity(&source)?;
    if wanted < source_size {
        return Err(bad(format!(
            "the requested size {wanted} is smaller than the source's {source_size}"
        )));
    }
    let pv: std::sync::Arc<PersistentVolume> = ctx
        .pvs
        .get(&ObjectRef::new(&volume_name))
        .ok_or_else(|| bad(format!("PersistentVolume {volume_name} not found")))?;
    let csi = pv
        .spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .filter(|c| c.driver == ctx.driver.name)
        .ok_or_else(|| {
            bad(format!(
                "PersistentVolume {volume_name} is not a volume of {}",
                ctx.driver.name
            ))
        })?;
    Ok(VolumeContentSource {
        r#type: Some(Type::Volume(VolumeSource {
            volume_id: csi.volume_handle.clone(),
        })),
    })
}

async fn snapshot_source(ctx: &Ctx, ns: &str, name: &str) -> Result<VolumeContentSource, Error> {
    let bad = |why: String| {
        Error::InvalidClaim(format!(
            "error getting handle for DataSource Type VolumeSnapshot by Name {name}: {why}"
        ))
    };
    if !ctx.driver.capabilities.snapshots {
        return Err(bad(format!(
            "the driver {} does not support snapshots (no CREATE_DELETE_SNAPSHOT capability)",
            ctx.driver.name
        )));
    }
    let gvk =
        |kind: &str| ApiResource::from_gvk(&GroupVersionKind::gvk(SNAPSHOT_GROUP, "v1", kind));
    let snapshot =
        Api::<DynamicObject>::namespaced_with(ctx.client.clone(), ns, &gvk("VolumeSnapshot"))
            .get(name)
            .await
            .map_err(|e| Error::kube(format!("reading VolumeSnapshot {ns}/{name}"), e))?;
    let status = snapshot.data.get("status");
    let ready = status
        .and_then(|s| s.get("readyToUse"))
        .and_then(serde_json::Value::as_bool);
    if ready != Some(true) {
        return Err(bad("the snapshot is not ready to use".into()));
    }
    let content_name = status
        .and_then(|s| s.get("boundVolumeSnapshotContentName"))
        .and_then(serde_json::Value::as_str)
        .ok_or_else(|| bad("the snapshot has no status.boundVolumeSnapshotContentName".into()))?;
    let content = Api::<DynamicObject>::all_with(ctx.client.clone(), &gvk("VolumeSnapshotContent"))
        .get(content_name)
        .await
        .map_err(|e| Error::kube(format!("reading VolumeSnapshotContent {content_name}"), e))?;
    let handle = content
        .data
        .get("status")
        .and_then(|s| s.get("snapshotHandle"))
        .and_then(serde_json::Value::as_str)
        .ok_or_else(|| {
            bad(format!(
                "VolumeSnapshotContent {content_name} has no status.snapshotHandle"
            ))
        })?;
    Ok(VolumeContentSource {
        r#type: Some(Type::Snapshot(SnapshotSource {
            snapshot_id: handle.to_string(),
        })),
    })
}
