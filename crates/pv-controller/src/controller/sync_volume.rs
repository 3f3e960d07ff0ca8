//! kcm's `syncVolume`: a volume's `migrated-to` annotation, then its phase from its claimRef:
//! no ref or a ref without uid (pre-bound, never bound) → Available; a ref whose claim is gone
//! (or was re-created with another uid, or is bound to another volume) → Released and
//! reclaimed; a ref to a live claim that names it → Bound.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
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
    let claim = live_claim(ctx.claim(&namespace, &name), &uid, settled, || async {
        ctx.claims_api(&namespace)
            .get_opt(&name)
            .await
            .map_err(|e| {
                Error::kube(
                    format!("reading PersistentVolumeClaim {namespace}/{name}"),
                    e,
                )
            })
    })
    .await?;
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
    // The controller reserved it for the claim, which was then bound elsewhere: undo (the ref
    // and bound-by-controller go). A user wrote the ref (no bound-by-controller): only its
    // uid goes, so the volume, Available, stays reserved for that claim and waits for it to
    // be unbound (kcm v1.26's syncVolume calls unbindVolume in both cases).
    if !annotations.contains_key(ANN_BOUND_BY_CONTROLLER) {
        tracing::info!(volume = %volume_name, claim = %format!("{namespace}/{name}"), "volume pre-bound by a user to a claim bound to another volume: waiting for the claim to get unbound");
    }
    unbind_volume(ctx, &volume).await
}

/// The claim a volume's ref (`uid`) points to, or `None` when it is gone. The cache's copy is
/// trusted only when it has that UID. When it is missing (the cache may lag behind a claim
/// just created by a provisioner or a scheduler) or has another UID (a claim deleted and
/// re-created under the same name, as every StatefulSet does, seen before the cache caught
/// up), the API server is asked before the volume is released: releasing, and with `Delete`
/// destroying, the new claim's volume on a stale cache is the one mistake this must not make
/// (kcm v1.26's syncVolume re-GETs the same way). A volume already Released or Failed whose
/// claim is not cached at all is not asked about again on every pass.
async fn live_claim<F, Fut>(
    cached: Option<Arc<PersistentVolumeClaim>>,
    uid: &str,
    settled: bool,
    fetch: F,
) -> Result<Option<Arc<PersistentVolumeClaim>>, Error>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<Option<PersistentVolumeClaim>, Error>>,
{
    let has_uid = |c: &PersistentVolumeClaim| c.metadata.uid.as_deref() == Some(uid);
    match cached {
        Some(c) if has_uid(&c) => Ok(Some(c)),
        None if settled => Ok(None),
        _ => Ok(fetch().await?.filter(|c| has_uid(c)).map(Arc::new)),
    }
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
/// in-tree plugin that provisioned it is migrated (the migration design, docs/design/migration.md:
/// the CSI provisioner then deletes it; after a downgrade, this controller does again), as kcm
/// v1.26 keeps it.
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn claim(uid: &str) -> PersistentVolumeClaim {
        let mut c = PersistentVolumeClaim::default();
        c.metadata.name = Some("data-web-0".into());
        c.metadata.uid = Some(uid.into());
        c
    }

    /// `live_claim` with an API server that holds `server` and counts its GETs.
    async fn ask(
        cached: Option<PersistentVolumeClaim>,
        uid: &str,
        settled: bool,
        server: Option<PersistentVolumeClaim>,
    ) -> (Option<String>, usize) {
        let gets = AtomicUsize::new(0);
        let found = live_claim(cached.map(Arc::new), uid, settled, || async {
            gets.fetch_add(1, Ordering::SeqCst);
            Ok(server)
        })
        .await
        .unwrap();
        (
            found.and_then(|c| c.metadata.uid.clone()),
            gets.load(Ordering::SeqCst),
        )
    }

    #[tokio::test]
    async fn a_stale_cached_claim_is_checked_against_the_api_server() {
        // The StatefulSet case: the cache still has the old claim (uid old), the volume is
        // bound to the re-created one (uid new), which the API server has. Not released.
        assert_eq!(
            ask(Some(claim("old")), "new", false, Some(claim("new"))).await,
            (Some("new".into()), 1)
        );
        // Also when the volume already shows Released.
        assert_eq!(
            ask(Some(claim("old")), "new", true, Some(claim("new"))).await,
            (Some("new".into()), 1)
        );
        // The API server agrees the claim is another one: released.
        assert_eq!(
            ask(Some(claim("newer")), "new", false, Some(claim("newer"))).await,
            (None, 1)
        );
        // Not cached yet (just created): asked; gone there too: released.
        assert_eq!(
            ask(None, "new", false, Some(claim("new"))).await,
            (Some("new".into()), 1)
        );
        assert_eq!(ask(None, "new", false, None).await, (None, 1));
        // The cache has it with the right UID: no GET. A settled volume whose claim is not
        // cached: no GET on every pass.
        assert_eq!(
            ask(Some(claim("new")), "new", false, None).await,
            (Some("new".into()), 0)
        );
        assert_eq!(ask(None, "new", true, Some(claim("new"))).await, (None, 0));
    }
}
