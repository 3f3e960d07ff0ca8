//! The desired state of the world: every pod bound to this node that should have its volumes
//! mounted, with each volume resolved ([`VolumeToMount`]) or the reason it is not yet.
//! Recomputed by the populator from the watch caches on every pass.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use crate::volumemanager::volume_spec::VolumeToMount;

/// One pod and its storage volumes.
#[derive(Debug, Clone)]
pub struct PodToMount {
    pub pod: Arc<Pod>,
    pub uid: String,
    pub volumes: Vec<VolumeToMount>,
    /// Pod volumes that cannot be resolved yet or at all: (pod volume name, reason).
    pub unresolved: Vec<(String, String)>,
    /// Volumes that stay where they are mounted but are not mounted anew (their claim is
    /// being deleted), with the reason a new mount is refused.
    pub keep_only: Vec<(VolumeToMount, String)>,
}

impl PodToMount {
    pub fn namespace(&self) -> &str {
        self.pod.metadata.namespace.as_deref().unwrap_or("default")
    }

    pub fn name(&self) -> &str {
        self.pod.metadata.name.as_deref().unwrap_or_default()
    }

    fn has(&self, unique_name: &str) -> bool {
        self.volumes
            .iter()
            .chain(self.keep_only.iter().map(|(v, _)| v))
            .any(|v| v.unique_name == unique_name)
    }
}

/// Pods by UID.
#[derive(Debug, Default, Clone)]
pub struct DesiredStateOfWorld {
    pods: BTreeMap<String, PodToMount>,
}

impl DesiredStateOfWorld {
    pub fn add_pod(&mut self, pod: PodToMount) {
        self.pods.insert(pod.uid.clone(), pod);
    }

    pub fn pods(&self) -> impl Iterator<Item = &PodToMount> {
        self.pods.values()
    }

    pub fn pod(&self, uid: &str) -> Option<&PodToMount> {
        self.pods.get(uid)
    }

    /// Whether pod `uid` should have (or keep) volume `unique_name` mounted.
    pub fn wants(&self, unique_name: &str, uid: &str) -> bool {
        self.pods.get(uid).is_some_and(|p| p.has(unique_name))
    }

    /// Whether any pod wants (or keeps) volume `unique_name`.
    pub fn wants_volume(&self, unique_name: &str) -> bool {
        self.pods.values().any(|p| p.has(unique_name))
    }

    /// Every (pod, volume) pair.
    pub fn volumes(&self) -> impl Iterator<Item = (&PodToMount, &VolumeToMount)> {
        self.pods
            .values()
            .flat_map(|p| p.volumes.iter().map(move |v| (p, v)))
    }
}
