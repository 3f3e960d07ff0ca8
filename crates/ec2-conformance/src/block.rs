//! Real block-device helpers for the loop-backed tests: running mkfs/mount/losetup, and a
//! mount guard that unmounts on drop (also when the test panics).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::Error;

/// Why loop-backed tests cannot run here, or `None` when they can (root, `/dev/loop-control`,
/// and the tools on PATH).
pub fn loop_unavailable_reason() -> Option<String> {
    // Effective uid without libc: /proc/self/status "Uid: real effective ...".
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let euid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|rest| rest.split_whitespace().nth(1))
        .map(str::to_string);
    if euid.as_deref() != Some("0") {
        return Some("not running as root (loop devices and mount need root)".into());
    }
    if !Path::new("/dev/loop-control").exists() {
        return Some("/dev/loop-control is missing (no loop driver)".into());
    }
    for tool in ["losetup", "mkfs.ext4", "mount", "umount"] {
        if which(tool).is_none() {
            return Some(format!("{tool} is not on PATH"));
        }
    }
    None
}

fn which(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain(["/sbin", "/usr/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(tool))
        .find(|p| p.is_file())
}

/// Runs a command, returning its stdout; a non-zero exit is an error carrying stderr.
pub fn run(program: &str, args: &[&str]) -> Result<String, Error> {
    let command = format!("{program} {}", args.join(" "));
    let exe = which(program).unwrap_or_else(|| PathBuf::from(program));
    let output = Command::new(exe)
        .args(args)
        .output()
        .map_err(|source| Error::Io {
            what: format!("running `{command}`"),
            source,
        })?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(Error::Command {
            command,
            detail: format!(
                "{}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ),
        })
    }
}

/// The loop devices backed by `image` (`losetup -j`), e.g. `["/dev/loop3"]`.
pub fn loops_backing(image: &Path) -> Result<Vec<String>, Error> {
    let text = run("losetup", &["-j", &image.to_string_lossy()])?;
    Ok(text
        .lines()
        .filter_map(|line| line.split(':').next())
        .filter(|dev| !dev.is_empty())
        .map(str::to_string)
        .collect())
}

/// True when `target` is a mount point right now (per /proc/self/mountinfo).
pub fn is_mounted(target: &Path) -> bool {
    let Ok(canonical) = target.canonicalize() else {
        return false;
    };
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let wanted = canonical.to_string_lossy();
    mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .any(|mount_point| mount_point == wanted)
}

/// A mount that is unmounted when the guard drops.
#[derive(Debug)]
pub struct MountGuard {
    target: PathBuf,
    mounted: bool,
}

impl MountGuard {
    /// Mounts `device` (ext4) on `target`.
    pub fn mount(device: &Path, target: &Path) -> Result<Self, Error> {
        Self::mount_fs(&device.to_string_lossy(), target, "ext4")
    }

    /// Mounts `source` with file system type `fstype` on `target`.
    pub fn mount_fs(source: &str, target: &Path, fstype: &str) -> Result<Self, Error> {
        run("mount", &["-t", fstype, source, &target.to_string_lossy()])?;
        Ok(Self {
            target: target.to_path_buf(),
            mounted: true,
        })
    }

    pub fn target(&self) -> &Path {
        &self.target
    }

    /// Unmounts now and reports failure (drop would only log it).
    pub fn unmount(mut self) -> Result<(), Error> {
        self.mounted = false;
        run("umount", &[&self.target.to_string_lossy()]).map(|_| ())
    }
}

impl Drop for MountGuard {
    fn drop(&mut self) {
        if self.mounted && run("umount", &[&self.target.to_string_lossy()]).is_err() {
            // Busy (a panicking test may still hold a file): detach it lazily so nothing stays
            // mounted after the test.
            if let Err(err) = run("umount", &["-l", &self.target.to_string_lossy()]) {
                eprintln!(
                    "ec2-conformance: could not unmount {}: {err}",
                    self.target.display()
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_reports_the_command_and_its_stderr() {
        let err = run("ls", &["/no/such/dir"]).unwrap_err().to_string();
        assert!(err.contains("ls /no/such/dir"), "{err}");
        assert!(err.contains("No such file"), "{err}");
        assert_eq!(run("echo", &["hi"]).unwrap(), "hi\n");
    }

    #[test]
    fn root_is_mounted_a_fresh_dir_is_not() {
        assert!(is_mounted(Path::new("/")));
        let tmp = tempfile::tempdir().unwrap();
        assert!(!is_mounted(tmp.path()));
    }

    #[test]
    fn mount_guard_unmounts_on_drop_even_while_busy() {
        if let Some(reason) = loop_unavailable_reason() {
            test_support::skip_or_fail(&reason);
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        {
            let guard = MountGuard::mount_fs("tmpfs", tmp.path(), "tmpfs").unwrap();
            assert!(is_mounted(guard.target()));
            std::fs::write(tmp.path().join("f"), "x").unwrap();
        }
        assert!(!is_mounted(tmp.path()));
        let guard = MountGuard::mount_fs("tmpfs", tmp.path(), "tmpfs").unwrap();
        // An open file keeps the mount busy: drop falls back to a lazy unmount.
        let busy = std::fs::File::create(tmp.path().join("open")).unwrap();
        drop(guard);
        assert!(!is_mounted(tmp.path()));
        drop(busy);
    }

    #[test]
    fn no_loop_devices_back_a_fresh_file() {
        if loop_unavailable_reason().is_some() {
            return;
        }
        let tmp = tempfile::NamedTempFile::new().unwrap();
        assert!(loops_backing(tmp.path()).unwrap().is_empty());
    }
}
