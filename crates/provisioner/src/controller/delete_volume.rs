//! One PV: DeleteVolume for a Released PV with reclaim policy Delete that we provisioned,
//! then our finalizer off and the PV deleted. A PV deleted by a user while still bound keeps
//! our finalizer (pv-protection holds it anyway) until it is Released and deleted here; a PV
//! whose reclaim policy became Retain gets the finalizer removed, so it can go.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, SecretReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::reflector::ObjectRef;

use super::Ctx;
use super::kube_io;
use crate::delete::SecretSource;
use crate::secrets::{self, SecretKind};
use crate::{Error, PV_FINALIZER, delete, events, migration};
use component_runtime::workqueue::Outcome;

pub(crate) async fn sync_volume(ctx: &Arc<Ctx>, key: &str, name: &str) -> Outcome {
    let Some(pv) = ctx.pvs.get(&ObjectRef::new(name)) else {
        ctx.queue.forget(key);
        return Outcome::Done;
    };
    let class = pv
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.clone())
        .unwrap_or_default();
    let started = Instant::now();
    match sync(ctx, &pv).await {
        Ok(true) => {
            ctx.metrics.deleted(&class, started.elapsed());
            Outcome::Done
        }
        Ok(false) => Outcome::Done,
        Err(e) if e.is_conflict() => {
            // Someone wrote the PV between our read and our write: the next pass works from
            // the fresh copy. Not a failure worth a Warning Event.
            tracing::debug!(pv = %name, error = %e, "PV changed meanwhile; retrying");
            Outcome::Retry
        }
        Err(e) => {
            tracing::warn!(pv = %name, error = %e, "deleting the volume failed; will retry");
            ctx.metrics.delete_failed(&class);
            kube_io::event(
                ctx,
                pv.as_ref(),
                true,
                events::VOLUME_FAILED_DELETE,
                &e.to_string(),
            )
            .await;
            Outcome::Retry
        }
    }
}

fn has_finalizer(pv: &PersistentVolume) -> bool {
    pv.metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == PV_FINALIZER)
}

/// `Ok(true)`: the volume was deleted now.
async fn sync(ctx: &Ctx, pv: &PersistentVolume) -> Result<bool, Error> {
    let Some(target) = delete::target(pv, &ctx.driver.name)? else {
        let retained = pv
            .spec
            .as_ref()
            .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
            != Some("Delete");
        if pv.metadata.deletion_timestamp.is_some() && retained && has_finalizer(pv) {
            kube_io::remove_finalizer(ctx, pv).await?;
        }
        return Ok(false);
    };
    if let Some(node) = &ctx.options.node_deployment {
        let labels = ctx
            .nodes
            .get(&ObjectRef::new(node))
            .and_then(|n| n.metadata.labels.clone())
            .unwrap_or_default();
        if !delete::on_node(pv, node, &labels) {
            // Another node's volume: only the driver on that node can delete it.
            return Ok(false);
        }
    }
    let uid = pv.metadata.uid.clone().unwrap_or_default();
    // Already done when our own finalizer removal or delete comes back through the watch
    // (or a write after DeleteVolume failed): only the API writes are left.
    let volume_deleted_before = ctx.deleted.contains(&uid);
    // Our part is over once the volume is gone, our finalizer is off and the PV is being
    // deleted (or the API server accepted our delete, before the watch shows it): what is left
    // (pv-protection) is the PV controller's. Deleting again would only repeat the same API
    // call for every watch event until the object is gone.
    if volume_deleted_before
        && !has_finalizer(pv)
        && (pv.metadata.deletion_timestamp.is_some() || ctx.pv_delete_accepted.contains(&uid))
    {
        return Ok(false);
    }
    if !volume_deleted_before {
        let secrets = deletion_secrets(ctx, pv, &target).await?;
        ctx.driver
            .delete_volume(
                &target.volume_handle,
                secrets,
                ctx.options.timeout,
                ctx.observer.as_ref(),
                target.migrated,
            )
            .await?;
        tracing::info!(pv = ?pv.metadata.name, volume = %target.volume_handle, "volume deleted");
        ctx.deleted.insert(&uid);
    }
    let written = if has_finalizer(pv) {
        match kube_io::remove_finalizer(ctx, pv).await? {
            Some(p) => p,
            None => return Ok(!volume_deleted_before),
        }
    } else {
        pv.clone()
    };
    kube_io::delete_pv(ctx, &written).await?;
    ctx.pv_delete_accepted.insert(&uid);
    Ok(!volume_deleted_before)
}

/// DeleteVolume's secrets, as the Go sidecar finds them: from the PV's deletion-secret
/// annotations when it has them, else from its StorageClass's provisioner secret for the
/// claim in its claimRef. A secret that cannot be read (deleted before its volume, say) is
/// logged and the volume deleted without it, as Go does: the driver says whether it needs it.
async fn deletion_secrets(
    ctx: &Ctx,
    pv: &PersistentVolume,
    target: &delete::Target,
) -> Result<HashMap<String, String>, Error> {
    let reference = match &target.secret {
        SecretSource::Annotated(r) => r.clone(),
        SecretSource::FromClass => class_secret(ctx, pv, target.migrated)?,
    };
    let Some(reference) = reference else {
        return Ok(HashMap::new());
    };
    match kube_io::secret_data(ctx, &reference).await {
        Ok(data) => Ok(data),
        Err(e) => {
            tracing::warn!(pv = ?pv.metadata.name, error = %e, "deleting the volume without its provisioner secret");
            Ok(HashMap::new())
        }
    }
}

/// The provisioner secret the PV's class names (translated first for a migrated in-tree
/// class), resolved for the claim of its claimRef; `None` without class or claimRef.
fn class_secret(
    ctx: &Ctx,
    pv: &PersistentVolume,
    migrated: bool,
) -> Result<Option<SecretReference>, Error> {
    let spec = pv.spec.clone().unwrap_or_default();
    let Some(class) = spec
        .storage_class_name
        .filter(|c| !c.is_empty())
        .and_then(|c| ctx.classes.get(&ObjectRef::new(&c)))
    else {
        return Ok(None);
    };
    let Some(claim_ref) = spec.claim_ref else {
        return Ok(None);
    };
    let class = if migrated && Some(class.provisioner.as_str()) != Some(ctx.driver.name.as_str()) {
        migration::translate_class(&class.provisioner, &class)?
    } else {
        class.as_ref().clone()
    };
    let claim = PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: claim_ref.name,
            namespace: claim_ref.namespace,
            ..Default::default()
        },
        ..Default::default()
    };
    let params = class.parameters.unwrap_or_default();
    let pv_name = pv.metadata.name.clone().unwrap_or_default();
    secrets::secret_ref(SecretKind::Provisioner, &params, &pv_name, &claim)
}
