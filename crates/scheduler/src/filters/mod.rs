//! The filters of one scheduling attempt, on a snapshot of the caches taken at the start of a
//! pass (kube-scheduler's cycle snapshot). Pods placed earlier in the same pass are added to
//! the snapshot ("assumed"), so two pods of one pass count each other.

pub(crate) mod limits;
pub(crate) mod node;
pub(crate) mod volumes;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass};

/// `namespace/name`.
pub(crate) fn pod_key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// A pod that holds node resources: on a node and not finished.
pub(crate) fn is_active(pod: &Pod) -> bool {
    !matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// The claims a pod's volumes name, in order: a `persistentVolumeClaim` volume's claim, and a
/// generic ephemeral volume's claim `<pod>-<volume>` (which the ephemeral volume controller
/// makes; kube-scheduler treats both alike).
pub(crate) fn claim_names(pod: &Pod) -> Vec<String> {
    pod_claims(pod).into_iter().map(|(name, _)| name).collect()
}

/// [`claim_names`], each with whether it is a generic ephemeral volume's.
pub(crate) fn pod_claims(pod: &Pod) -> Vec<(String, bool)> {
    let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
    pod.spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .map(|vs| {
            vs.iter()
                .filter_map(|v| match (&v.persistent_volume_claim, &v.ephemeral) {
                    (Some(c), _) => Some((c.claim_name.clone(), false)),
                    (None, Some(_)) => Some((format!("{pod_name}-{}", v.name), true)),
                    (None, None) => None,
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The world one pass schedules against.
pub(crate) struct Snapshot {
    /// Sorted by name: ties in scoring go to the first.
    pub nodes: Vec<Arc<Node>>,
    pub claims: HashMap<(String, String), Arc<PersistentVolumeClaim>>,
    pub volumes: HashMap<String, Arc<PersistentVolume>>,
    pub classes: HashMap<String, Arc<StorageClass>>,
    pub csinodes: HashMap<String, Arc<CSINode>>,
    /// Active pods by node name, assumed ones included.
    pub pods_on_node: BTreeMap<String, Vec<Arc<Pod>>>,
    /// The keys of `pods_on_node`'s pods, per node: a pod is counted once.
    keys_on_node: HashMap<String, HashSet<String>>,
    /// The CSI volumes `pods_on_node`'s pods use, per node and driver, kept as pods are
    /// assumed: the volume-limits filter reads them instead of going over every pod of the
    /// node for every pod it places (with 250 pods per node and 5,000 pending, that was most
    /// of a pass).
    pub volumes_on_node: HashMap<String, BTreeMap<String, BTreeSet<String>>>,
}

impl Snapshot {
    pub(crate) fn new(
        mut nodes: Vec<Arc<Node>>,
        claims: Vec<Arc<PersistentVolumeClaim>>,
        volumes: Vec<Arc<PersistentVolume>>,
        classes: Vec<Arc<StorageClass>>,
        csinodes: Vec<Arc<CSINode>>,
        pods: &[Arc<Pod>],
    ) -> Self {
        nodes.sort_by(|a, b| node::name(a).cmp(node::name(b)));
        let mut snapshot = Self {
            nodes,
            claims: claims
                .into_iter()
                .map(|c| {
                    (
                        (
                            c.metadata.namespace.clone().unwrap_or_default(),
                            c.metadata.name.clone().unwrap_or_default(),
                        ),
                        c,
                    )
                })
                .collect(),
            volumes: volumes
                .into_iter()
                .map(|v| (v.metadata.name.clone().unwrap_or_default(), v))
                .collect(),
            classes: classes
                .into_iter()
                .map(|c| (c.metadata.name.clone().unwrap_or_default(), c))
                .collect(),
            csinodes: csinodes
                .into_iter()
                .map(|c| (c.metadata.name.clone().unwrap_or_default(), c))
                .collect(),
            pods_on_node: BTreeMap::new(),
            keys_on_node: HashMap::new(),
            volumes_on_node: HashMap::new(),
        };
        for pod in pods {
            let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
            if let Some(node) = node.filter(|n| !n.is_empty())
                && is_active(pod)
            {
                snapshot.assume(pod.clone(), &node);
            }
        }
        snapshot
    }

    /// Counts `pod` on `node` for the rest of the pass (and for pods bound but not yet seen
    /// bound by the watch).
    pub(crate) fn assume(&mut self, pod: Arc<Pod>, node: &str) {
        if !self
            .keys_on_node
            .entry(node.to_string())
            .or_default()
            .insert(pod_key(&pod))
        {
            return;
        }
        let volumes = limits::csi_volumes(&pod, self);
        let in_use = self.volumes_on_node.entry(node.to_string()).or_default();
        for (driver, keys) in volumes {
            in_use.entry(driver).or_default().extend(keys);
        }
        self.pods_on_node
            .entry(node.to_string())
            .or_default()
            .push(pod);
    }

    /// Whether `pod` is among the pods counted on `node`.
    pub(crate) fn is_on(&self, pod: &Pod, node: &str) -> bool {
        self.keys_on_node
            .get(node)
            .is_some_and(|k| k.contains(&pod_key(pod)))
    }

    pub(crate) fn pod_count(&self, node: &str) -> usize {
        self.pods_on_node.get(node).map_or(0, Vec::len)
    }

    pub(crate) fn claim(&self, namespace: &str, name: &str) -> Option<&Arc<PersistentVolumeClaim>> {
        self.claims.get(&(namespace.to_string(), name.to_string()))
    }

    /// The class of a claim: `spec.storageClassName`, or the beta annotation that wins over it.
    pub(crate) fn claim_class_name(claim: &PersistentVolumeClaim) -> String {
        claim
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("volume.beta.kubernetes.io/storage-class"))
            .cloned()
            .or_else(|| {
                claim
                    .spec
                    .as_ref()
                    .and_then(|s| s.storage_class_name.clone())
            })
            .unwrap_or_default()
    }
}
