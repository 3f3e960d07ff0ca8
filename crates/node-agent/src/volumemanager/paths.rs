//! Where the kubelet puts things under its root dir. The node agent uses the same paths, so a
//! driver (or an operator) that knows the kubelet's layout finds everything where it expects
//! it, and a kubelet-written tree is reconstructed as well.
//!
//! | what | path |
//! |---|---|
//! | CSI staging (NodeStage's staging_target_path) | `plugins/kubernetes.io/csi/<driver>/<sha256(handle)>/globalmount` |
//! | its `vol_data.json` | `plugins/kubernetes.io/csi/<driver>/<sha256(handle)>/vol_data.json` |
//! | CSI publish (NodePublish's target_path) | `pods/<uid>/volumes/kubernetes.io~csi/<spec>/mount` |
//! | its `vol_data.json` | `pods/<uid>/volumes/kubernetes.io~csi/<spec>/vol_data.json` |
//! | CSI block staging | `plugins/kubernetes.io/csi/volumeDevices/staging/<spec>` |
//! | CSI block publish (a file the device is bound onto) | `plugins/kubernetes.io/csi/volumeDevices/publish/<spec>/<uid>` |
//! | its `vol_data.json` | `plugins/kubernetes.io/csi/volumeDevices/<spec>/data/vol_data.json` |
//! | the pod's block device link | `pods/<uid>/volumeDevices/kubernetes.io~csi/<spec>` |
//! | in-tree aws-ebs staging | `plugins/kubernetes.io/aws-ebs/mounts/<volumeID>` |
//! | in-tree aws-ebs pod mount | `pods/<uid>/volumes/kubernetes.io~aws-ebs/<spec>` |
//!
//! `<spec>` is the PV name, or the pod's volume name for an inline volume.

use std::path::{Path, PathBuf};

use volume_plugins::names::csi_staging_path;

/// The CSI plugin's directory name in pod paths (`kubernetes.io/csi` escaped as the kubelet
/// escapes qualified names).
pub const CSI_POD_DIR: &str = "kubernetes.io~csi";
/// The in-tree aws-ebs plugin's directory name in pod paths.
pub const AWS_EBS_POD_DIR: &str = "kubernetes.io~aws-ebs";
/// The metadata file the kubelet writes next to CSI mounts.
pub const VOL_DATA_FILE: &str = "vol_data.json";

/// The paths of one root dir.
#[derive(Debug, Clone)]
pub struct Paths {
    root: PathBuf,
}

impl Paths {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn pods_dir(&self) -> PathBuf {
        self.root.join("pods")
    }

    pub fn pod_dir(&self, pod_uid: &str) -> PathBuf {
        self.pods_dir().join(pod_uid)
    }

    /// `pods/<uid>/volumes/<plugin dir>`.
    pub fn pod_plugin_dir(&self, pod_uid: &str, plugin_dir: &str) -> PathBuf {
        self.pod_dir(pod_uid).join("volumes").join(plugin_dir)
    }

    /// `pods/<uid>/volumes/kubernetes.io~csi/<spec>`: holds `mount` and `vol_data.json`.
    pub fn csi_pod_volume_dir(&self, pod_uid: &str, spec: &str) -> PathBuf {
        self.pod_plugin_dir(pod_uid, CSI_POD_DIR).join(spec)
    }

    /// NodePublish's target_path of a filesystem volume.
    pub fn csi_publish_path(&self, pod_uid: &str, spec: &str) -> PathBuf {
        self.csi_pod_volume_dir(pod_uid, spec).join("mount")
    }

    /// NodeStage's staging_target_path of a filesystem volume.
    pub fn csi_staging_path(&self, driver: &str, handle: &str) -> PathBuf {
        PathBuf::from(csi_staging_path(
            &self.root.to_string_lossy(),
            driver,
            handle,
        ))
    }

    /// The staging dir's `vol_data.json` (next to `globalmount`).
    pub fn csi_staging_vol_data(&self, driver: &str, handle: &str) -> PathBuf {
        let staging = self.csi_staging_path(driver, handle);
        staging
            .parent()
            .map_or_else(|| staging.clone(), Path::to_path_buf)
            .join(VOL_DATA_FILE)
    }

    /// `plugins/kubernetes.io/csi`.
    pub fn csi_plugin_dir(&self) -> PathBuf {
        self.root.join("plugins").join("kubernetes.io").join("csi")
    }

    fn block_dir(&self) -> PathBuf {
        self.csi_plugin_dir().join("volumeDevices")
    }

    /// NodeStage's staging_target_path of a raw block volume.
    pub fn csi_block_staging_path(&self, spec: &str) -> PathBuf {
        self.block_dir().join("staging").join(spec)
    }

    /// NodePublish's target_path of a raw block volume (a file).
    pub fn csi_block_publish_path(&self, spec: &str, pod_uid: &str) -> PathBuf {
        self.block_dir().join("publish").join(spec).join(pod_uid)
    }

    /// The block volume's `vol_data.json`.
    pub fn csi_block_vol_data(&self, spec: &str) -> PathBuf {
        self.block_dir().join(spec).join("data").join(VOL_DATA_FILE)
    }

    /// The pod's link to its raw block device.
    pub fn pod_block_link(&self, pod_uid: &str, spec: &str) -> PathBuf {
        self.pod_dir(pod_uid)
            .join("volumeDevices")
            .join(CSI_POD_DIR)
            .join(spec)
    }

    /// The in-tree aws-ebs plugin's pod mount.
    pub fn aws_ebs_pod_path(&self, pod_uid: &str, spec: &str) -> PathBuf {
        self.pod_plugin_dir(pod_uid, AWS_EBS_POD_DIR).join(spec)
    }

    /// The in-tree aws-ebs plugin's staging path.
    pub fn aws_ebs_staging_path(&self, volume_id: &str) -> PathBuf {
        volume_plugins::aws_ebs::aws_ebs_staging_path(&self.root, volume_id)
    }

    /// `plugins/kubernetes.io/aws-ebs/mounts`.
    pub fn aws_ebs_mounts_dir(&self) -> PathBuf {
        self.root
            .join("plugins")
            .join("kubernetes.io")
            .join("aws-ebs")
            .join("mounts")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_the_kubelets() {
        let p = Paths::new("/var/lib/kubelet");
        assert_eq!(
            p.csi_publish_path("uid-1", "pv-1"),
            PathBuf::from("/var/lib/kubelet/pods/uid-1/volumes/kubernetes.io~csi/pv-1/mount")
        );
        let staging = p.csi_staging_path("ebs.csi.aws.com", "vol-1");
        assert!(staging.ends_with("globalmount"), "{staging:?}");
        assert!(
            staging.starts_with("/var/lib/kubelet/plugins/kubernetes.io/csi/ebs.csi.aws.com/"),
            "{staging:?}"
        );
        assert_eq!(
            p.csi_staging_vol_data("ebs.csi.aws.com", "vol-1"),
            staging.parent().unwrap().join("vol_data.json")
        );
        assert_eq!(
            p.csi_block_publish_path("pv-1", "uid-1"),
            PathBuf::from(
                "/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/publish/pv-1/uid-1"
            )
        );
        assert_eq!(
            p.aws_ebs_pod_path("uid-1", "pv-1"),
            PathBuf::from("/var/lib/kubelet/pods/uid-1/volumes/kubernetes.io~aws-ebs/pv-1")
        );
        assert_eq!(
            p.aws_ebs_staging_path("aws://us-east-1a/vol-1"),
            PathBuf::from(
                "/var/lib/kubelet/plugins/kubernetes.io/aws-ebs/mounts/aws/us-east-1a/vol-1"
            )
        );
    }
}
