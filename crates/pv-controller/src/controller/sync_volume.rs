//! kcm's `syncVolume`: a volume's `migrated-to` annotation, then its phase from its claimRef:
//! no ref or a ref without uid (pre-bound, never bound) → Available; a ref whose claim is gone
//! (or was re-created with another uid, or is bound to another volume) → Released and
//! reclaimed; a ref to a live claim that names it → Bound.

use std::sync::Arc;

use k8s_openapi::api::core::v1::PersistentVolume;
use serde_json::json;

use super::bind::{patch_volume, unbind_volume, update_volume_phase};
use super::{Ctx, reclaim};
use crate::Error;
use crate::migration::{current_migrated_to, volume_migrated_to};
use crate::names::{ANN_BOUND_BY_CONTROLLER, ANN_MIGRATED_TO, ANN_PROVISIONED_BY};

fn phase(volume: &PersistentVolume) -> Option<&str> {
    volume.status.as_ref().and_then(|s| s.phase.as_deref())
}

pub(crate) async fn sync_volume(
    ctx: &Arc<Ctx>,
    volume: Arc<PersistentVolume>,
) -> Result<(), Error> {
    let volume = update_migration_annotation(ctx, volume).await?;
    let Some(claim_ref) = volume.spec.as_ref().and_then(|s| s.claim_ref.clone()) else {
        if phase(&volume) != Some("Available") {
            update_volume_phase(ctx, &volume, "Available", None).await?;
        }
        return Ok(());
    };
    let uid = claim_ref.uid.clone().unwrap_or_default();
    if uid.is_empty() {
        // Reserved for a claim that has not been bound yet: the claim's sync binds it.
        if phase(&volume) != Some("Available") {
            update_volume_phase(ctx, &volume, "Available", None).await?;
        }
        return Ok(());
    }
    let namespace = claim_ref.namespace.clone().unwrap_or_default();
    let name = claim_ref.name.clone().unwrap_or_default();
    let settled = matches!(phase(&volume), Some("Released") | Some("Failed"));
    let claim = match ctx.claim(&namespace, &name) {
        Some(c) => Some(c),
        // Already released: the cache's word is enough (no GET per pass per old volume).
        None if settled => None,
        // The cache may lag behind a claim just created (by a provisioner, a scheduler): ask
        // the API server before releasing the volume, as kcm does.
        None => ctx
            .claims_api(&namespace)
            .get_opt(&name)
            .await
            .map_err(|e| {
                Error::kube(
                    format!("reading PersistentVolumeClaim {namespace}/{name}"),
                    e,
                )
            })?
            .map(Arc::new),
    };
    let claim = claim.filter(|c| c.metadata.uid.as_deref() == Some(uid.as_str()));
    let Some(claim) = claim else {
        return released(ctx, &volume).await;
    };
    let claim_volume = claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .unwrap_or_default();
    let volume_name = volume.metadata.name.clone().unwrap_or_default();
    if claim_volume.is_empty() {
        // Binding in progress (or a volume pre-bound by a user): the claim's sync completes it.
        return Ok(());
    }
    if claim_volume == volume_name {
        if phase(&volume) != Some("Bound") {
            update_volume_phase(ctx, &volume, "Bound", None).await?;
        }
        return Ok(());
    }
    // The claim is bound to another volume.
    let annotations = volume.metadata.annotations.clone().unwrap_or_default();
    let policy = volume
        .spec
        .as_ref()
        .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
        .unwrap_or("Retain");
    if annotations.contains_key(ANN_PROVISIONED_BY) && policy == "Delete" {
        // Provisioned for this claim, which got another volume: not needed any more.
        return released(ctx, &volume).await;
    }
    if annotations.contains_key(ANN_BOUND_BY_CONTROLLER) {
        // The controller reserved it for the claim, which was then bound elsewhere: undo.
        unbind_volume(ctx, &volume).await?;
    }
    // Otherwise a user wrote the ref: leave it alone.
    Ok(())
}

/// Released (once), then reclaimed according to the policy.
async fn released(ctx: &Arc<Ctx>, volume: &PersistentVolume) -> Result<(), Error> {
    let volume = match phase(volume) {
        Some("Released") | Some("Failed") => Arc::new(volume.clone()),
        _ => update_volume_phase(ctx, volume, "Released", None).await?,
    };
    reclaim::reclaim_volume(ctx, &volume).await
}

/// `pv.kubernetes.io/migrated-to` on a dynamically provisioned volume exactly while the
/// in-tree plugin that provisioned it is migrated (seed 003: the CSI provisioner then deletes
/// it; after a downgrade, this controller does again), as kcm v1.26 keeps it.
async fn update_migration_annotation(
    ctx: &Ctx,
    volume: Arc<PersistentVolume>,
) -> Result<Arc<PersistentVolume>, Error> {
    // Statically provisioned volumes are left as they are, as kcm leaves them.
    let Some(want) = volume_migrated_to(&volume, &ctx.options.migrated) else {
        return Ok(volume);
    };
    let have = current_migrated_to(volume.metadata.annotations.as_ref());
    if have == want.as_deref() {
        return Ok(volume);
    }
    let patch = json!({"metadata": {"annotations": {ANN_MIGRATED_TO: want}}});
    patch_volume(ctx, &volume, patch, false).await
}
