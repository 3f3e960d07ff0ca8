//! What a stopped cluster must not leave behind: mounts below the data dir, loop devices backed
//! by its files, unix sockets. The node agents leave volumes mounted when they stop (as the
//! kubelet does, so that a restart reconstructs them); csi-cluster's `up` ends with none, and
//! the next `up` stages and publishes them again from the state the API server kept.

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

pub(crate) use mount_utils::below::{
    detach_loop_devices_below, loop_devices_below, mounts_below, unmount_below,
};

/// Unix sockets below `dir` (symlinks are not followed: ec2-sim's device links point into /dev).
pub(crate) fn sockets_below(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() {
                stack.push(entry.path());
            } else if kind.is_socket() {
                found.push(entry.path());
            }
        }
    }
    found.sort();
    found
}

/// Removes the sockets below `dir` (a component that was aborted did not remove its own).
pub(crate) fn remove_sockets_below(dir: &Path) -> Vec<PathBuf> {
    let sockets = sockets_below(dir);
    for s in &sockets {
        let _ = std::fs::remove_file(s);
    }
    sockets
}

/// What is left below a data dir, for a report (and the test's check).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Leftovers {
    pub(crate) mounts: Vec<PathBuf>,
    pub(crate) loop_devices: Vec<(PathBuf, PathBuf)>,
    pub(crate) sockets: Vec<PathBuf>,
}

impl Leftovers {
    pub(crate) fn of(dir: &Path) -> Self {
        Self {
            mounts: mounts_below(dir),
            loop_devices: loop_devices_below(dir),
            sockets: sockets_below(dir),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.mounts.is_empty() && self.loop_devices.is_empty() && self.sockets.is_empty()
    }
}

impl std::fmt::Display for Leftovers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} mounts, {} loop devices, {} sockets",
            self.mounts.len(),
            self.loop_devices.len(),
            self.sockets.len()
        )
    }
}

/// Everything at once, synchronously: for `Drop` (an `up` that failed or panicked half-way).
pub(crate) fn clean_below(dir: &Path) {
    unmount_below(dir);
    detach_loop_devices_below(dir);
    remove_sockets_below(dir);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn sockets_are_found_and_removed_without_following_links() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("a/b");
        std::fs::create_dir_all(&sub).unwrap();
        let sock = sub.join("csi.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        std::fs::write(dir.path().join("a/file"), b"x").unwrap();
        std::os::unix::fs::symlink("/dev", dir.path().join("dev-link")).unwrap();
        assert_eq!(sockets_below(dir.path()), vec![sock.clone()]);
        assert_eq!(remove_sockets_below(dir.path()), vec![sock]);
        assert!(sockets_below(dir.path()).is_empty());
        assert!(Leftovers::of(dir.path()).sockets.is_empty());
    }
}
