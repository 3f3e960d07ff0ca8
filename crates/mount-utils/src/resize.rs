//! Growing a mounted filesystem to its (already grown) device, online.

use std::path::Path;

use crate::Result;
use crate::cmd;
use crate::fstype::FsType;

/// ext*: `resize2fs DEVICE` (online when mounted); xfs: `xfs_growfs MOUNTPOINT` (xfs grows only
/// while mounted, and is addressed by its mount point).
pub async fn grow(device: &Path, mount_point: &Path, fs: FsType) -> Result<()> {
    tracing::info!(device = %device.display(), %fs, "growing filesystem");
    if fs.is_ext() {
        cmd::run_ok("resize2fs", [device.as_os_str()]).await?;
    } else {
        cmd::run_ok("xfs_growfs", ["-d".as_ref(), mount_point.as_os_str()]).await?;
    }
    Ok(())
}
