//! The pod's claims, as kube-scheduler's VolumeBinding and VolumeRestrictions plugins see them:
//! a pre-filter on the pod (claims exist, immediate ones are bound, ReadWriteOncePod claims
//! are free) and a filter per node (bound volumes' `nodeAffinity`; WaitForFirstConsumer claims
//! provisionable there).

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;

use super::{Snapshot, claim_names, is_active, node, pod_claims, pod_key};

pub(crate) const UNBOUND_IMMEDIATE: &str = "pod has unbound immediate PersistentVolumeClaims";
pub(crate) const NODE_CONFLICT: &str = "node(s) had volume node affinity conflict";
pub(crate) const BIND_CONFLICT: &str = "node(s) didn't find available persistent volumes to bind";
pub(crate) const RWOP_CONFLICT: &str =
    "node has pod using PersistentVolumeClaim with the same name and ReadWriteOncePod access mode";
/// A class with this provisioner has only pre-made volumes.
const NO_PROVISIONER: &str = "kubernetes.io/no-provisioner";

/// What the pre-filter found out about the pod's claims.
#[derive(Default)]
pub(crate) struct PodClaims {
    /// Bound claims' volumes.
    pub bound: Vec<Arc<PersistentVolume>>,
    /// WaitForFirstConsumer claims still to be bound, with their class.
    pub delayed: Vec<(Arc<PersistentVolumeClaim>, Arc<StorageClass>)>,
}

/// The claim is bound to a volume (the PV controller finished: `volumeName` and phase Bound).
pub(crate) fn is_bound(claim: &PersistentVolumeClaim) -> bool {
    claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .is_some_and(|v| !v.is_empty())
        && claim.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
}

/// Whether the controlling ownerReference of `claim` is `pod`.
fn controlled_by_pod(claim: &PersistentVolumeClaim, pod: &Pod) -> bool {
    claim
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
        .is_some_and(|r| Some(r.uid.as_str()) == pod.metadata.uid.as_deref())
}

/// Pod-level checks; `Err` is the message for every node.
pub(crate) fn pre_filter(pod: &Pod, snapshot: &Snapshot) -> Result<PodClaims, String> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    let mut out = PodClaims::default();
    let mut unbound_immediate = false;
    for (name, ephemeral) in pod_claims(pod) {
        let Some(claim) = snapshot.claim(namespace, &name) else {
            return Err(format!("persistentvolumeclaim \"{name}\" not found"));
        };
        // A generic ephemeral volume's claim must be the pod's own (kube-scheduler checks
        // the controlling ownerReference the same way): someone else's claim of that name is
        // never used.
        if ephemeral && !controlled_by_pod(claim, pod) {
            return Err(format!(
                "PVC {namespace}/{name} was not created for pod {namespace}/{} (pod is not owner)",
                pod.metadata.name.as_deref().unwrap_or_default()
            ));
        }
        if claim.metadata.deletion_timestamp.is_some() {
            return Err(format!("persistentvolumeclaim \"{name}\" is being deleted"));
        }
        if read_write_once_pod(claim) && used_by_other_pod(pod, namespace, &name, snapshot) {
            return Err(RWOP_CONFLICT.into());
        }
        let volume_name = claim
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.clone())
            .unwrap_or_default();
        if !volume_name.is_empty() {
            let Some(volume) = snapshot.volumes.get(&volume_name) else {
                return Err(format!("persistentvolume \"{volume_name}\" not found"));
            };
            out.bound.push(volume.clone());
            continue;
        }
        let class_name = Snapshot::claim_class_name(claim);
        let class = (!class_name.is_empty())
            .then(|| snapshot.classes.get(&class_name))
            .flatten();
        match class {
            Some(c) if c.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer") => {
                out.delayed.push((claim.clone(), c.clone()));
            }
            None if !class_name.is_empty() => {
                return Err(format!(
                    "storageclass.storage.k8s.io \"{class_name}\" not found"
                ));
            }
            _ => unbound_immediate = true,
        }
    }
    if unbound_immediate {
        return Err(UNBOUND_IMMEDIATE.into());
    }
    Ok(out)
}

fn read_write_once_pod(claim: &PersistentVolumeClaim) -> bool {
    claim
        .spec
        .as_ref()
        .and_then(|s| s.access_modes.as_ref())
        .is_some_and(|m| m.iter().any(|m| m == "ReadWriteOncePod"))
}

/// Another active pod (on any node, or assumed) uses the claim.
fn used_by_other_pod(pod: &Pod, namespace: &str, claim: &str, snapshot: &Snapshot) -> bool {
    let me = pod_key(pod);
    snapshot.pods_on_node.values().flatten().any(|other| {
        pod_key(other) != me
            && is_active(other)
            && other.metadata.namespace.as_deref() == Some(namespace)
            && claim_names(other).iter().any(|c| c == claim)
    })
}

/// Whether the claims can be used on `node` (`None`) or why not.
pub(crate) fn filter(claims: &PodClaims, node: &Node, snapshot: &Snapshot) -> Option<String> {
    for volume in &claims.bound {
        let terms = volume
            .spec
            .as_ref()
            .and_then(|s| s.node_affinity.as_ref())
            .and_then(|a| a.required.as_ref())
            .map(|r| r.node_selector_terms.as_slice());
        if let Some(terms) = terms
            && !node::matches_terms(terms, node)
        {
            return Some(NODE_CONFLICT.into());
        }
    }
    for (_, class) in &claims.delayed {
        let provisionable = class.provisioner != NO_PROVISIONER && node::class_allows(class, node);
        if !provisionable && !static_volume_fits(class, node, snapshot) {
            return Some(BIND_CONFLICT.into());
        }
    }
    None
}

/// A pre-made Available volume of the claim's class that the node can reach (the PV controller
/// then binds it once the node is selected).
fn static_volume_fits(class: &StorageClass, node: &Node, snapshot: &Snapshot) -> bool {
    let class_name = class.metadata.name.as_deref().unwrap_or_default();
    snapshot.volumes.values().any(|v| {
        let spec = v.spec.as_ref();
        let available = v.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Available")
            && spec.and_then(|s| s.claim_ref.as_ref()).is_none();
        let same_class = spec.and_then(|s| s.storage_class_name.as_deref()) == Some(class_name);
        let reachable = spec
            .and_then(|s| s.node_affinity.as_ref())
            .and_then(|a| a.required.as_ref())
            .is_none_or(|r| node::matches_terms(&r.node_selector_terms, node));
        available && same_class && reachable
    })
}
