//! mkfs, only ever on a blank device.

use std::path::Path;

use super::blkid::{self, Probe};
use super::cmd;
use super::fstype::FsType;
use crate::{Error, Result};

/// The mkfs command line for `fs`. No force flags: if a signature appeared after all, mkfs
/// itself refuses (mke2fs asks on a closed stdin and gives up, mkfs.xfs refuses without -f),
/// a second guard behind the blkid re-check. No discard: a new EBS volume is already zeroed,
/// and discarding a large one only costs time.
pub(crate) fn mkfs_command(fs: FsType, device: &Path) -> (String, Vec<String>) {
    let dev = device.to_string_lossy().into_owned();
    match fs {
        FsType::Ext2 | FsType::Ext3 | FsType::Ext4 => (
            format!("mkfs.{fs}"),
            // -m 0: a data volume has no use for blocks reserved for root.
            vec![
                "-q".into(),
                "-m".into(),
                "0".into(),
                "-E".into(),
                "nodiscard".into(),
                dev,
            ],
        ),
        FsType::Xfs => ("mkfs.xfs".into(), vec!["-q".into(), "-K".into(), dev]),
    }
}

/// Formats `device` with `fs` after checking once more, right before mkfs, that it is blank:
/// the only thing worse than a failed stage is a formatted-over volume.
pub(crate) async fn format_blank(device: &Path, fs: FsType) -> Result<()> {
    match blkid::probe(device).await? {
        Probe::Blank => {}
        Probe::Filesystem { fs_type } => {
            return Err(Error::UnsupportedContent {
                device: device.to_path_buf(),
                details: format!("a {fs_type} signature appeared right before mkfs"),
            });
        }
        Probe::Other { details } => {
            return Err(Error::UnsupportedContent {
                device: device.to_path_buf(),
                details,
            });
        }
    }
    let (program, args) = mkfs_command(fs, device);
    tracing::info!(device = %device.display(), %fs, "formatting blank device");
    cmd::run_ok(&program, &args).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mkfs_commands_carry_no_force_flag() {
        for fs in [FsType::Ext2, FsType::Ext3, FsType::Ext4, FsType::Xfs] {
            let (program, args) = mkfs_command(fs, Path::new("/dev/xvdba"));
            assert_eq!(program, format!("mkfs.{fs}"));
            assert_eq!(args.last().map(String::as_str), Some("/dev/xvdba"));
            assert!(!args.iter().any(|a| a == "-F" || a == "-f"), "{args:?}");
        }
    }
}
