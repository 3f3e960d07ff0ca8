//! Which volume a claim binds to: kube-controller-manager's volume index
//! (`findBestMatchForClaim`). Volumes are grouped by their access modes; the groups whose modes
//! include all of the claim's are tried from the fewest modes up, and in the first group with
//! a match the smallest volume at least as big as the request wins. A volume pre-bound to the
//! claim (`spec.claimRef` naming it) wins over a smaller one, but only when it is big enough.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use volume_plugins::aws_ebs::provisioner::quantity_to_bytes;

use crate::names::ANN_BETA_STORAGE_CLASS;

/// The node a claim is to be used on (`volume.kubernetes.io/selected-node`), as matching needs
/// it.
#[derive(Debug, Clone, Default)]
pub(crate) struct NodeInfo {
    pub name: String,
    pub labels: BTreeMap<String, String>,
}

/// The claim's class: the beta annotation wins over `spec.storageClassName`; none is "".
pub(crate) fn claim_class(claim: &PersistentVolumeClaim) -> String {
    if let Some(c) = claim
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANN_BETA_STORAGE_CLASS))
    {
        return c.clone();
    }
    claim
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.clone())
        .unwrap_or_default()
}

/// The volume's class, read the same way.
pub(crate) fn volume_class(volume: &PersistentVolume) -> String {
    if let Some(c) = volume
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANN_BETA_STORAGE_CLASS))
    {
        return c.clone();
    }
    volume
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.clone())
        .unwrap_or_default()
}

/// The claim's requested bytes (`spec.resources.requests.storage`).
pub(crate) fn requested_bytes(claim: &PersistentVolumeClaim) -> Result<u128, String> {
    let q = claim
        .spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .ok_or("spec.resources.requests.storage is missing")?;
    quantity_to_bytes(&q.0).ok_or_else(|| {
        format!(
            "spec.resources.requests.storage {:?} is not a quantity",
            q.0
        )
    })
}

/// The volume's bytes (`spec.capacity.storage`); 0 when unreadable (it then matches nothing).
pub(crate) fn volume_bytes(volume: &PersistentVolume) -> u128 {
    volume
        .spec
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get("storage"))
        .and_then(|q| quantity_to_bytes(&q.0))
        .unwrap_or(0)
}

fn claim_modes(claim: &PersistentVolumeClaim) -> BTreeSet<String> {
    claim
        .spec
        .as_ref()
        .and_then(|s| s.access_modes.clone())
        .unwrap_or_default()
        .into_iter()
        .collect()
}

fn volume_modes(volume: &PersistentVolume) -> BTreeSet<String> {
    volume
        .spec
        .as_ref()
        .and_then(|s| s.access_modes.clone())
        .unwrap_or_default()
        .into_iter()
        .collect()
}

/// Whether the volume offers every access mode the claim asks for.
pub(crate) fn access_modes_satisfied(
    claim: &PersistentVolumeClaim,
    volume: &PersistentVolume,
) -> bool {
    claim_modes(claim).is_subset(&volume_modes(volume))
}

/// Whether claim and volume disagree on `volumeMode` (unset is Filesystem on both sides).
pub(crate) fn volume_mode_mismatch(
    claim: &PersistentVolumeClaim,
    volume: &PersistentVolume,
) -> bool {
    let c = claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_mode.as_deref())
        .unwrap_or("Filesystem");
    let v = volume
        .spec
        .as_ref()
        .and_then(|s| s.volume_mode.as_deref())
        .unwrap_or("Filesystem");
    c != v
}

/// Whether `volume.spec.claimRef` names this claim (and its uid, when the ref has one).
pub(crate) fn is_volume_bound_to_claim(
    volume: &PersistentVolume,
    claim: &PersistentVolumeClaim,
) -> bool {
    let Some(r) = volume.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
        return false;
    };
    r.name == claim.metadata.name
        && r.namespace == claim.metadata.namespace
        && r.uid
            .as_deref()
            .is_none_or(|u| u.is_empty() || Some(u) == claim.metadata.uid.as_deref())
}

/// Whether a label selector admits `labels` (matchLabels and every matchExpression).
pub(crate) fn selector_matches(
    selector: &LabelSelector,
    labels: &BTreeMap<String, String>,
) -> Result<bool, String> {
    if let Some(ml) = &selector.match_labels {
        if ml.iter().any(|(k, v)| labels.get(k) != Some(v)) {
            return Ok(false);
        }
    }
    for e in selector.match_expressions.iter().flatten() {
        let values = e.values.clone().unwrap_or_default();
        let value = labels.get(&e.key);
        let ok = match e.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            other => {
                return Err(format!(
                    "spec.selector.matchExpressions: operator {other:?} is not In, NotIn, Exists or DoesNotExist"
                ));
            }
        };
        if !ok {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Whether the volume's `spec.nodeAffinity.required` admits the node (no affinity: any node).
pub(crate) fn node_affinity_matches(volume: &PersistentVolume, node: &NodeInfo) -> bool {
    let Some(required) = volume
        .spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
    else {
        return true;
    };
    component_runtime::node_selector::terms_match(
        &required.node_selector_terms,
        &node.name,
        &node.labels,
    )
}

/// One volume with what matching reads, computed once per pass.
#[derive(Debug)]
struct Entry {
    volume: Arc<PersistentVolume>,
    modes: BTreeSet<String>,
    bytes: u128,
    class: String,
    /// Available, no claimRef, not being deleted: may be given to any claim that fits.
    free: bool,
}

/// kcm's volume index: every volume with its access modes, size and class precomputed, so a
/// pass over many pending claims does not recompute them per claim. Volumes bound during the
/// pass are marked taken.
#[derive(Debug)]
pub(crate) struct VolumeIndex {
    entries: Vec<Entry>,
    /// The distinct access-mode sets, fewest modes first.
    groups: Vec<BTreeSet<String>>,
    /// Entries whose claimRef names a claim, by that claim's namespace and name: a claim looks
    /// only at its own, not at every volume (every claim at every pass was 1,000 × 1,000 checks
    /// in a burst of 1,000 claims, most of them of volumes bound long ago).
    by_claim: HashMap<(String, String), Vec<usize>>,
    /// Entries free when the index was built, in order.
    free: Vec<usize>,
}

impl VolumeIndex {
    pub(crate) fn new(volumes: &[Arc<PersistentVolume>]) -> Self {
        let entries: Vec<Entry> = volumes
            .iter()
            .map(|v| {
                let phase = v.status.as_ref().and_then(|s| s.phase.as_deref());
                let has_ref = v.spec.as_ref().and_then(|s| s.claim_ref.as_ref()).is_some();
                Entry {
                    volume: v.clone(),
                    modes: volume_modes(v),
                    bytes: volume_bytes(v),
                    class: volume_class(v),
                    free: phase == Some("Available")
                        && !has_ref
                        && v.metadata.deletion_timestamp.is_none(),
                }
            })
            .collect();
        let mut groups: Vec<BTreeSet<String>> = entries
            .iter()
            .map(|e| e.modes.clone())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        groups.sort_by_key(BTreeSet::len);
        let mut by_claim: HashMap<(String, String), Vec<usize>> = HashMap::new();
        let mut free = Vec::new();
        for (i, e) in entries.iter().enumerate() {
            if e.free {
                free.push(i);
            }
            if let Some(r) = e.volume.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) {
                let key = (
                    r.namespace.clone().unwrap_or_default(),
                    r.name.clone().unwrap_or_default(),
                );
                by_claim.entry(key).or_default().push(i);
            }
        }
        Self {
            entries,
            groups,
            by_claim,
            free,
        }
    }

    /// [`Self::find_best_match`], and the volume found is marked taken in the same step:
    /// claims synced side by side never get the same volume from the index (a resourceVersion
    /// precondition on the volume's write stays the backstop).
    pub(crate) fn take_best_match(
        &mut self,
        claim: &PersistentVolumeClaim,
        node: Option<&NodeInfo>,
        delay_binding: bool,
    ) -> Result<Option<Arc<PersistentVolume>>, String> {
        let found = self.find_best_match(claim, node, delay_binding)?;
        if let Some(v) = &found {
            self.mark_taken(v.metadata.name.as_deref().unwrap_or_default());
        }
        Ok(found)
    }

    /// The volume was just bound: no other claim of this pass may have it.
    pub(crate) fn mark_taken(&mut self, name: &str) {
        for e in &mut self.entries {
            if e.volume.metadata.name.as_deref() == Some(name) {
                e.free = false;
            }
        }
    }

    /// kcm's `findBestMatchForClaim`: the volume the claim should bind to, if any. A volume
    /// pre-bound to the claim always wins. `node`: the selected node of a WaitForFirstConsumer
    /// claim (an unbound volume's affinity must admit it); `delay_binding` without a node
    /// binds only a volume pre-bound to the claim.
    pub(crate) fn find_best_match(
        &self,
        claim: &PersistentVolumeClaim,
        node: Option<&NodeInfo>,
        delay_binding: bool,
    ) -> Result<Option<Arc<PersistentVolume>>, String> {
        let requested = requested_bytes(claim)?;
        let wanted = claim_modes(claim);
        let class = claim_class(claim);
        let selector = claim.spec.as_ref().and_then(|s| s.selector.as_ref());
        let key = (
            claim.metadata.namespace.clone().unwrap_or_default(),
            claim.metadata.name.clone().unwrap_or_default(),
        );
        let prebound = self.by_claim.get(&key).map_or(&[][..], Vec::as_slice);
        // Size, volume mode and deletion are checked before the pre-binding (kcm's
        // findMatchingVolume): a volume pre-bound to the claim but too small for it, of the
        // other volume mode, or being deleted does not win (nor, through the access-mode
        // groups, one without the claim's access modes).
        let fits = |e: &Entry| {
            e.bytes >= requested
                && !volume_mode_mismatch(claim, &e.volume)
                && e.volume.metadata.deletion_timestamp.is_none()
        };
        for group in self.groups.iter().filter(|g| wanted.is_subset(g)) {
            // Pre-bound (a provisioner made it for this claim, the scheduler chose it, or a
            // user reserved it): bound whatever its class and whatever the selected node's
            // labels say, as kcm's PV controller does (it never passes a node here; placement
            // is the scheduler's). Waiting for the node to match held a just-provisioned
            // volume until the next resync after the node's labels caught up.
            let mine = prebound.iter().map(|&i| &self.entries[i]).find(|e| {
                &e.modes == group && fits(e) && is_volume_bound_to_claim(&e.volume, claim)
            });
            if let Some(e) = mine {
                return Ok(Some(e.volume.clone()));
            }
            if node.is_none() && delay_binding {
                continue;
            }
            let mut smallest: Option<&Entry> = None;
            for e in self.free.iter().map(|&i| &self.entries[i]) {
                if &e.modes != group || !e.free || e.class != class || !fits(e) {
                    continue;
                }
                if smallest.is_some_and(|s| s.bytes <= e.bytes) {
                    continue;
                }
                if let Some(sel) = selector {
                    let labels = e.volume.metadata.labels.clone().unwrap_or_default();
                    if !selector_matches(sel, &labels)? {
                        continue;
                    }
                }
                if node.is_some_and(|n| !node_affinity_matches(&e.volume, n)) {
                    continue;
                }
                smallest = Some(e);
            }
            if let Some(e) = smallest {
                return Ok(Some(e.volume.clone()));
            }
        }
        Ok(None)
    }
}

/// [`VolumeIndex::find_best_match`] over `volumes`.
#[cfg(test)]
pub(crate) fn find_best_match_for_claim(
    claim: &PersistentVolumeClaim,
    volumes: &[Arc<PersistentVolume>],
    node: Option<&NodeInfo>,
    delay_binding: bool,
) -> Result<Option<Arc<PersistentVolume>>, String> {
    VolumeIndex::new(volumes).find_best_match(claim, node, delay_binding)
}

#[cfg(test)]
#[path = "index_tests.rs"]
mod tests;

/// The default StorageClass: marked with the GA or beta annotation; of several, the newest
/// (then the first by name), as Kubernetes picks since 1.26.
pub(crate) fn default_class(
    classes: &[std::sync::Arc<k8s_openapi::api::storage::v1::StorageClass>],
) -> Option<String> {
    const MARKS: [&str; 2] = [
        crate::names::ANN_DEFAULT_CLASS,
        "storageclass.beta.kubernetes.io/is-default-class",
    ];
    classes
        .iter()
        .filter(|c| {
            c.metadata.annotations.as_ref().is_some_and(|a| {
                MARKS
                    .iter()
                    .any(|m| a.get(*m).map(String::as_str) == Some("true"))
            })
        })
        .map(|c| {
            (
                c.metadata.creation_timestamp.as_ref().map(|t| t.0),
                c.metadata.name.clone().unwrap_or_default(),
            )
        })
        .max_by(|a, b| a.0.cmp(&b.0).then_with(|| b.1.cmp(&a.1)))
        .map(|(_, name)| name)
}
