//! The actual state of the world: which volumes are staged on this node (the kubelet's
//! "device mounted") and which are published into which pod. Only the reconciler writes it,
//! from the results of finished operations and from reconstruction.

use std::collections::BTreeMap;
use std::path::PathBuf;

/// Which volume, as its backend names it (what unstage and unpublish need).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumeHandle {
    Csi {
        driver: String,
        handle: String,
        block: bool,
        ephemeral: bool,
    },
    AwsEbs {
        volume_id: String,
    },
}

/// A volume staged (or attached and waiting to be used) on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagedVolume {
    pub unique_name: String,
    pub spec_name: String,
    pub handle: VolumeHandle,
    /// The staging path, when the volume was staged (None: the driver has no
    /// STAGE_UNSTAGE_VOLUME; nothing to unstage).
    pub staging_path: Option<PathBuf>,
    /// Whether the volume is reported in `node.status.volumesInUse` (the attach/detach
    /// controller manages it).
    pub reported_in_use: bool,
    /// Learned from disk after a restart without proof that NodeStage finished (its
    /// `vol_data.json` is written first; the staging path is not a mount point, or is a raw
    /// block volume's, which never is): the next mount stages it again (idempotent).
    pub uncertain: bool,
}

/// A volume published into one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountedVolume {
    pub unique_name: String,
    pub pod_uid: String,
    /// The pod's volume name. Empty when reconstructed (the disk names only the spec, and
    /// the pod may be gone) until a pod resolves one of its volumes to this publish
    /// ([`ActualStateOfWorld::name_mount`]).
    pub outer_name: String,
    pub spec_name: String,
    pub handle: VolumeHandle,
    /// Where the pod sees the volume: the publish path (or the block device link).
    pub host_path: PathBuf,
    /// Learned from disk after a restart, not from an operation of this process: the
    /// publish is repeated (idempotent) if the pod still wants it.
    pub uncertain: bool,
    pub reported_in_use: bool,
}

#[derive(Debug, Default)]
pub struct ActualStateOfWorld {
    staged: BTreeMap<String, StagedVolume>,
    mounted: BTreeMap<(String, String), MountedVolume>,
}

impl ActualStateOfWorld {
    pub fn add_staged(&mut self, v: StagedVolume) {
        self.staged.insert(v.unique_name.clone(), v);
    }

    pub fn remove_staged(&mut self, unique_name: &str) -> Option<StagedVolume> {
        self.staged.remove(unique_name)
    }

    pub fn staged(&self, unique_name: &str) -> Option<&StagedVolume> {
        self.staged.get(unique_name)
    }

    pub fn all_staged(&self) -> impl Iterator<Item = &StagedVolume> {
        self.staged.values()
    }

    pub fn add_mounted(&mut self, v: MountedVolume) {
        self.mounted
            .insert((v.unique_name.clone(), v.pod_uid.clone()), v);
    }

    pub fn remove_mounted(&mut self, unique_name: &str, pod_uid: &str) -> Option<MountedVolume> {
        self.mounted
            .remove(&(unique_name.to_string(), pod_uid.to_string()))
    }

    /// Gives a reconstructed publish (no pod volume name yet) the name of the pod volume
    /// that resolved to it; a named one keeps its name.
    pub fn name_mount(&mut self, unique_name: &str, pod_uid: &str, outer_name: &str) {
        if let Some(m) = self
            .mounted
            .get_mut(&(unique_name.to_string(), pod_uid.to_string()))
            && m.outer_name.is_empty()
        {
            m.outer_name = outer_name.to_string();
        }
    }

    pub fn mounted(&self, unique_name: &str, pod_uid: &str) -> Option<&MountedVolume> {
        self.mounted
            .get(&(unique_name.to_string(), pod_uid.to_string()))
    }

    pub fn all_mounted(&self) -> impl Iterator<Item = &MountedVolume> {
        self.mounted.values()
    }

    /// Whether any pod still has the volume published.
    pub fn is_published_anywhere(&self, unique_name: &str) -> bool {
        self.mounted.keys().any(|(u, _)| u == unique_name)
    }

    /// Whether pod `uid` still has any volume published.
    pub fn pod_has_volumes(&self, uid: &str) -> bool {
        self.mounted.keys().any(|(_, p)| p == uid)
    }

    pub fn mounted_count(&self) -> usize {
        self.mounted.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handle() -> VolumeHandle {
        VolumeHandle::Csi {
            driver: "d".into(),
            handle: "h".into(),
            block: false,
            ephemeral: false,
        }
    }

    #[test]
    fn published_anywhere_follows_the_entries() {
        let mut asw = ActualStateOfWorld::default();
        asw.add_staged(StagedVolume {
            unique_name: "v1".into(),
            spec_name: "pv1".into(),
            handle: handle(),
            staging_path: None,
            reported_in_use: true,
            uncertain: false,
        });
        asw.add_mounted(MountedVolume {
            unique_name: "v1".into(),
            pod_uid: "p1".into(),
            outer_name: "data".into(),
            spec_name: "pv1".into(),
            handle: handle(),
            host_path: "/x".into(),
            uncertain: false,
            reported_in_use: true,
        });
        assert!(asw.is_published_anywhere("v1") && asw.pod_has_volumes("p1"));
        assert!(!asw.is_published_anywhere("v2") && !asw.pod_has_volumes("p2"));
        asw.remove_mounted("v1", "p1");
        assert!(!asw.is_published_anywhere("v1"));
        assert_eq!(asw.all_staged().count(), 1);
        asw.remove_staged("v1");
        assert_eq!(asw.all_staged().count(), 0);
    }

    #[test]
    fn a_reconstructed_publish_is_named_once() {
        let mut asw = ActualStateOfWorld::default();
        asw.add_mounted(MountedVolume {
            unique_name: "v1".into(),
            pod_uid: "p1".into(),
            outer_name: String::new(),
            spec_name: "pv1".into(),
            handle: handle(),
            host_path: "/x".into(),
            uncertain: false,
            reported_in_use: true,
        });
        asw.name_mount("v1", "p2", "data");
        assert_eq!(asw.mounted("v1", "p1").unwrap().outer_name, "");
        asw.name_mount("v1", "p1", "data");
        assert_eq!(asw.mounted("v1", "p1").unwrap().outer_name, "data");
        asw.name_mount("v1", "p1", "other");
        assert_eq!(asw.mounted("v1", "p1").unwrap().outer_name, "data");
    }
}
