//! `vol_data.json`: what the kubelet writes next to a CSI mount so that, after a restart, it
//! knows which driver and volume a directory belongs to. Same keys as the kubelet's.

use std::path::Path;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolData {
    #[serde(rename = "specVolID")]
    pub spec_vol_id: String,
    #[serde(rename = "volumeHandle")]
    pub volume_handle: String,
    #[serde(rename = "driverName")]
    pub driver_name: String,
    #[serde(rename = "nodeName")]
    pub node_name: String,
    #[serde(
        rename = "attachmentID",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub attachment_id: String,
    /// `Persistent` or `Ephemeral`.
    #[serde(rename = "volumeLifecycleMode", default)]
    pub volume_lifecycle_mode: String,
}

impl VolData {
    pub fn is_ephemeral(&self) -> bool {
        self.volume_lifecycle_mode == "Ephemeral"
    }
}

/// Writes atomically (temp file + rename), so a crash never leaves half a file.
pub async fn write(path: &Path, data: &VolData) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(data).map_err(std::io::Error::other)?;
    if let Some(parent) = path.parent() {
        tokio::fs::create_dir_all(parent).await?;
    }
    let tmp = path.with_extension("json.tmp");
    tokio::fs::write(&tmp, bytes).await?;
    tokio::fs::rename(&tmp, path).await
}

pub async fn read(path: &Path) -> std::io::Result<VolData> {
    let bytes = tokio::fs::read(path).await?;
    serde_json::from_slice(&bytes).map_err(std::io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn round_trips_with_the_kubelets_keys() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/vol_data.json");
        let data = VolData {
            spec_vol_id: "pv-1".into(),
            volume_handle: "vol-1".into(),
            driver_name: "ebs.csi.aws.com".into(),
            node_name: "n1".into(),
            attachment_id: "csi-abc".into(),
            volume_lifecycle_mode: "Persistent".into(),
        };
        write(&path, &data).await.unwrap();
        let raw: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(raw["specVolID"], "pv-1");
        assert_eq!(raw["driverName"], "ebs.csi.aws.com");
        assert_eq!(raw["attachmentID"], "csi-abc");
        assert_eq!(read(&path).await.unwrap(), data);
        assert!(!data.is_ephemeral());
    }
}
