//! kcm's `syncClaim`: a claim without `bind-completed` is matched, bound, or sent to a
//! provisioner (`syncUnboundClaim`); a claim with it is kept bound, or marked Lost when its
//! volume is gone or belongs to another claim (`syncBoundClaim`).

use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;

use serde_json::json;

use super::PassView;
use super::bind::{bind, patch_claim, update_claim_status};
use super::index::{self, NodeInfo};
use super::{Ctx, claim_name, provision, selected_node};
use crate::migration::{claim_migrated_to, current_migrated_to};
use crate::names::{
    ANN_BIND_COMPLETED, ANN_BOUND_BY_CONTROLLER, ANN_MIGRATED_TO, ANN_SELECTED_NODE,
};
use crate::{Error, events};

fn annotation<'a>(claim: &'a PersistentVolumeClaim, key: &str) -> Option<&'a str> {
    claim
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}
fn phase(claim: &PersistentVolumeClaim) -> Option<&str> {
    claim.status.as_ref().and_then(|s| s.phase.as_deref())
}

pub(crate) async fn sync_claim(
    ctx: &Arc<Ctx>,
    claim: Arc<PersistentVolumeClaim>,
    view: &PassView,
) -> Result<(), Error> {
    let claim = update_migration_annotation(ctx, claim).await?;
    if annotation(&claim, ANN_BIND_COMPLETED).is_some() {
        sync_bound_claim(ctx, &claim).await
    } else {
        sync_unbound_claim(ctx, &claim, view).await
    }
}

/// `pv.kubernetes.io/migrated-to` on a claim exactly while its storage-provisioner annotation
/// names a migrated in-tree plugin (kcm v1.26's `updateClaimMigrationAnnotations` at each
/// sync): a claim annotated `kubernetes.io/aws-ebs` before the plugin was migrated gets it, a
/// claim annotated for the CSI driver (what `set_claim_provisioner` writes for a migrated
/// class, native or in-tree) has none, so the two writers never disagree.
async fn update_migration_annotation(
    ctx: &Ctx,
    claim: Arc<PersistentVolumeClaim>,
) -> Result<Arc<PersistentVolumeClaim>, Error> {
    if claim.metadata.deletion_timestamp.is_some() {
        return Ok(claim);
    }
    let want = claim_migrated_to(&claim, &ctx.options.migrated);
    if current_migrated_to(claim.metadata.annotations.as_ref()) == want.as_deref() {
        return Ok(claim);
    }
    let patch = json!({"metadata": {"annotations": {ANN_MIGRATED_TO: want}}});
    patch_claim(ctx, &claim, patch, false).await
}

/// Whether the claim's class binds late (`volumeBindingMode: WaitForFirstConsumer`).
fn delays_binding(class: Option<&StorageClass>) -> bool {
    class.and_then(|c| c.volume_binding_mode.as_deref()) == Some("WaitForFirstConsumer")
}

async fn sync_unbound_claim(
    ctx: &Arc<Ctx>,
    claim: &PersistentVolumeClaim,
    view: &PassView,
) -> Result<(), Error> {
    // A claim being deleted is not bound any more (kcm's binder ignores it as well: its
    // protection finalizer keeps it only until its pods are gone).
    if claim.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let volume_name = claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .filter(|n| !n.is_empty());
    match volume_name {
        None => sync_unbound_claim_without_volume(ctx, claim, view).await,
        Some(name) => sync_pre_bound_claim(ctx, claim, &name).await,
    }
}

async fn sync_unbound_claim_without_volume(
    ctx: &Arc<Ctx>,
    claim: &PersistentVolumeClaim,
    view: &PassView,
) -> Result<(), Error> {
    let class_name = index::claim_class(claim);
    let class = (!class_name.is_empty())
        .then(|| ctx.caches.classes.get(&class_name))
        .flatten();
    let delay = delays_binding(class.as_deref());
    let selected = annotation(claim, ANN_SELECTED_NODE).map(str::to_string);
    // A volume pre-bound to the claim (the one a provisioner just made for it) first, without
    // the node: kcm binds it whatever the node, and a node read that fails or lags must not
    // hold it. Only then, for a delayed claim, the unbound volumes its selected node reaches.
    let take = |node: Option<&NodeInfo>| {
        view.volumes
            .lock()
            // The index is rebuilt every pass; a panicked sync cannot leave it inconsistent.
            .unwrap_or_else(|e| e.into_inner())
            .take_best_match(claim, node, delay)
    };
    let matched = match take(None) {
        Ok(None) if delay && selected.is_some() => {
            let name = selected.as_deref().unwrap_or_default();
            let node = selected_node(ctx, name).await?;
            take(Some(&node))
        }
        other => other,
    };
    let best = match matched {
        Ok(v) => v,
        Err(why) => {
            let message = format!("cannot match claim {}: {why}", claim_name(claim));
            ctx.events
                .claim(claim, true, events::FAILED_BINDING, &message)
                .await;
            return Err(Error::Invalid(message));
        }
    };
    match best {
        Some(volume) => bind(ctx, &volume, claim).await,
        None => {
            if assign_default_class(ctx, claim).await? {
                // The update brings the claim back with its class.
                return Ok(());
            }
            if delay && selected.is_none() {
                // kcm's emitEventForUnboundDelayBindingClaim: once a pod uses the claim, the
                // wait is for the scheduler.
                let key = (
                    claim.metadata.namespace.clone().unwrap_or_default(),
                    claim.metadata.name.clone().unwrap_or_default(),
                );
                let pods = view.unscheduled.get(&key).map_or(&[][..], Vec::as_slice);
                if pods.is_empty() {
                    ctx.events
                        .claim(
                            claim,
                            false,
                            events::WAIT_FOR_FIRST_CONSUMER,
                            events::WAITING_FOR_FIRST_CONSUMER,
                        )
                        .await;
                } else {
                    ctx.events
                        .claim(
                            claim,
                            false,
                            events::WAIT_FOR_POD_SCHEDULED,
                            &events::waiting_for_pods_scheduled(pods),
                        )
                        .await;
                }
            } else if !class_name.is_empty() {
                provision::provision_claim(ctx, claim, &class_name, class.as_deref()).await?;
            } else {
                ctx.events
                    .claim(
                        claim,
                        false,
                        events::FAILED_BINDING,
                        events::NO_VOLUME_NO_CLASS,
                    )
                    .await;
            }
            if phase(claim) != Some("Pending") {
                if let Some(latest) = latest(ctx, claim) {
                    update_claim_status(ctx, &latest, "Pending", None).await?;
                }
            }
            Ok(())
        }
    }
}

/// kcm's retroactive default StorageClass (GA since 1.28): a claim created without
/// `storageClassName` (not `""`, which asks for no class) while there was no default class,
/// and still without a volume, gets the default class once there is one. Returns whether the
/// claim was updated.
async fn assign_default_class(ctx: &Ctx, claim: &PersistentVolumeClaim) -> Result<bool, Error> {
    // The beta annotation names a class too (it wins over the field).
    if claim
        .spec
        .as_ref()
        .is_some_and(|s| s.storage_class_name.is_some())
        || annotation(claim, crate::names::ANN_BETA_STORAGE_CLASS).is_some()
    {
        return Ok(false);
    }
    let Some(default) = index::default_class(&ctx.caches.classes.list()) else {
        return Ok(false);
    };
    patch_claim(
        ctx,
        claim,
        json!({"spec": {"storageClassName": default}}),
        false,
    )
    .await?;
    Ok(true)
}

/// The newest copy of a claim (an annotation may just have been written).
fn latest(ctx: &Ctx, claim: &PersistentVolumeClaim) -> Option<Arc<PersistentVolumeClaim>> {
    ctx.claim(
        claim.metadata.namespace.as_deref().unwrap_or_default(),
        claim.metadata.name.as_deref().unwrap_or_default(),
    )
}

/// Why a volume cannot serve a claim that names it (kcm's `checkVolumeSatisfyClaim`).
fn volume_satisfies_claim(
    volume: &PersistentVolume,
    claim: &PersistentVolumeClaim,
) -> Result<(), String> {
    let requested = index::requested_bytes(claim)?;
    // A volume being deleted is never bound, even to a claim that names it.
    if volume.metadata.deletion_timestamp.is_some() {
        let name = volume.metadata.name.as_deref().unwrap_or_default();
        return Err(format!("the volume is marked for deletion {name:?}"));
    }
    if index::volume_bytes(volume) < requested {
        return Err("requested PV is too small".into());
    }
    if index::volume_class(volume) != index::claim_class(claim) {
        return Err("storageClassName does not match".into());
    }
    if index::volume_mode_mismatch(claim, volume) {
        return Err("incompatible volumeMode".into());
    }
    if !index::access_modes_satisfied(claim, volume) {
        return Err("incompatible accessMode".into());
    }
    Ok(())
}

/// A claim that names its volume (`spec.volumeName`) but is not bound yet.
async fn sync_pre_bound_claim(
    ctx: &Arc<Ctx>,
    claim: &PersistentVolumeClaim,
    volume_name: &str,
) -> Result<(), Error> {
    let Some(volume) = ctx.volume(volume_name) else {
        // The volume may come later (created by hand, or by a provisioner).
        update_claim_status(ctx, claim, "Pending", None).await?;
        return Ok(());
    };
    let claim_ref = volume.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
    if claim_ref.is_none() {
        if let Err(why) = volume_satisfies_claim(&volume, claim) {
            let message = format!("Cannot bind to requested volume {volume_name:?}: {why}");
            ctx.events
                .claim(claim, true, events::VOLUME_MISMATCH, &message)
                .await;
            update_claim_status(ctx, claim, "Pending", None).await?;
            return Ok(());
        }
        return bind(ctx, &volume, claim).await;
    }
    if index::is_volume_bound_to_claim(&volume, claim) {
        return bind(ctx, &volume, claim).await;
    }
    // The volume belongs to another claim.
    if annotation(claim, ANN_BOUND_BY_CONTROLLER).is_none() {
        let message = format!("volume {volume_name:?} already bound to a different claim.");
        ctx.events
            .claim(claim, true, events::FAILED_BINDING, &message)
            .await;
    }
    update_claim_status(ctx, claim, "Pending", None).await?;
    Ok(())
}

async fn sync_bound_claim(ctx: &Arc<Ctx>, claim: &PersistentVolumeClaim) -> Result<(), Error> {
    let volume_name = claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .filter(|n| !n.is_empty());
    let Some(volume_name) = volume_name else {
        return lost(
            ctx,
            claim,
            events::CLAIM_LOST,
            "Bound claim has lost reference to PersistentVolume. Data on the volume is lost!",
        )
        .await;
    };
    let volume = match ctx.volume(&volume_name) {
        Some(v) => v,
        // The cache may not have it yet (or any more): ask the API server before declaring
        // the claim Lost.
        None => match ctx.volumes_api().get_opt(&volume_name).await {
            Ok(Some(v)) => Arc::new(v),
            Ok(None) => {
                return lost(
                    ctx,
                    claim,
                    events::CLAIM_LOST,
                    "Bound claim has lost its PersistentVolume. Data on the volume is lost!",
                )
                .await;
            }
            Err(e) => {
                return Err(Error::kube(
                    format!("reading PersistentVolume {volume_name}"),
                    e,
                ));
            }
        },
    };
    let claim_ref = volume.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
    match claim_ref {
        // A crash after the claim's write but before the volume's: bind again.
        None => bind(ctx, &volume, claim).await,
        Some(r) if r.uid.as_deref() == claim.metadata.uid.as_deref() => {
            bind(ctx, &volume, claim).await
        }
        Some(_) => {
            lost(
                ctx,
                claim,
                events::CLAIM_MISBOUND,
                "Two claims are bound to the same volume, this one is bound incorrectly",
            )
            .await
        }
    }
}

async fn lost(
    ctx: &Arc<Ctx>,
    claim: &PersistentVolumeClaim,
    reason: &str,
    message: &str,
) -> Result<(), Error> {
    if phase(claim) == Some("Lost") {
        return Ok(());
    }
    update_claim_status(ctx, claim, "Lost", None).await?;
    ctx.events.claim(claim, true, reason, message).await;
    Ok(())
}
