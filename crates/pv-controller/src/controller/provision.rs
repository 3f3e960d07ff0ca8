//! Dynamic provisioning of a claim no volume matched (kcm's `provisionClaim`): the claim is
//! annotated with who provisions it (`volume.kubernetes.io/storage-provisioner` and its beta
//! twin, the CSI driver's name for a migrated in-tree class; no `pv.kubernetes.io/migrated-to`,
//! as kcm v1.26 writes them),
//! then an external provisioner is waited for (`ExternalProvisioning`), or the in-tree aws-ebs
//! provisioner runs here as an operation and creates the PV, pre-bound to the claim.

use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::PostParams;
use serde_json::json;
use volume_plugins::aws_ebs::provisioner::{self, LABEL_ZONE, ProvisionRequest};
use volume_plugins::names::AWS_EBS_PLUGIN_NAME;

use super::Ctx;
use super::bind::patch_claim;
use super::{claim_name, selected_node};
use crate::migration::{ClassProvisioner, claim_migrated_to, class_provisioner};
use crate::names::{
    ANN_BETA_STORAGE_PROVISIONER, ANN_MIGRATED_TO, ANN_SELECTED_NODE, ANN_STORAGE_PROVISIONER,
};
use crate::{Error, events};

/// The failure-domain zone label older nodes carry instead of [`LABEL_ZONE`].
const LABEL_BETA_ZONE: &str = "failure-domain.beta.kubernetes.io/zone";

pub(crate) async fn provision_claim(
    ctx: &Arc<Ctx>,
    claim: &PersistentVolumeClaim,
    class_name: &str,
    class: Option<&StorageClass>,
) -> Result<(), Error> {
    if !ctx.options.enable_dynamic_provisioning {
        return Ok(());
    }
    let Some(class) = class else {
        let message = format!("storageclass.storage.k8s.io {class_name:?} not found");
        ctx.events
            .claim(claim, true, events::PROVISIONING_FAILED, &message)
            .await;
        return Ok(());
    };
    let provisioner = class_provisioner(&class.provisioner, &ctx.options.migrated);
    let claim = set_claim_provisioner(ctx, claim, &provisioner).await?;
    match &provisioner {
        ClassProvisioner::External(name) | ClassProvisioner::Migrated { driver: name, .. } => {
            ctx.events
                .claim(
                    &claim,
                    false,
                    events::EXTERNAL_PROVISIONING,
                    &events::external_provisioning(name),
                )
                .await;
        }
        ClassProvisioner::Unsupported(name) => {
            let message = format!(
                "no volume plugin matched name: {name} (this controller provisions only {AWS_EBS_PLUGIN_NAME} in-tree; migrate the plugin to its CSI driver with --feature-gates)"
            );
            ctx.events
                .claim(&claim, true, events::PROVISIONING_FAILED, &message)
                .await;
        }
        ClassProvisioner::InTreeAwsEbs => {
            let uid = claim.metadata.uid.clone().unwrap_or_default();
            let namespace = claim.metadata.namespace.clone().unwrap_or_default();
            let name = claim.metadata.name.clone().unwrap_or_default();
            let op_ctx = ctx.clone();
            ctx.start_operation(format!("provision-{namespace}/{name}[{uid}]"), async move {
                provision_operation(&op_ctx, &namespace, &name, &uid).await
            });
        }
    }
    Ok(())
}

/// The storage-provisioner annotations as the class asks, and `migrated-to` as kcm's
/// `updateMigrationAnnotations` then leaves it (kcm's `setClaimProvisioner`); nothing is
/// written when they are already so.
async fn set_claim_provisioner(
    ctx: &Ctx,
    claim: &PersistentVolumeClaim,
    provisioner: &ClassProvisioner,
) -> Result<Arc<PersistentVolumeClaim>, Error> {
    let ann = claim.metadata.annotations.clone().unwrap_or_default();
    let value = provisioner.annotation_value();
    // kcm v1.26 runs `updateMigrationAnnotations` on the annotated claim: the annotation now
    // names the CSI driver (or an in-tree plugin that is not migrated), so no `migrated-to`.
    let mut annotated = claim.clone();
    annotated
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(ANN_STORAGE_PROVISIONER.to_string(), value.to_string());
    let migrated_to = claim_migrated_to(&annotated, &ctx.options.migrated);
    let migrated_to = migrated_to.as_deref();
    if ann.get(ANN_STORAGE_PROVISIONER).map(String::as_str) == Some(value)
        && ann.get(ANN_BETA_STORAGE_PROVISIONER).map(String::as_str) == Some(value)
        && ann.get(ANN_MIGRATED_TO).map(String::as_str) == migrated_to
    {
        return Ok(Arc::new(claim.clone()));
    }
    let patch = json!({"metadata": {"annotations": {
        ANN_STORAGE_PROVISIONER: value,
        ANN_BETA_STORAGE_PROVISIONER: value,
        ANN_MIGRATED_TO: migrated_to,
    }}});
    tracing::info!(claim = %claim_name(claim), provisioner = value, migrated_to, "storage provisioner set");
    patch_claim(ctx, claim, patch, false).await
}

/// The zone label of the selected node, if the claim has one.
async fn selected_node_zone(
    ctx: &Ctx,
    claim: &PersistentVolumeClaim,
) -> Result<Option<String>, Error> {
    let Some(node) = claim
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANN_SELECTED_NODE))
    else {
        return Ok(None);
    };
    let labels = selected_node(ctx, node).await?.labels;
    Ok(labels
        .get(LABEL_ZONE)
        .or_else(|| labels.get(LABEL_BETA_ZONE))
        .cloned())
}

/// The zones a class's `allowedTopologies` admit.
fn allowed_zones(class: &StorageClass) -> Vec<String> {
    class
        .allowed_topologies
        .iter()
        .flatten()
        .flat_map(|t| t.match_label_expressions.iter().flatten())
        .filter(|e| e.key == LABEL_ZONE || e.key == LABEL_BETA_ZONE)
        .flat_map(|e| e.values.clone())
        .collect()
}

/// One in-tree provisioning, on fresh copies of the claim and its class.
async fn provision_operation(
    ctx: &Arc<Ctx>,
    namespace: &str,
    name: &str,
    uid: &str,
) -> Result<(), Error> {
    let Some(claim) = ctx.claims_api(namespace).get_opt(name).await.map_err(|e| {
        Error::kube(
            format!("reading PersistentVolumeClaim {namespace}/{name}"),
            e,
        )
    })?
    else {
        return Ok(());
    };
    let bound = claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .is_some_and(|v| !v.is_empty());
    if claim.metadata.uid.as_deref() != Some(uid)
        || bound
        || claim.metadata.deletion_timestamp.is_some()
    {
        return Ok(());
    }
    let pv_name = format!("pvc-{uid}");
    let existing = ctx
        .volumes_api()
        .get_opt(&pv_name)
        .await
        .map_err(|e| Error::kube(format!("reading PersistentVolume {pv_name}"), e))?;
    if existing.is_some() {
        return Ok(());
    }
    let class_name = super::index::claim_class(&claim);
    let Some(class) = ctx.caches.classes.get(&class_name) else {
        return Ok(());
    };
    // The class's parameters are checked first: a class no cloud could serve says so whether
    // or not a cloud is configured.
    if let Err(e) = provisioner::parse_parameters(&class.parameters.clone().unwrap_or_default()) {
        let message = format!("Failed to provision volume with StorageClass {class_name:?}: {e}");
        ctx.events
            .claim(&claim, true, events::PROVISIONING_FAILED, &message)
            .await;
        return Err(Error::Plugin(e));
    }
    let Some(cloud) = ctx.cloud.clone() else {
        let e = volume_plugins::Error::NoCloud {
            operation: "provision",
            volume_id: pv_name.clone(),
        };
        ctx.events
            .claim(&claim, true, events::PROVISIONING_FAILED, &e.to_string())
            .await;
        return Err(Error::Plugin(e));
    };
    let zone = selected_node_zone(ctx, &claim).await?;
    let allowed = allowed_zones(&class);
    let parameters = class.parameters.clone().unwrap_or_default();
    let mount_options = class.mount_options.clone().unwrap_or_default();
    let reclaim_policy = class
        .reclaim_policy
        .clone()
        .unwrap_or_else(|| "Delete".into());
    let request = ProvisionRequest {
        pv_name: &pv_name,
        claim: &claim,
        storage_class_name: &class_name,
        parameters: &parameters,
        reclaim_policy: &reclaim_policy,
        mount_options: &mount_options,
        cluster_name: &ctx.options.cluster_name,
        selected_node_zone: zone.as_deref(),
        allowed_zones: &allowed,
    };
    let started = Instant::now();
    let provisioned = match provisioner::provision(cloud.as_ref(), &request).await {
        Ok(p) => p,
        Err(e) => {
            ctx.metrics.operation(
                "volume_provision",
                AWS_EBS_PLUGIN_NAME,
                false,
                started.elapsed(),
            );
            let message =
                format!("Failed to provision volume with StorageClass {class_name:?}: {e}");
            ctx.events
                .claim(&claim, true, events::PROVISIONING_FAILED, &message)
                .await;
            return Err(Error::Plugin(e));
        }
    };
    tracing::info!(claim = %claim_name(&claim), volume = %provisioned.volume_id, zone = %provisioned.zone, created = provisioned.created, "EBS volume provisioned; creating the PersistentVolume");
    match ctx
        .volumes_api()
        .create(&PostParams::default(), &provisioned.pv)
        .await
    {
        Ok(pv) => {
            ctx.remember_volume(pv);
        }
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => {
            ctx.metrics.operation(
                "volume_provision",
                AWS_EBS_PLUGIN_NAME,
                false,
                started.elapsed(),
            );
            return Err(Error::kube(
                format!("creating PersistentVolume {pv_name}"),
                e,
            ));
        }
    }
    ctx.metrics.operation(
        "volume_provision",
        AWS_EBS_PLUGIN_NAME,
        true,
        started.elapsed(),
    );
    let message = format!("Successfully provisioned volume {pv_name} using {AWS_EBS_PLUGIN_NAME}");
    ctx.events
        .claim(&claim, false, events::PROVISIONING_SUCCEEDED, &message)
        .await;
    Ok(())
}
