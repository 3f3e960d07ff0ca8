//! Putting a block device's filesystem at a staging path: format it if (and only if) it is
//! blank, check it if it was formatted before, mount it. The EBS driver's NodeStageVolume and
//! the in-tree aws-ebs plugin's MountDevice both do exactly this once they have found their
//! device and know nothing is mounted at the staging path yet; what differs between them
//! (default filesystem, read-only, their own error types) is in [`Stage`]'s fields and in how
//! they map the refusals below.
//!
//! Refusals a caller may want to word its own way: [`Error::UnsupportedFilesystem`],
//! [`Error::FsTypeMismatch`] and [`Error::ReadOnlyBlank`]. Everything else (mkfs, fsck, mount
//! failures, [`Error::UnsupportedContent`]) is the underlying tool's error as it is.

use std::path::Path;

use crate::blkid::{self, Probe};
use crate::findmnt::MountEntry;
use crate::fstype::FsType;
use crate::{Error, Result, format, fsck, mount};

/// One device to stage at one path.
#[derive(Debug, Clone, Copy)]
pub struct Stage<'a> {
    /// The block device, its real path (symlinks resolved).
    pub device: &'a Path,
    /// Its (major, minor): how the mount table names it whatever link it was mounted through.
    pub dev: (u32, u32),
    /// Where to mount it; must exist, and nothing may be mounted there yet.
    pub target: &'a Path,
    /// The filesystem the request asks for, if any: what a blank device gets, and what a
    /// formatted one must already hold.
    pub requested: Option<FsType>,
    /// What a blank device gets when the request names no filesystem.
    pub default_fs: FsType,
    /// Mount read-only: then a blank device is refused rather than formatted, and nothing is
    /// checked (e2fsck -p writes its fixes).
    pub read_only: bool,
    /// The caller's mount options; `ro` and `nouuid` are added where needed.
    pub options: &'a [String],
    /// The mount table as read before this call, to see whether the device is mounted
    /// elsewhere.
    pub table: &'a [MountEntry],
}

/// Formats (if blank), checks (if formatted before) and mounts `stage.device` at
/// `stage.target`; returns the filesystem it holds now.
pub async fn format_and_mount(stage: &Stage<'_>) -> Result<FsType> {
    let fs = prepare(stage).await?;
    let options = mount_options(stage.options, fs, stage.read_only);
    mount::mount(stage.device, stage.target, fs, &options).await?;
    Ok(fs)
}

/// Everything before the mount: blkid, then mkfs on a blank device or fsck on a formatted one.
async fn prepare(stage: &Stage<'_>) -> Result<FsType> {
    let device = stage.device;
    match blkid::probe(device).await? {
        Probe::Blank => {
            if stage.read_only {
                return Err(Error::ReadOnlyBlank {
                    device: device.to_path_buf(),
                });
            }
            let fs = stage.requested.unwrap_or(stage.default_fs);
            format::format_blank(device, fs).await?;
            tracing::info!(device = %device.display(), %fs, "formatted blank device");
            Ok(fs)
        }
        Probe::Filesystem { fs_type } => {
            let found: FsType = fs_type.parse().map_err(|_| Error::UnsupportedFilesystem {
                device: device.to_path_buf(),
                found: fs_type.clone(),
            })?;
            if let Some(requested) = stage.requested.filter(|r| *r != found) {
                // Never reformatted: the data on it may be all someone has.
                return Err(Error::FsTypeMismatch {
                    device: device.to_path_buf(),
                    found,
                    requested,
                });
            }
            if stage.read_only {
                tracing::debug!(device = %device.display(), "read-only: no fsck");
            } else if stage.table.iter().any(|m| m.dev() == stage.dev) {
                // Mounted elsewhere already (another staging path): checking a mounted
                // filesystem is unsafe, and a second mount shares the same superblock.
                tracing::warn!(device = %device.display(), "device already mounted elsewhere; skipping fsck");
            } else {
                fsck::check(device, found).await?;
            }
            Ok(found)
        }
        Probe::Other { details } => Err(Error::UnsupportedContent {
            device: device.to_path_buf(),
            details,
        }),
    }
}

/// The caller's options, plus `ro` when read-only and `nouuid` for xfs (each only if not
/// already there).
fn mount_options(base: &[String], fs: FsType, read_only: bool) -> Vec<String> {
    let mut options = base.to_vec();
    if read_only && !options.iter().any(|o| o == "ro") {
        options.push("ro".to_string());
    }
    if fs == FsType::Xfs && !options.iter().any(|o| o == "nouuid") {
        // A volume restored from a snapshot of another volume on this node has the same xfs
        // UUID, which xfs refuses to mount twice without this.
        options.push("nouuid".to_string());
    }
    options
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn read_only_adds_ro_and_xfs_adds_nouuid_once() {
        assert_eq!(mount_options(&[], FsType::Ext4, false), opts(&[]));
        assert_eq!(
            mount_options(&opts(&["noatime"]), FsType::Ext4, true),
            opts(&["noatime", "ro"])
        );
        assert_eq!(
            mount_options(&[], FsType::Xfs, true),
            opts(&["ro", "nouuid"])
        );
        assert_eq!(
            mount_options(&opts(&["nouuid", "ro"]), FsType::Xfs, true),
            opts(&["nouuid", "ro"])
        );
    }
}
