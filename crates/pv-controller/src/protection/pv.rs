//! The `kubernetes.io/pv-protection` finalizer: a volume being deleted keeps it while Bound.

use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::{Patch, PatchParams};

use super::{Writer, finalizers_patch, unless_gone};
use crate::Error;
use crate::names::PV_PROTECTION_FINALIZER;

pub(crate) async fn sync(ctx: &impl Writer, volume: &PersistentVolume) -> Result<(), Error> {
    let name = volume.metadata.name.clone().unwrap_or_default();
    let finalizers = volume.metadata.finalizers.clone().unwrap_or_default();
    let has = finalizers.iter().any(|f| f == PV_PROTECTION_FINALIZER);
    let deleting = volume.metadata.deletion_timestamp.is_some();
    let bound = volume.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    let list: Vec<String> = if !deleting && !has {
        let mut list = finalizers.clone();
        list.push(PV_PROTECTION_FINALIZER.to_string());
        list
    } else if deleting && has && !bound {
        finalizers
            .iter()
            .filter(|f| *f != PV_PROTECTION_FINALIZER)
            .cloned()
            .collect()
    } else {
        return Ok(());
    };
    let patch = finalizers_patch(&list, volume.metadata.resource_version.as_deref());
    let written = kube::Api::<PersistentVolume>::all(ctx.client().clone())
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await;
    let Some(updated) = unless_gone(written).map_err(|e| {
        Error::kube(
            format!("updating the finalizers of PersistentVolume {name}"),
            e,
        )
    })?
    else {
        tracing::debug!(volume = %name, "pv-protection finalizer: the volume is already gone");
        return Ok(());
    };
    tracing::info!(volume = %name, removed = deleting, "pv-protection finalizer");
    ctx.remember_volume(updated);
    Ok(())
}
