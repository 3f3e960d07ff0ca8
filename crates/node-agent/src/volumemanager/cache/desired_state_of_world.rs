//! The desired state of the world: every pod bound to this node that should have its volumes
//! mounted, with each volume resolved ([`VolumeToMount`]) or the reason it is not yet.
//! Recomputed by the populator from the watch caches on every pass.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use super::MountedVolume;
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

    /// Whether the pod keeps `m` mounted although it does not want it now: `m` may be the
    /// publish of a volume the pod cannot resolve at the moment (its claim or PV missing from
    /// the cache, the claim gone, a CSIDriver changed). As the kubelet, a volume of a pod that
    /// is still running is only torn down with the pod, never because it cannot be resolved.
    ///
    /// A publish made by this process knows its pod volume name and is matched by it. One
    /// rebuilt from disk after a restart does not (`outer_name` is empty): the disk names only
    /// the spec (the PV name, or an inline volume's name), and mapping a PV name back to a pod
    /// volume needs the very claim and PV that cannot be resolved. The reconciler names such a
    /// publish as soon as one of the pod's resolved volumes is it, so one still unnamed is
    /// none of the pod's resolved volumes; since a pod's volumes are immutable, it was
    /// published for one of the pod's volumes, so it may well be an unresolved one: it is
    /// kept while the pod has any unresolved volume (conservative: the worst case is a stale
    /// publish kept until the pod goes, never data torn away from a running pod).
    pub fn keeps_unresolved(&self, m: &MountedVolume) -> bool {
        if m.pod_uid != self.uid || self.unresolved.is_empty() {
            return false;
        }
        m.outer_name.is_empty() || self.unresolved.iter().any(|(n, _)| *n == m.outer_name)
    }

    /// Every resolved volume of the pod: wanted, or kept where it is mounted.
    pub fn resolved(&self) -> impl Iterator<Item = &VolumeToMount> {
        self.volumes
            .iter()
            .chain(self.keep_only.iter().map(|(v, _)| v))
    }

    fn has(&self, unique_name: &str) -> bool {
        self.resolved().any(|v| v.unique_name == unique_name)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volumemanager::cache::VolumeHandle;

    fn pod(uid: &str, unresolved: &[&str]) -> PodToMount {
        PodToMount {
            pod: Arc::new(Pod::default()),
            uid: uid.into(),
            volumes: Vec::new(),
            unresolved: unresolved
                .iter()
                .map(|n| (n.to_string(), "PV pv-1 not found".to_string()))
                .collect(),
            keep_only: Vec::new(),
        }
    }

    /// A publish of pod `uid`; `outer` empty as reconstruction leaves it.
    fn mount(uid: &str, outer: &str) -> MountedVolume {
        MountedVolume {
            unique_name: "kubernetes.io/csi/d^h".into(),
            pod_uid: uid.into(),
            outer_name: outer.into(),
            spec_name: "pv-1".into(),
            handle: VolumeHandle::Csi {
                driver: "d".into(),
                handle: "h".into(),
                block: false,
                ephemeral: false,
            },
            host_path: "/x".into(),
            uncertain: false,
            reported_in_use: true,
        }
    }

    #[test]
    fn a_reconstructed_publish_of_a_pod_with_an_unresolved_volume_is_kept() {
        // The restart case: the disk does not say which pod volume this is.
        assert!(pod("p1", &["data"]).keeps_unresolved(&mount("p1", "")));
    }

    #[test]
    fn a_named_publish_is_kept_only_for_its_own_unresolved_volume() {
        let p = pod("p1", &["data"]);
        assert!(p.keeps_unresolved(&mount("p1", "data")));
        assert!(!p.keeps_unresolved(&mount("p1", "other")));
    }

    #[test]
    fn nothing_is_kept_for_a_pod_without_unresolved_volumes_or_for_another_pod() {
        assert!(!pod("p1", &[]).keeps_unresolved(&mount("p1", "")));
        assert!(!pod("p1", &[]).keeps_unresolved(&mount("p1", "data")));
        assert!(!pod("p1", &["data"]).keeps_unresolved(&mount("p2", "")));
    }
}
