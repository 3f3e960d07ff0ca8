//! What is mounted or attached below a directory, and taking it away: for whoever must leave
//! nothing behind under a directory of its own (csi-cluster's data dir, a benchmark's temp dir,
//! a test's), whatever the code under test did there. Best effort: a mount that cannot be
//! unmounted or a loop device that cannot be detached stays, and the caller sees it in the
//! next [`mounts_below`] / [`loop_devices_below`].

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::findmnt;

/// Mount points at or below `dir` (resolved first), deepest first.
pub fn mounts_below(dir: &Path) -> Vec<PathBuf> {
    let Ok(bytes) = std::fs::read("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let Ok(table) = findmnt::parse(&bytes) else {
        return Vec::new();
    };
    let root = findmnt::canonical(dir);
    let mut points: Vec<PathBuf> = table
        .into_iter()
        .map(|e| e.mount_point)
        .filter(|p| p.starts_with(&root))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    points.dedup();
    points
}

/// Unmounts everything at or below `dir`, deepest first: a plain umount, else a lazy one (a
/// busy mount leaves the tree and goes with its last user); again while stacked mounts remain,
/// a few passes at most. Returns what was mounted at first.
pub fn unmount_below(dir: &Path) -> Vec<PathBuf> {
    let first = mounts_below(dir);
    let mut points = first.clone();
    for _ in 0..5 {
        if points.is_empty() {
            break;
        }
        for p in &points {
            if !quietly("umount", &[p.as_os_str()]) {
                quietly("umount", &[OsStr::new("-l"), p.as_os_str()]);
            }
        }
        points = mounts_below(dir);
    }
    first
}

/// Loop devices whose backing file is at or below `dir` (resolved first): `(device, backing
/// file)`, sorted. A backing file deleted since reads as its old path.
pub fn loop_devices_below(dir: &Path) -> Vec<(PathBuf, PathBuf)> {
    let root = findmnt::canonical(dir);
    let Ok(entries) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("loop") {
            continue;
        }
        let Ok(backing) = std::fs::read_to_string(entry.path().join("loop/backing_file")) else {
            continue;
        };
        // A deleted image reads "<path> (deleted)".
        let backing = PathBuf::from(backing.trim().trim_end_matches(" (deleted)"));
        if backing.starts_with(&root) {
            found.push((PathBuf::from("/dev").join(name), backing));
        }
    }
    found.sort();
    found
}

/// Detaches the loop devices backed by files below `dir`; returns them.
pub fn detach_loop_devices_below(dir: &Path) -> Vec<(PathBuf, PathBuf)> {
    let devices = loop_devices_below(dir);
    for (dev, _) in &devices {
        quietly("losetup", &[OsStr::new("-d"), dev.as_os_str()]);
    }
    devices
}

/// Runs a tool with its output dropped; whether it succeeded.
fn quietly(program: &str, args: &[&OsStr]) -> bool {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn nothing_is_below_a_fresh_dir_and_the_root_is_below_itself() {
        let d = tempfile::tempdir().unwrap();
        assert!(mounts_below(d.path()).is_empty());
        assert!(loop_devices_below(d.path()).is_empty());
        assert!(unmount_below(d.path()).is_empty());
        assert!(mounts_below(Path::new("/")).contains(&PathBuf::from("/")));
    }

    #[test]
    fn stacked_mounts_below_a_dir_are_all_taken_away() {
        if !rustix::process::geteuid().is_root() {
            test_support::skip_or_fail("mounting a tmpfs needs root");
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let inner = d.path().join("a/b");
        std::fs::create_dir_all(&inner).unwrap();
        for target in [d.path().join("a"), d.path().join("a"), inner.clone()] {
            std::fs::create_dir_all(&target).unwrap();
            assert!(quietly(
                "mount",
                &[
                    OsStr::new("-t"),
                    OsStr::new("tmpfs"),
                    OsStr::new("none"),
                    target.as_os_str()
                ]
            ));
        }
        let found = mounts_below(d.path());
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].components().count() >= found[1].components().count());
        let gone = unmount_below(d.path());
        assert_eq!(gone.len(), 2);
        assert!(
            mounts_below(d.path()).is_empty(),
            "{:?}",
            mounts_below(d.path())
        );
    }
}
