//! What the node service is configured with and what its calls take: plain data, no gRPC
//! types (the adapter in `node.rs` builds these from CSI requests).

use std::path::PathBuf;
use std::time::Duration;

/// Where the node service finds devices and how long it waits for them.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// Device nodes and udev links (`/dev`). ec2-sim's device dir in tests.
    pub dev_root: PathBuf,
    /// The kernel's sysfs (`/sys`): NVMe serials, loop backing files, device sizes.
    pub sys_root: PathBuf,
    /// How long stage/publish wait for a just-attached device to appear.
    pub device_wait: Duration,
    /// How often they look while waiting.
    pub device_poll: Duration,
    /// The filesystem for a blank volume when the request names none.
    pub default_fs_type: String,
}

impl Default for NodeConfig {
    fn default() -> Self {
        Self {
            dev_root: PathBuf::from("/dev"),
            sys_root: PathBuf::from("/sys"),
            device_wait: Duration::from_secs(10),
            device_poll: Duration::from_millis(200),
            default_fs_type: "ext4".to_string(),
        }
    }
}

/// How the workload uses the volume (the capability checks decide it).
pub use crate::capability::AccessType;

#[derive(Debug, Clone)]
pub struct StageRequest {
    pub volume_id: String,
    /// `devicePath` from the publish context, if the controller gave one.
    pub device_path: Option<String>,
    pub staging_path: PathBuf,
    pub access: AccessType,
}

#[derive(Debug, Clone)]
pub struct UnstageRequest {
    pub volume_id: String,
    pub staging_path: PathBuf,
}

#[derive(Debug, Clone)]
pub struct PublishRequest {
    pub volume_id: String,
    pub device_path: Option<String>,
    pub staging_path: PathBuf,
    pub target_path: PathBuf,
    pub access: AccessType,
    pub read_only: bool,
}

#[derive(Debug, Clone)]
pub struct UnpublishRequest {
    pub volume_id: String,
    pub target_path: PathBuf,
}

#[derive(Debug, Clone)]
pub struct ExpandRequest {
    pub volume_id: String,
    /// A staging or publish path of the volume.
    pub volume_path: PathBuf,
    /// The size the volume should have; the expansion fails if the device is still smaller.
    pub required_bytes: Option<u64>,
}
