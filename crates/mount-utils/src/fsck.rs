//! Checking a filesystem before it is mounted.
//!
//! ext2/3/4: `e2fsck -p` (preen: fixes what is safe to fix without asking). Its exit code is a
//! bit mask: 1 = errors corrected, 2 = corrected and "reboot" advised (which concerns a mounted
//! root filesystem; for an unmounted data volume the fixes are already on disk, so mounting is
//! fine), 4 and up = errors left uncorrected, operational error, usage error, cancelled: then the
//! volume is not mounted and the tool's output goes back to the caller.
//!
//! xfs: nothing before mounting. `fsck.xfs` is a no-op by design: the kernel verifies metadata
//! and replays the log at mount time, and a corrupt xfs fails to mount with a clear error.
//! `xfs_repair -n` is not used because it refuses any filesystem with a dirty log, which is the
//! normal state of a volume detached from a node that crashed: it would block exactly the
//! volumes that are healthy and only need the log replay that mounting does.

use std::path::Path;

use crate::cmd;
use crate::fstype::FsType;
use crate::{Error, Result};

/// What a check found, when the filesystem may be mounted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsckOutcome {
    Clean,
    Corrected,
    /// Errors corrected, and e2fsck advises a reboot (harmless for an unmounted data volume).
    CorrectedRebootAdvised,
    /// The filesystem type is checked by the kernel at mount time instead.
    Skipped,
}

/// What an e2fsck exit code means; `None` means "refuse to mount".
pub fn classify_e2fsck(code: i32) -> Option<FsckOutcome> {
    match code {
        0 => Some(FsckOutcome::Clean),
        1 => Some(FsckOutcome::Corrected),
        2 | 3 => Some(FsckOutcome::CorrectedRebootAdvised),
        _ => None,
    }
}

/// Checks the unmounted filesystem `fs` on `device` before it is mounted (see the module docs
/// for why xfs is left to the kernel); [`Error::FsckFailed`] means "do not mount".
pub async fn check(device: &Path, fs: FsType) -> Result<FsckOutcome> {
    if !fs.is_ext() {
        return Ok(FsckOutcome::Skipped);
    }
    let out = cmd::run("e2fsck", ["-p".as_ref(), device.as_os_str()]).await?;
    let code = out.code.unwrap_or(-1);
    match classify_e2fsck(code) {
        Some(outcome) => {
            if outcome != FsckOutcome::Clean {
                tracing::warn!(device = %device.display(), ?outcome, output = %out.combined(), "e2fsck corrected errors");
            }
            Ok(outcome)
        }
        None => Err(Error::FsckFailed {
            device: device.to_path_buf(),
            program: "e2fsck",
            code,
            output: out.combined(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_below_four_allow_mounting() {
        assert_eq!(classify_e2fsck(0), Some(FsckOutcome::Clean));
        assert_eq!(classify_e2fsck(1), Some(FsckOutcome::Corrected));
        assert_eq!(
            classify_e2fsck(2),
            Some(FsckOutcome::CorrectedRebootAdvised)
        );
        assert_eq!(
            classify_e2fsck(3),
            Some(FsckOutcome::CorrectedRebootAdvised)
        );
    }

    #[test]
    fn exit_codes_four_and_up_refuse() {
        for code in [4, 5, 8, 12, 16, 32, 128, -1] {
            assert_eq!(classify_e2fsck(code), None, "code {code}");
        }
    }

    #[tokio::test]
    async fn xfs_is_not_checked_before_mount() {
        let outcome = check(Path::new("/nonexistent"), FsType::Xfs).await.unwrap();
        assert_eq!(outcome, FsckOutcome::Skipped);
    }
}
