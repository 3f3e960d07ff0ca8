//! mkfs, only ever on a blank device.

use std::path::Path;

use tokio::io::AsyncReadExt;

use crate::blkid::{self, Probe};
use crate::cmd;
use crate::fstype::FsType;
use crate::{Error, Result};

/// The mkfs command line for `fs`. No force flags: if a signature appeared after all, mkfs
/// itself refuses (mke2fs asks on a closed stdin and gives up, mkfs.xfs refuses without -f),
/// a second guard behind the blkid re-check. No discard: a new EBS volume is already zeroed,
/// and discarding a large one only costs time.
pub fn mkfs_command(fs: FsType, device: &Path) -> (String, Vec<String>) {
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

/// How much of the device must read as zeros before it counts as blank. It covers the
/// superblocks, labels and partition tables of everything in common use (xfs at 0, ext* at
/// 1 KiB, GPT at 512, LVM and LUKS headers, btrfs at 64 KiB).
pub const BLANK_CHECK_BYTES: usize = 1024 * 1024;

/// Formats `device` with `fs` after checking once more, right before mkfs, that it is blank:
/// the only thing worse than a failed stage is a formatted-over volume.
///
/// "Blank" takes two witnesses: blkid recognises no signature, and the start of the device is
/// all zeros (a new EBS volume reads as zeros). blkid alone is not enough: it does not recognise
/// a filesystem whose superblock is damaged (an xfs with a bad field is "nothing" to it), and
/// formatting that would destroy data that xfs_repair or e2fsck could still have saved.
pub async fn format_blank(device: &Path, fs: FsType) -> Result<()> {
    match blkid::probe(device).await? {
        Probe::Blank => {
            if let Some(offset) = first_nonzero(device, BLANK_CHECK_BYTES).await? {
                return Err(Error::UnsupportedContent {
                    device: device.to_path_buf(),
                    details: format!(
                        "blkid recognises no filesystem, but byte {offset} is not zero: possibly a damaged filesystem"
                    ),
                });
            }
        }
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

/// The offset of the first non-zero byte within the first `limit` bytes of `path` (or of the
/// whole device, if it is smaller), or `None` if they are all zero.
pub async fn first_nonzero(path: &Path, limit: usize) -> Result<Option<u64>> {
    let mut file = tokio::fs::File::open(path)
        .await
        .map_err(|e| Error::io("open", path, e))?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut offset = 0usize;
    while offset < limit {
        let want = buf.len().min(limit - offset);
        let n = file
            .read(&mut buf[..want])
            .await
            .map_err(|e| Error::io("read", path, e))?;
        if n == 0 {
            break;
        }
        if let Some(i) = buf[..n].iter().position(|b| *b != 0) {
            return Ok(Some((offset + i) as u64));
        }
        offset += n;
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn first_nonzero_finds_data_within_the_limit_only() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("img");
        let mut data = vec![0u8; 300 * 1024];
        std::fs::write(&f, &data).unwrap();
        assert_eq!(
            first_nonzero(&f, BLANK_CHECK_BYTES).await.unwrap(),
            None,
            "short file, all zero"
        );
        data[200 * 1024 + 7] = 1;
        std::fs::write(&f, &data).unwrap();
        assert_eq!(
            first_nonzero(&f, BLANK_CHECK_BYTES).await.unwrap(),
            Some(200 * 1024 + 7)
        );
        assert_eq!(
            first_nonzero(&f, 128 * 1024).await.unwrap(),
            None,
            "beyond the limit"
        );
    }

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
