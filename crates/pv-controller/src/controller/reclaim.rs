//! kcm's `reclaimVolume` for a Released volume: `Retain` keeps it; `Recycle` is refused (the
//! recycler is deprecated and no plugin here has one); `Delete` is left to the external
//! provisioner that made it (or the CSI driver it is migrated to), or done here by the in-tree
//! aws-ebs deleter: EC2 DeleteVolume (an absent volume counts as deleted), then the PV object.

use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::PersistentVolume;
use volume_plugins::MigratedPlugins;
use volume_plugins::aws_ebs::provisioner;
use volume_plugins::names::AWS_EBS_PLUGIN_NAME;

use super::Ctx;
use super::bind::update_volume_phase;
use crate::names::{ANN_MIGRATED_TO, ANN_PROVISIONED_BY};
use crate::{Error, events};

/// Who deletes a Released volume whose policy is Delete (kcm's `findDeletablePlugin`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Deleter {
    /// An external provisioner (or the CSI driver an in-tree plugin is migrated to).
    External,
    /// This controller, with the in-tree aws-ebs deleter.
    InTreeAwsEbs,
    /// Nobody: the volume is marked Failed with this message.
    Nobody(String),
}

pub(crate) fn find_deleter(volume: &PersistentVolume, migrated: &MigratedPlugins) -> Deleter {
    let name = volume.metadata.name.clone().unwrap_or_default();
    let annotations = volume.metadata.annotations.clone().unwrap_or_default();
    let nobody = || {
        Deleter::Nobody(format!(
            "error getting deleter volume plugin for volume {name:?}: no deletable volume plugin matched"
        ))
    };
    let is_aws_source = volume
        .spec
        .as_ref()
        .is_some_and(|s| s.aws_elastic_block_store.is_some());
    if let Some(by) = annotations
        .get(ANN_PROVISIONED_BY)
        .filter(|p| !p.is_empty())
    {
        if !by.starts_with("kubernetes.io/") {
            return Deleter::External;
        }
        if annotations.contains_key(ANN_MIGRATED_TO) || migrated.contains(by) {
            return Deleter::External;
        }
        return if by == AWS_EBS_PLUGIN_NAME && is_aws_source {
            Deleter::InTreeAwsEbs
        } else {
            nobody()
        };
    }
    // A `csi` source alone names no deleter: kcm v1.26 has no deletable plugin for it and
    // fails the volume (the external provisioner only deletes what its `provisioned-by`
    // names), as tests/real_pv_controller.rs shows on a real kcm.
    if annotations.contains_key(ANN_MIGRATED_TO) {
        return Deleter::External;
    }
    if is_aws_source {
        return if migrated.contains(AWS_EBS_PLUGIN_NAME) {
            Deleter::External
        } else {
            Deleter::InTreeAwsEbs
        };
    }
    nobody()
}

pub(crate) async fn reclaim_volume(ctx: &Arc<Ctx>, volume: &PersistentVolume) -> Result<(), Error> {
    let name = volume.metadata.name.clone().unwrap_or_default();
    let policy = volume
        .spec
        .as_ref()
        .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
        .unwrap_or("Retain");
    match policy {
        "Retain" => Ok(()),
        "Recycle" => {
            let message = "No recycler plugin found for the volume! (Recycle is deprecated: use Delete with dynamic provisioning, or Retain)";
            if volume.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Failed") {
                update_volume_phase(ctx, volume, "Failed", Some(message)).await?;
            }
            ctx.events
                .volume(volume, true, events::VOLUME_FAILED_RECYCLE, message)
                .await;
            Ok(())
        }
        "Delete" => match find_deleter(volume, &ctx.options.migrated) {
            Deleter::External => {
                tracing::debug!(volume = %name, "left to its external deleter");
                Ok(())
            }
            Deleter::Nobody(message) => {
                update_volume_phase(ctx, volume, "Failed", Some(&message)).await?;
                ctx.events
                    .volume(volume, true, events::VOLUME_FAILED_DELETE, &message)
                    .await;
                Ok(())
            }
            Deleter::InTreeAwsEbs => {
                let op_ctx = ctx.clone();
                ctx.start_operation(format!("delete-{name}"), async move {
                    delete_volume_operation(&op_ctx, &name).await
                });
                Ok(())
            }
        },
        other => {
            let message = format!("unknown persistentVolumeReclaimPolicy {other:?}");
            update_volume_phase(ctx, volume, "Failed", Some(&message)).await?;
            ctx.events
                .volume(volume, true, events::VOLUME_FAILED_DELETE, &message)
                .await;
            Ok(())
        }
    }
}

/// The in-tree delete, on a fresh copy of the volume (another pass or a restart may have
/// deleted it already, or its claim may be back).
async fn delete_volume_operation(ctx: &Arc<Ctx>, name: &str) -> Result<(), Error> {
    let api = ctx.volumes_api();
    let Some(volume) = api
        .get_opt(name)
        .await
        .map_err(|e| Error::kube(format!("reading PersistentVolume {name}"), e))?
    else {
        return Ok(());
    };
    if !still_released(ctx, &volume).await? {
        return Ok(());
    }
    let started = Instant::now();
    let result = match &ctx.cloud {
        None => Err(Error::Plugin(volume_plugins::Error::NoCloud {
            operation: "delete",
            volume_id: volume
                .spec
                .as_ref()
                .and_then(|s| s.aws_elastic_block_store.as_ref())
                .map(|s| s.volume_id.clone())
                .unwrap_or_default(),
        })),
        Some(cloud) => provisioner::delete(cloud.as_ref(), &volume)
            .await
            .map_err(Error::Plugin),
    };
    ctx.metrics.operation(
        "volume_delete",
        AWS_EBS_PLUGIN_NAME,
        result.is_ok(),
        started.elapsed(),
    );
    match result {
        Ok(existed) => {
            tracing::info!(volume = %name, existed, "EBS volume deleted; deleting the PersistentVolume");
            match api.delete(name, &Default::default()).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                Err(e) => Err(Error::kube(format!("deleting PersistentVolume {name}"), e)),
            }
        }
        Err(e) => {
            let message = e.to_string();
            if let Err(pe) = update_volume_phase(ctx, &volume, "Failed", Some(&message)).await {
                tracing::debug!(volume = %name, error = %pe, "marking the volume Failed");
            }
            ctx.events
                .volume(&volume, true, events::VOLUME_FAILED_DELETE, &message)
                .await;
            Err(e)
        }
    }
}

/// kcm's `isVolumeReleased`, read from the API server: the ref has a uid and its claim is gone,
/// was re-created, or is bound to another volume.
async fn still_released(ctx: &Ctx, volume: &PersistentVolume) -> Result<bool, Error> {
    let Some(r) = volume.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
        return Ok(false);
    };
    let Some(uid) = r.uid.as_deref().filter(|u| !u.is_empty()) else {
        return Ok(false);
    };
    let namespace = r.namespace.clone().unwrap_or_default();
    let name = r.name.clone().unwrap_or_default();
    let claim = ctx
        .claims_api(&namespace)
        .get_opt(&name)
        .await
        .map_err(|e| {
            Error::kube(
                format!("reading PersistentVolumeClaim {namespace}/{name}"),
                e,
            )
        })?;
    Ok(match claim {
        None => true,
        Some(c) if c.metadata.uid.as_deref() != Some(uid) => true,
        Some(c) => {
            let bound_to = c.spec.and_then(|s| s.volume_name).unwrap_or_default();
            !bound_to.is_empty() && Some(bound_to) != volume.metadata.name
        }
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use serde_json::json;

    fn pv(v: serde_json::Value) -> PersistentVolume {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn deleters_as_kcm_finds_them() {
        let off = MigratedPlugins::none();
        let on = MigratedPlugins::from_feature_gates("CSIMigrationAWS=true").unwrap();
        let ebs = json!({"volumeID": "aws://us-east-1a/vol-1"});
        let in_tree = pv(json!({
            "metadata": {"name": "a", "annotations": {"pv.kubernetes.io/provisioned-by": "kubernetes.io/aws-ebs"}},
            "spec": {"awsElasticBlockStore": ebs}
        }));
        assert_eq!(find_deleter(&in_tree, &off), Deleter::InTreeAwsEbs);
        assert_eq!(find_deleter(&in_tree, &on), Deleter::External);
        let mut marked = in_tree.clone();
        marked
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(ANN_MIGRATED_TO.into(), "ebs.csi.aws.com".into());
        assert_eq!(find_deleter(&marked, &off), Deleter::External);
        let csi = pv(json!({
            "metadata": {"name": "c", "annotations": {"pv.kubernetes.io/provisioned-by": "hostpath.csi.k8s.io"}},
            "spec": {"csi": {"driver": "hostpath.csi.k8s.io", "volumeHandle": "h"}}
        }));
        assert_eq!(find_deleter(&csi, &off), Deleter::External);
        // Static (no provisioned-by): no deleter, as kcm v1.26 decides.
        let static_csi = pv(json!({
            "metadata": {"name": "sc"},
            "spec": {"csi": {"driver": "hostpath.csi.k8s.io", "volumeHandle": "h"}}
        }));
        match find_deleter(&static_csi, &off) {
            Deleter::Nobody(m) => assert!(
                m.contains("\"sc\": no deletable volume plugin matched"),
                "{m}"
            ),
            other => panic!("{other:?}"),
        }
        let static_ebs =
            pv(json!({"metadata": {"name": "s"}, "spec": {"awsElasticBlockStore": ebs}}));
        assert_eq!(find_deleter(&static_ebs, &off), Deleter::InTreeAwsEbs);
        let host = pv(json!({"metadata": {"name": "h"}, "spec": {"hostPath": {"path": "/x"}}}));
        match find_deleter(&host, &off) {
            Deleter::Nobody(m) => assert!(m.contains("no deletable volume plugin matched"), "{m}"),
            other => panic!("{other:?}"),
        }
    }
}
