//! One pod volume → what to attach, and by which plugin: Kubernetes' `util.CreateVolumeSpec`
//! plus the plugin lookup and the decision of the migration design (docs/design/migration.md).
//!
//! - `persistentVolumeClaim` → the bound PV (a PVC that is not bound yet is pending: retried
//!   when it binds, no Event);
//! - a CSI PV → the CSI plugin, if the driver is attachable in this mode;
//! - an in-tree `awsElasticBlockStore` PV or inline volume → [`volume_plugins::decide`] for the
//!   node: in-tree plugin, CSI after translation, or refused (Event);
//! - another in-tree plugin that translation knows → CSI when migrated, otherwise nothing (this
//!   controller has no other in-tree plugin);
//! - a generic ephemeral volume (`volumes[].ephemeral`) → the claim `<pod>-<volume>` the
//!   ephemeral-volume controller made for the pod, as a `persistentVolumeClaim` (not yet
//!   there: pending; someone else's claim of that name: an Event, never attached);
//! - CSI ephemeral inline volumes (`volumes[].csi`) and everything else → nothing to attach.

use std::sync::Arc;

use component_runtime::ObjectCache;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod, Volume};
use k8s_openapi::api::storage::v1::CSINode;
use volume_plugins::claims::ClaimProblem;
use volume_plugins::names::{
    AWS_EBS_PLUGIN_NAME, aws_ebs_unique_volume_name, csi_unique_volume_name,
};
use volume_plugins::{
    AttachSource, Backend as Decision, CsiPlugin, CsiVolume, MigratedPlugins, NodeMigrationInfo,
    decide,
};

use crate::cache::{Backend, VolumeToAttach};

/// The caches and settings a spec is resolved against.
pub(crate) struct SpecContext<'a> {
    pub pvcs: &'a ObjectCache<PersistentVolumeClaim>,
    pub pvs: &'a ObjectCache<PersistentVolume>,
    pub csinodes: &'a ObjectCache<CSINode>,
    pub csi: &'a CsiPlugin,
    pub migrated: &'a MigratedPlugins,
}

/// What became of one pod volume.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum SpecOutcome {
    Attach(VolumeToAttach),
    /// Nothing to attach (configMap, CSI ephemeral, an in-tree plugin we do not run, ...).
    NotAttachable,
    /// Not resolvable yet (PVC unbound, PV not in the cache): retried on a later pass.
    Pending(String),
    /// Will not be attached as written: an Event on the pod says why. `volume`: what the Event
    /// calls the volume (the PV name, or the pod's volume name).
    Failed {
        volume: String,
        reason: String,
    },
}

pub(crate) fn volume_to_attach(
    ctx: &SpecContext<'_>,
    pod: &Pod,
    volume: &Volume,
    node: &str,
) -> SpecOutcome {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    if volume.csi.is_some() {
        // CSI ephemeral inline volumes are the kubelet's business alone.
        return SpecOutcome::NotAttachable;
    }
    if let Some(claim) = &volume.persistent_volume_claim {
        return match bound_pv(ctx, namespace, &claim.claim_name) {
            Ok(pv) => from_pv(ctx, &pv, node),
            Err(outcome) => *outcome,
        };
    }
    if volume.ephemeral.is_some() {
        return match volume_plugins::claims::ephemeral_claim(ctx.pvcs, pod, volume) {
            Ok(claim) => match bound_pv(ctx, namespace, &claim) {
                Ok(pv) => from_pv(ctx, &pv, node),
                Err(outcome) => *outcome,
            },
            Err(ClaimProblem::Pending(why)) => SpecOutcome::Pending(why),
            Err(ClaimProblem::NotOwned(reason) | ClaimProblem::Mismatch { reason, .. }) => {
                SpecOutcome::Failed {
                    volume: volume.name.clone(),
                    reason,
                }
            }
        };
    }
    if volume.aws_elastic_block_store.is_some() || csi_translation::is_inline_migratable(volume) {
        return from_inline(ctx, volume, namespace, node);
    }
    SpecOutcome::NotAttachable
}

/// The PV bound to the claim, or why there is none yet (shared with the node agent).
fn bound_pv(
    ctx: &SpecContext<'_>,
    namespace: &str,
    claim: &str,
) -> Result<Arc<PersistentVolume>, Box<SpecOutcome>> {
    volume_plugins::claims::bound_pv(ctx.pvcs, ctx.pvs, namespace, claim).map_err(|p| {
        Box::new(match p {
            ClaimProblem::Pending(why) => SpecOutcome::Pending(why),
            ClaimProblem::Mismatch { pv, reason } => SpecOutcome::Failed { volume: pv, reason },
            ClaimProblem::NotOwned(reason) => SpecOutcome::Failed {
                volume: claim.to_string(),
                reason,
            },
        })
    })
}

fn multi_attach_allowed(pv: &PersistentVolume) -> bool {
    // Kubernetes' rule: a PV without access modes, or with a *Many mode, may be on several
    // nodes at once.
    let modes = pv
        .spec
        .as_ref()
        .and_then(|s| s.access_modes.clone())
        .unwrap_or_default();
    modes.is_empty()
        || modes
            .iter()
            .any(|m| m == "ReadWriteMany" || m == "ReadOnlyMany")
}

fn csi_volume(
    ctx: &SpecContext<'_>,
    spec_name: &str,
    driver: &str,
    handle: &str,
    source: AttachSource,
    migrated: bool,
    multi_attach: bool,
) -> SpecOutcome {
    if driver.is_empty() || handle.is_empty() {
        return SpecOutcome::Failed {
            volume: spec_name.to_string(),
            reason: format!(
                "spec.csi needs both driver and volumeHandle, got driver {driver:?} and volumeHandle {handle:?}"
            ),
        };
    }
    SpecOutcome::Attach(VolumeToAttach {
        unique_name: csi_unique_volume_name(driver, handle),
        spec_name: spec_name.to_string(),
        backend: Backend::Csi {
            volume: CsiVolume {
                driver: driver.to_string(),
                volume_handle: handle.to_string(),
                source,
            },
            migrated,
        },
        multi_attach,
        attachable: ctx.csi.can_attach(driver),
    })
}

fn node_info(ctx: &SpecContext<'_>, node: &str) -> NodeMigrationInfo {
    NodeMigrationInfo::from_csinode(ctx.csinodes.get(node).as_deref())
}

fn from_pv(ctx: &SpecContext<'_>, pv: &PersistentVolume, node: &str) -> SpecOutcome {
    let name = pv.metadata.name.clone().unwrap_or_default();
    let Some(spec) = pv.spec.as_ref() else {
        return failed(&name, "the PV has no spec".into());
    };
    let multi = multi_attach_allowed(pv);
    if let Some(csi) = &spec.csi {
        return csi_volume(
            ctx,
            &name,
            &csi.driver,
            &csi.volume_handle,
            AttachSource::PersistentVolume(name.clone()),
            false,
            multi,
        );
    }
    if !csi_translation::is_pv_migratable(pv) {
        return SpecOutcome::NotAttachable;
    }
    let plugin = match csi_translation::in_tree_plugin_name_from_spec(Some(pv), None) {
        Ok(p) => p,
        Err(e) => return failed(&name, e.to_string()),
    };
    match decide(plugin, ctx.migrated, &node_info(ctx, node)) {
        Decision::Refused { reason } => failed(&name, reason),
        Decision::InTree => match &spec.aws_elastic_block_store {
            Some(ebs) if plugin == AWS_EBS_PLUGIN_NAME => in_tree_ebs(&name, &ebs.volume_id, multi),
            // No in-tree plugin but aws-ebs runs here (Kubernetes removed the others).
            _ => SpecOutcome::NotAttachable,
        },
        Decision::Csi { .. } => match csi_translation::translate_in_tree_pv_to_csi(pv) {
            Ok(translated) => {
                let Some(source) = translated.spec.as_ref().and_then(|s| s.csi.clone()) else {
                    return failed(&name, "the translation to CSI gave no spec.csi".into());
                };
                csi_volume(
                    ctx,
                    &name,
                    &source.driver,
                    &source.volume_handle,
                    AttachSource::PersistentVolume(name.clone()),
                    true,
                    multi,
                )
            }
            Err(e) => failed(&name, format!("translating the PV to CSI: {e}")),
        },
    }
}

fn from_inline(ctx: &SpecContext<'_>, volume: &Volume, namespace: &str, node: &str) -> SpecOutcome {
    let name = volume.name.clone();
    let plugin = match csi_translation::in_tree_plugin_name_from_spec(None, Some(volume)) {
        Ok(p) => p,
        Err(e) => return failed(&name, e.to_string()),
    };
    match decide(plugin, ctx.migrated, &node_info(ctx, node)) {
        Decision::Refused { reason } => failed(&name, reason),
        Decision::InTree => match &volume.aws_elastic_block_store {
            // Inline volumes are never multi-attachable (Kubernetes' rule for EBS).
            Some(ebs) => in_tree_ebs(&name, &ebs.volume_id, false),
            None => SpecOutcome::NotAttachable,
        },
        Decision::Csi { .. } => {
            match csi_translation::translate_in_tree_inline_volume_to_csi(volume, namespace) {
                Ok(translated) => {
                    let Some(spec) = translated.spec else {
                        return failed(&name, "the translation to CSI gave no spec".into());
                    };
                    let Some(source) = spec.csi.clone() else {
                        return failed(&name, "the translation to CSI gave no spec.csi".into());
                    };
                    csi_volume(
                        ctx,
                        &name,
                        &source.driver,
                        &source.volume_handle,
                        AttachSource::Inline(Box::new(spec)),
                        true,
                        false,
                    )
                }
                Err(e) => failed(&name, format!("translating the volume to CSI: {e}")),
            }
        }
    }
}

fn failed(volume: &str, reason: String) -> SpecOutcome {
    SpecOutcome::Failed {
        volume: volume.to_string(),
        reason,
    }
}

fn in_tree_ebs(spec_name: &str, volume_id: &str, multi_attach: bool) -> SpecOutcome {
    if volume_id.trim().is_empty() {
        return failed(spec_name, "awsElasticBlockStore.volumeID is empty".into());
    }
    SpecOutcome::Attach(VolumeToAttach {
        unique_name: aws_ebs_unique_volume_name(volume_id),
        spec_name: spec_name.to_string(),
        backend: Backend::AwsEbs {
            volume_id: volume_id.to_string(),
        },
        multi_attach,
        attachable: true,
    })
}

#[cfg(test)]
mod tests;
