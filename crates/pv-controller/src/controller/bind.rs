//! The writes of binding, in kube-controller-manager's order: the volume's `claimRef` first,
//! then its phase, then the claim's `volumeName` and annotations, then the claim's status. A
//! crash between two of them leaves a state the next sync recognises and completes (a volume
//! whose claimRef names a claim that does not name it yet is bound on; a claim with
//! `bind-completed` whose status is not Bound is given its status). Spec writes carry the
//! resourceVersion they were computed from, so two claims racing for one volume cannot both
//! win: the second gets 409 Conflict and looks again.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};

use super::Ctx;
use crate::Error;
use crate::names::{ANN_BIND_COMPLETED, ANN_BOUND_BY_CONTROLLER};

fn name_of<K: kube::Resource>(obj: &K) -> String {
    obj.meta().name.clone().unwrap_or_default()
}

fn annotations<K: kube::Resource>(obj: &K) -> BTreeMap<String, String> {
    obj.meta().annotations.clone().unwrap_or_default()
}

/// Merge-patches a volume (or its status) with a resourceVersion precondition.
pub(crate) async fn patch_volume(
    ctx: &Ctx,
    volume: &PersistentVolume,
    mut patch: Value,
    status: bool,
) -> Result<Arc<PersistentVolume>, Error> {
    let name = name_of(volume);
    patch["metadata"]["resourceVersion"] = json!(volume.metadata.resource_version);
    let api = ctx.volumes_api();
    let pp = PatchParams::default();
    let result = if status {
        api.patch_status(&name, &pp, &Patch::Merge(&patch)).await
    } else {
        api.patch(&name, &pp, &Patch::Merge(&patch)).await
    };
    let what = if status { "status of " } else { "" };
    let updated =
        result.map_err(|e| Error::kube(format!("patching {what}PersistentVolume {name}"), e))?;
    Ok(ctx.remember_volume(updated))
}

/// Merge-patches a claim (or its status) with a resourceVersion precondition.
pub(crate) async fn patch_claim(
    ctx: &Ctx,
    claim: &PersistentVolumeClaim,
    mut patch: Value,
    status: bool,
) -> Result<Arc<PersistentVolumeClaim>, Error> {
    let name = name_of(claim);
    let namespace = claim.metadata.namespace.clone().unwrap_or_default();
    patch["metadata"]["resourceVersion"] = json!(claim.metadata.resource_version);
    let api = ctx.claims_api(&namespace);
    let pp = PatchParams::default();
    let result = if status {
        api.patch_status(&name, &pp, &Patch::Merge(&patch)).await
    } else {
        api.patch(&name, &pp, &Patch::Merge(&patch)).await
    };
    let what = if status { "status of " } else { "" };
    let updated = result.map_err(|e| {
        Error::kube(
            format!("patching {what}PersistentVolumeClaim {namespace}/{name}"),
            e,
        )
    })?;
    Ok(ctx.remember_claim(updated))
}

/// Sets the volume's phase (and message) on `/status`, with `lastPhaseTransitionTime` when the
/// phase changes. Nothing is written when both are already so.
pub(crate) async fn update_volume_phase(
    ctx: &Ctx,
    volume: &PersistentVolume,
    phase: &str,
    message: Option<&str>,
) -> Result<Arc<PersistentVolume>, Error> {
    let status = volume.status.clone().unwrap_or_default();
    if status.phase.as_deref() == Some(phase) && status.message.as_deref() == message {
        return Ok(Arc::new(volume.clone()));
    }
    let mut patch = json!({"status": {"phase": phase, "message": message}});
    if status.phase.as_deref() != Some(phase) {
        patch["status"]["lastPhaseTransitionTime"] = json!(
            jiff::Timestamp::now()
                .round(jiff::Unit::Second)
                .unwrap_or_else(|_| jiff::Timestamp::now())
                .to_string()
        );
    }
    tracing::info!(volume = %name_of(volume), phase, "volume phase");
    patch_volume(ctx, volume, patch, true).await
}

/// The volume's claimRef pointing at the claim, uid included (kcm's `bindVolumeToClaim`).
pub(crate) async fn bind_volume_to_claim(
    ctx: &Ctx,
    volume: &PersistentVolume,
    claim: &PersistentVolumeClaim,
) -> Result<Arc<PersistentVolume>, Error> {
    let current = volume.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    let done = current.is_some_and(|r| {
        r.name == claim.metadata.name
            && r.namespace == claim.metadata.namespace
            && r.uid.as_deref() == Some(uid.as_str())
    });
    if done {
        return Ok(Arc::new(volume.clone()));
    }
    let mut patch = json!({"spec": {"claimRef": {
        "kind": "PersistentVolumeClaim",
        "apiVersion": "v1",
        "namespace": claim.metadata.namespace,
        "name": claim.metadata.name,
        "uid": uid,
        "resourceVersion": claim.metadata.resource_version,
    }}});
    // A ref the user wrote (pre-bound volume) stays theirs; one the controller sets says so.
    if current.is_none() {
        patch["metadata"]["annotations"] = json!({ANN_BOUND_BY_CONTROLLER: "yes"});
    }
    tracing::info!(volume = %name_of(volume), claim = %format!("{}/{}", claim.metadata.namespace.as_deref().unwrap_or_default(), name_of(claim)), "binding volume to claim");
    patch_volume(ctx, volume, patch, false).await
}

/// The claim's `volumeName` and `bind-completed` (kcm's `bindClaimToVolume`).
pub(crate) async fn bind_claim_to_volume(
    ctx: &Ctx,
    claim: &PersistentVolumeClaim,
    volume: &PersistentVolume,
) -> Result<Arc<PersistentVolumeClaim>, Error> {
    let volume_name = name_of(volume);
    let current = claim.spec.as_ref().and_then(|s| s.volume_name.clone());
    let ann = annotations(claim);
    let mut patch = json!({});
    if current.as_deref() != Some(volume_name.as_str()) {
        patch["spec"] = json!({"volumeName": volume_name});
        if current.as_deref().is_none_or(str::is_empty) {
            patch["metadata"]["annotations"][ANN_BOUND_BY_CONTROLLER] = json!("yes");
        }
    }
    if ann.get(ANN_BIND_COMPLETED).map(String::as_str) != Some("yes") {
        patch["metadata"]["annotations"][ANN_BIND_COMPLETED] = json!("yes");
    }
    if patch.as_object().is_some_and(serde_json::Map::is_empty) {
        return Ok(Arc::new(claim.clone()));
    }
    patch_claim(ctx, claim, patch, false).await
}

/// The claim's status (kcm v1.26's `updateClaimStatus`): the phase; the access modes from the
/// volume; the capacity from the volume only when the claim *becomes* Bound (its phase changes
/// now), never on the later syncs of a claim already Bound: while an expansion waits for the
/// node, the PV already has its new size and the claim's capacity is what the filesystem has,
/// which the kubelet compares to finish the resize. Without a volume, both are cleared.
/// `allocatedResources`, `resizeStatus` and conditions are the resizer's and the kubelet's and
/// are never written here.
pub(crate) async fn update_claim_status(
    ctx: &Ctx,
    claim: &PersistentVolumeClaim,
    phase: &str,
    volume: Option<&PersistentVolume>,
) -> Result<Arc<PersistentVolumeClaim>, Error> {
    let status = claim.status.clone().unwrap_or_default();
    let becomes = status.phase.as_deref() != Some(phase);
    let mut patch = json!({"status": {}});
    if becomes {
        patch["status"]["phase"] = json!(phase);
    }
    match volume {
        None => {
            if status.access_modes.is_some() {
                patch["status"]["accessModes"] = Value::Null;
            }
            if status.capacity.is_some() {
                patch["status"]["capacity"] = Value::Null;
            }
        }
        Some(v) => {
            let spec = v.spec.clone().unwrap_or_default();
            if status.access_modes != spec.access_modes {
                patch["status"]["accessModes"] = json!(spec.access_modes);
            }
            if becomes {
                let Some(size) = spec.capacity.as_ref().and_then(|c| c.get("storage")) else {
                    return Err(Error::Invalid(format!(
                        "PersistentVolume {:?} is without a storage capacity",
                        name_of(v)
                    )));
                };
                let have = status.capacity.as_ref().and_then(|c| c.get("storage"));
                let same = have.is_some_and(|h| quantities_equal(h, size));
                if !same {
                    // The whole map, as kcm copies it (a `null` clears what the PV lacks).
                    let mut cap = serde_json::Map::new();
                    for key in status.capacity.iter().flat_map(|c| c.keys()) {
                        cap.insert(key.clone(), Value::Null);
                    }
                    for (key, q) in spec.capacity.iter().flatten() {
                        cap.insert(key.clone(), json!(q));
                    }
                    patch["status"]["capacity"] = Value::Object(cap);
                }
            }
        }
    }
    if patch["status"]
        .as_object()
        .is_some_and(serde_json::Map::is_empty)
    {
        return Ok(Arc::new(claim.clone()));
    }
    tracing::info!(claim = %format!("{}/{}", claim.metadata.namespace.as_deref().unwrap_or_default(), name_of(claim)), phase, "claim phase");
    patch_claim(ctx, claim, patch, true).await
}

/// Whether two quantities are the same amount ("1Gi" and "1024Mi" are); unreadable ones are
/// compared as written.
fn quantities_equal(
    a: &k8s_openapi::apimachinery::pkg::api::resource::Quantity,
    b: &k8s_openapi::apimachinery::pkg::api::resource::Quantity,
) -> bool {
    use volume_plugins::aws_ebs::provisioner::quantity_to_bytes;
    match (quantity_to_bytes(&a.0), quantity_to_bytes(&b.0)) {
        (Some(x), Some(y)) => x == y,
        _ => a.0 == b.0,
    }
}

/// Binds both sides, every step skipped when already done (kcm's `bind`).
pub(crate) async fn bind(
    ctx: &Ctx,
    volume: &PersistentVolume,
    claim: &PersistentVolumeClaim,
) -> Result<(), Error> {
    let volume = bind_volume_to_claim(ctx, volume, claim).await?;
    let volume = update_volume_phase(ctx, &volume, "Bound", None).await?;
    let claim = bind_claim_to_volume(ctx, claim, &volume).await?;
    update_claim_status(ctx, &claim, "Bound", Some(&volume)).await?;
    Ok(())
}

/// Takes a volume back from a claim that is bound elsewhere (kcm's `unbindVolume`): a ref the
/// controller set goes; a ref the user wrote stays, without its uid, so the volume waits for
/// that claim again. The volume becomes Available.
pub(crate) async fn unbind_volume(ctx: &Ctx, volume: &PersistentVolume) -> Result<(), Error> {
    let by_controller = annotations(volume)
        .get(ANN_BOUND_BY_CONTROLLER)
        .is_some_and(|v| v == "yes");
    let patch = if by_controller {
        json!({"metadata": {"annotations": {ANN_BOUND_BY_CONTROLLER: null}},
               "spec": {"claimRef": null}})
    } else {
        json!({"spec": {"claimRef": {"uid": null}}})
    };
    let volume = patch_volume(ctx, volume, patch, false).await?;
    update_volume_phase(ctx, &volume, "Available", None).await?;
    Ok(())
}
