//! One claim: decide, build the request, CreateVolume, create the PV.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use csi_spec::v1::Volume;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::runtime::reflector::ObjectRef;

use super::kube_io::{self, Created};
use super::{Ctx, InProgress, data_source};
use crate::claim::{ClassKind, Decision};
use crate::secrets::{self, SecretKind};
use crate::topology::{self, NodeTopology};
use crate::{Error, claim, create_request, events, migration, pv};
use component_runtime::workqueue::{Outcome, SINGLE_LANE};

pub(crate) async fn sync_claim(ctx: &Arc<Ctx>, key: &str, ns: &str, name: &str) -> Outcome {
    let Some(pvc) = ctx.pvcs.get(&ObjectRef::new(name).within(ns)) else {
        ctx.is_stale_rescheduled(key, None);
        return finish_abandoned(ctx, key).await;
    };
    if ctx.is_stale_rescheduled(key, pvc.metadata.resource_version.as_deref()) {
        // Handed back to the scheduler: the watch will bring the claim without its node.
        return Outcome::Done;
    }
    let in_flight = ctx.in_progress().get(key).cloned();
    if let Some(p) = in_flight.filter(|p| Some(p.claim_uid.as_str()) != pvc.metadata.uid.as_deref())
    {
        // Deleted and re-created under the same name while a CreateVolume was uncertain:
        // clean up the old one, then look at the new claim.
        let outcome = finish_abandoned_with(ctx, key, p).await;
        if outcome == Outcome::Done {
            ctx.queue.add(key, SINGLE_LANE);
        }
        return outcome;
    }
    let class = claim::class_name(&pvc).and_then(|c| ctx.classes.get(&ObjectRef::new(c)));
    let kind = match claim::decide_on_node(
        &pvc,
        class.as_deref(),
        &ctx.driver.name,
        ctx.options.node_deployment.as_deref(),
    ) {
        Decision::Skip(why) => {
            tracing::debug!(claim = %key, %why, "not provisioning");
            return Outcome::Done;
        }
        Decision::Provision(kind) => kind,
    };
    let Some(class) = class else {
        return Outcome::Done;
    };
    let class_name = class.metadata.name.clone().unwrap_or_default();
    let started = Instant::now();
    match provision(ctx, key, &pvc, &class, &kind).await {
        Ok(Some(pv_name)) => {
            ctx.metrics.provisioned(&class_name, started.elapsed());
            kube_io::event(
                ctx,
                pvc.as_ref(),
                false,
                events::PROVISIONING_SUCCEEDED,
                &events::provisioning_succeeded(&pv_name),
            )
            .await;
            Outcome::Done
        }
        Ok(None) => Outcome::Done,
        Err(e) => {
            tracing::warn!(claim = %key, error = %e, "provisioning failed; will retry");
            ctx.metrics.provision_failed(&class_name);
            if claim::selected_node(&pvc).is_some() && e.asks_for_reschedule() {
                // Nothing goes on in the background: let the scheduler choose another node.
                ctx.in_progress().remove(key);
                match kube_io::forget_selected_node(ctx, &pvc).await {
                    Ok(()) => {
                        ctx.remember_rescheduled(key, pvc.metadata.resource_version.as_deref());
                    }
                    Err(e) => {
                        tracing::warn!(claim = %key, error = %e, "could not ask for rescheduling");
                    }
                }
            }
            kube_io::event(
                ctx,
                pvc.as_ref(),
                true,
                events::PROVISIONING_FAILED,
                &events::provisioning_failed(&class_name, &e),
            )
            .await;
            Outcome::Retry
        }
    }
}

/// Provisions; `Ok(None)` when there was nothing to do (the PV exists already).
async fn provision(
    ctx: &Arc<Ctx>,
    key: &str,
    pvc: &PersistentVolumeClaim,
    class: &StorageClass,
    kind: &ClassKind,
) -> Result<Option<String>, Error> {
    let uid = pvc.metadata.uid.clone().unwrap_or_default();
    let pv_name = create_request::volume_name(
        &ctx.options.volume_name_prefix,
        &uid,
        ctx.options.volume_name_uuid_length,
    );
    let (request_class, migrated, provisioned_by) = match kind {
        ClassKind::Csi => (class.clone(), false, ctx.driver.name.clone()),
        ClassKind::MigratedInTree { in_tree_plugin } => (
            migration::translate_class(in_tree_plugin, class)?,
            true,
            in_tree_plugin.clone(),
        ),
    };
    if ctx.created_not_seen.contains(&pv_name) {
        return Ok(None);
    }
    if let Some(existing) = ctx.pvs.get(&ObjectRef::new(&pv_name)) {
        if pv::is_ours_for(&existing, pvc, &provisioned_by) {
            ctx.in_progress().remove(key);
            return Ok(None);
        }
    }
    let params = request_class.parameters.clone().unwrap_or_default();
    let mut secret_refs = BTreeMap::new();
    for kind in SecretKind::ALL {
        if let Some(r) = secrets::secret_ref(kind, &params, &pv_name, pvc)? {
            secret_refs.insert(pv::key(kind), r);
        }
    }
    let deletion_secret = secret_refs.get(&pv::key(SecretKind::Provisioner)).cloned();
    let mut request = create_request::build(
        pvc,
        &request_class,
        &create_request::Settings {
            volume_name: &pv_name,
            default_fstype: &ctx.options.default_fstype,
            extra_create_metadata: ctx.options.extra_create_metadata,
        },
    )?;
    if let Some(r) = &deletion_secret {
        request.secrets = kube_io::secret_data(ctx, r).await?;
    }
    if ctx.options.topology && ctx.driver.capabilities.topology {
        request.accessibility_requirements = requirements(ctx, pvc, &request_class, &pv_name)?;
    }
    request.volume_content_source = data_source::content_source(ctx, pvc).await?;

    kube_io::event(
        ctx,
        pvc,
        false,
        events::PROVISIONING,
        &events::provisioning(
            pvc.metadata.namespace.as_deref().unwrap_or_default(),
            pvc.metadata.name.as_deref().unwrap_or_default(),
        ),
    )
    .await;
    ctx.in_progress().insert(
        key.to_string(),
        InProgress {
            request: request.clone(),
            claim_uid: uid.clone(),
            deletion_secret: deletion_secret.clone(),
            migrated,
        },
    );
    let volume = match ctx
        .driver
        .create_volume(
            request.clone(),
            ctx.options.timeout,
            ctx.observer.as_ref(),
            migrated,
        )
        .await
    {
        Ok(v) => v,
        Err(e) => {
            if !e.maybe_in_progress() {
                // A final answer: the driver made nothing.
                ctx.in_progress().remove(key);
            }
            return Err(e);
        }
    };
    let block = create_request::is_block(pvc);
    let fs_type = (!block).then(|| create_request::fs_type(&params, &ctx.options.default_fstype));
    let required = request
        .capacity_range
        .map(|c| c.required_bytes)
        .unwrap_or_default();
    let mut new_pv = pv::build(&pv::Inputs {
        pvc,
        class,
        driver: &ctx.driver.name,
        pv_name: &pv_name,
        volume: &volume,
        requested_bytes: required,
        fs_type,
        secrets: secret_refs,
        identity: &ctx.identity,
    });
    if let ClassKind::MigratedInTree { in_tree_plugin } = kind {
        new_pv = migration::to_in_tree(&new_pv, in_tree_plugin, &ctx.driver.name)?;
    }
    // The claim may have gone while the driver worked: then nobody would ever bind (and
    // release) the PV, so the volume goes now.
    let ns = pvc.metadata.namespace.clone().unwrap_or_default();
    let name = pvc.metadata.name.clone().unwrap_or_default();
    let current = kube_io::current_claim(ctx, &ns, &name).await?;
    if current.and_then(|c| c.metadata.uid) != Some(uid) {
        tracing::info!(claim = %key, volume = %volume.volume_id, "claim deleted while provisioning; deleting the volume");
        delete_abandoned(ctx, &volume, deletion_secret.as_ref(), migrated).await?;
        ctx.in_progress().remove(key);
        return Ok(None);
    }
    match kube_io::create_pv(ctx, &new_pv).await? {
        Created::Created => {}
        Created::Exists(existing) if pv::is_ours_for(&existing, pvc, &provisioned_by) => {}
        Created::Exists(_) => {
            return Err(Error::InvalidClaim(format!(
                "a PersistentVolume named {pv_name} exists and is not the one provisioned for this claim"
            )));
        }
    }
    ctx.created_not_seen.insert(&pv_name);
    ctx.in_progress().remove(key);
    tracing::info!(claim = %key, pv = %pv_name, volume = %volume.volume_id, "provisioned");
    Ok(Some(pv_name))
}

fn requirements(
    ctx: &Ctx,
    pvc: &PersistentVolumeClaim,
    class: &StorageClass,
    pv_name: &str,
) -> Result<Option<csi_spec::v1::TopologyRequirement>, Error> {
    let nodes: Vec<NodeTopology> = ctx
        .csinodes
        .state()
        .iter()
        .filter_map(|c| node_topology(ctx, c.metadata.name.as_deref().unwrap_or_default()).ok())
        .collect();
    let selected = match claim::selected_node(pvc) {
        Some(n) => {
            if ctx.nodes.get(&ObjectRef::new(n)).is_none() {
                return Err(Error::SelectedNodeNotFound(format!(
                    "selected node {n:?} not found"
                )));
            }
            Some(node_topology(ctx, n).map_err(|e| match e {
                Error::Topology(m) if ctx.csinodes.get(&ObjectRef::new(n)).is_none() => {
                    Error::SelectedNodeNotFound(m)
                }
                e => e,
            })?)
        }
        None => None,
    };
    topology::requirements(topology::Inputs {
        selected: selected.as_ref(),
        nodes: &nodes,
        allowed: class.allowed_topologies.as_deref().unwrap_or_default(),
        strict: ctx.options.strict_topology,
        immediate: ctx.options.immediate_topology,
        volume_name: pv_name,
    })
}

/// The node's topology keys for our driver (its CSINode) and its labels.
fn node_topology(ctx: &Ctx, node: &str) -> Result<NodeTopology, Error> {
    let csinode = ctx.csinodes.get(&ObjectRef::new(node)).ok_or_else(|| {
        Error::Topology(format!(
            "error getting CSINode for selected node {node:?}: not found"
        ))
    })?;
    let entry = csinode
        .spec
        .drivers
        .iter()
        .find(|d| d.name == ctx.driver.name)
        .ok_or_else(|| {
            Error::Topology(format!(
                "CSINode {node} has no entry for driver {}: its node plugin has not registered",
                ctx.driver.name
            ))
        })?;
    let labels = ctx
        .nodes
        .get(&ObjectRef::new(node))
        .and_then(|n| n.metadata.labels.clone())
        .unwrap_or_default();
    Ok(NodeTopology {
        name: node.to_string(),
        keys: entry.topology_keys.clone().unwrap_or_default(),
        labels,
    })
}

async fn delete_abandoned(
    ctx: &Ctx,
    volume: &Volume,
    secret: Option<&k8s_openapi::api::core::v1::SecretReference>,
    migrated: bool,
) -> Result<(), Error> {
    let secrets = match secret {
        Some(r) => kube_io::secret_data(ctx, r).await?,
        None => Default::default(),
    };
    ctx.driver
        .delete_volume(
            &volume.volume_id,
            secrets,
            ctx.options.timeout,
            ctx.observer.as_ref(),
            migrated,
        )
        .await
}

/// The claim is gone. If a CreateVolume of it was uncertain, finish it (same request) and
/// delete what it made; otherwise there is nothing to do.
async fn finish_abandoned(ctx: &Ctx, key: &str) -> Outcome {
    let entry = ctx.in_progress().get(key).cloned();
    match entry {
        Some(p) => finish_abandoned_with(ctx, key, p).await,
        None => Outcome::Done,
    }
}

async fn finish_abandoned_with(ctx: &Ctx, key: &str, p: InProgress) -> Outcome {
    // A PV made for it after all is released and deleted the normal way.
    let has_pv = ctx.pvs.get(&ObjectRef::new(&p.request.name)).is_some();
    if has_pv {
        ctx.in_progress().remove(key);
        return Outcome::Done;
    }
    let result = match ctx
        .driver
        .create_volume(
            p.request.clone(),
            ctx.options.timeout,
            ctx.observer.as_ref(),
            p.migrated,
        )
        .await
    {
        Ok(volume) => delete_abandoned(ctx, &volume, p.deletion_secret.as_ref(), p.migrated).await,
        Err(e) if !e.maybe_in_progress() => Ok(()),
        Err(e) => Err(e),
    };
    match result {
        Ok(()) => {
            tracing::info!(claim = %key, name = %p.request.name, "claim deleted while provisioning: volume removed");
            ctx.in_progress().remove(key);
            Outcome::Done
        }
        Err(e) => {
            tracing::warn!(claim = %key, error = %e, "cleaning up the volume of a deleted claim failed; will retry");
            Outcome::Retry
        }
    }
}
