//! Which volume should be attached to which node, and which pods want it there. Rebuilt by the
//! populator from the watch caches on every reconcile pass (no incremental bookkeeping that a
//! missed event could leave wrong).

use std::collections::BTreeMap;

use volume_plugins::CsiVolume;

use super::VolumeNode;

/// A pod, for Events and the Multi-Attach message.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// Which plugin attaches the volume.
#[derive(Debug, Clone, PartialEq)]
pub enum Backend {
    /// The CSI plugin: a VolumeAttachment for the external attacher (or a no-op for a driver
    /// with `attachRequired: false` in the through-adc mode of the skip-attach design,
    /// docs/design/skip-attach.md). `migrated`: an in-tree volume translated to CSI (the migration
    /// design, docs/design/migration.md).
    Csi { volume: CsiVolume, migrated: bool },
    /// The in-tree `kubernetes.io/aws-ebs` plugin, straight to EC2. `volume_id` as written in
    /// the spec (`vol-…` or `aws://zone/vol-…`).
    AwsEbs { volume_id: String },
}

/// One volume to attach to a node.
#[derive(Debug, Clone, PartialEq)]
pub struct VolumeToAttach {
    /// `kubernetes.io/csi/<driver>^<handle>` or `kubernetes.io/aws-ebs/<volumeID>`: the name in
    /// `node.status.volumesAttached` and `volumesInUse`.
    pub unique_name: String,
    /// What Events call the volume: the PV name, or the pod's volume name for an inline one.
    pub spec_name: String,
    pub backend: Backend,
    /// ReadWriteMany / ReadOnlyMany: may be attached to several nodes at once.
    pub multi_attach: bool,
    /// Whether the plugin attaches it at all now (false: a CSI driver with `attachRequired:
    /// false` in bypass-adc mode; such a volume stays desired only while it is still attached
    /// from before, so a pod keeps its VolumeAttachment until it goes, as in Kubernetes).
    pub attachable: bool,
}

impl VolumeToAttach {
    /// The `volume_plugin` label of metrics: `kubernetes.io/csi:<driver>` as Kubernetes writes
    /// it for CSI, the in-tree plugin's name otherwise.
    pub fn plugin_label(&self) -> String {
        match &self.backend {
            Backend::Csi { volume, .. } => format!("kubernetes.io/csi:{}", volume.driver),
            Backend::AwsEbs { .. } => volume_plugins::names::AWS_EBS_PLUGIN_NAME.to_string(),
        }
    }

    pub fn migrated(&self) -> bool {
        matches!(self.backend, Backend::Csi { migrated: true, .. })
    }
}

/// A desired (volume, node) with the pods that want it.
#[derive(Debug, Clone)]
pub struct DesiredVolume {
    pub volume: VolumeToAttach,
    pub pods: Vec<PodRef>,
}

/// The desired state: (volume, node) → pods.
#[derive(Debug, Clone, Default)]
pub struct DesiredStateOfWorld {
    pub volumes: BTreeMap<VolumeNode, DesiredVolume>,
}

impl DesiredStateOfWorld {
    /// Adds `pod`'s wish to have `volume` on `node`.
    pub fn add(&mut self, volume: VolumeToAttach, node: &str, pod: PodRef) {
        let entry = self
            .volumes
            .entry((volume.unique_name.clone(), node.to_string()))
            .or_insert_with(|| DesiredVolume {
                volume,
                pods: Vec::new(),
            });
        if !entry.pods.contains(&pod) {
            entry.pods.push(pod);
        }
    }

    pub fn contains(&self, volume: &str, node: &str) -> bool {
        self.volumes
            .contains_key(&(volume.to_string(), node.to_string()))
    }

    pub fn get(&self, volume: &str, node: &str) -> Option<&DesiredVolume> {
        self.volumes.get(&(volume.to_string(), node.to_string()))
    }

    /// Pods that want `volume` on `nodes` (the Multi-Attach message names the pods on the
    /// nodes the volume is attached to).
    pub fn pods_on_nodes(&self, volume: &str, nodes: &[String]) -> Vec<PodRef> {
        nodes
            .iter()
            .filter_map(|n| self.get(volume, n))
            .flat_map(|d| d.pods.iter().cloned())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use volume_plugins::AttachSource;

    fn volume(name: &str, multi: bool) -> VolumeToAttach {
        VolumeToAttach {
            unique_name: format!("kubernetes.io/csi/d^{name}"),
            spec_name: format!("pv-{name}"),
            backend: Backend::Csi {
                volume: CsiVolume {
                    driver: "d".into(),
                    volume_handle: name.into(),
                    source: AttachSource::PersistentVolume(format!("pv-{name}")),
                },
                migrated: false,
            },
            multi_attach: multi,
            attachable: true,
        }
    }

    fn pod(name: &str) -> PodRef {
        PodRef {
            namespace: "default".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
        }
    }

    #[test]
    fn pods_group_by_volume_and_node() {
        let mut dsw = DesiredStateOfWorld::default();
        dsw.add(volume("a", false), "n1", pod("p1"));
        dsw.add(volume("a", false), "n1", pod("p1"));
        dsw.add(volume("a", false), "n1", pod("p2"));
        dsw.add(volume("a", false), "n2", pod("p3"));
        let unique = "kubernetes.io/csi/d^a";
        assert_eq!(dsw.get(unique, "n1").map(|d| d.pods.len()), Some(2));
        assert!(dsw.contains(unique, "n2") && !dsw.contains(unique, "n3"));
        assert_eq!(dsw.pods_on_nodes(unique, &["n2".into()]), vec![pod("p3")]);
        assert!(dsw.pods_on_nodes(unique, &["n3".into()]).is_empty());
        assert_eq!(volume("a", false).plugin_label(), "kubernetes.io/csi:d");
    }
}
