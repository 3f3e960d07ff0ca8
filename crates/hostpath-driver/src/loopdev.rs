//! Loop devices for block volumes. The kernel is the record: a device whose
//! `/sys/block/loopN/loop/backing_file` names a volume's image is that volume's device, so a
//! restarted driver adopts it instead of attaching a second one.
//!
//! An image has at most one writable device and at most one read-only one (`losetup
//! --read-only`, sysfs `ro` = 1). Read-only publications get the read-only device: a read-only
//! bind mount of a device node does not stop writes to the device, a read-only loop device
//! does.

use std::path::{Path, PathBuf};
use std::time::Duration;

use mount_utils::cmd;

use crate::{Error, Result};

/// One loop device of an image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LoopDev {
    /// `/dev/loopN`.
    pub path: PathBuf,
    pub read_only: bool,
    /// (major, minor).
    pub number: (u32, u32),
}

/// The usable loop devices whose backing file is `image` (canonical path), sorted by name. A
/// device being detached (`losetup --detach` while something still held it open sets
/// autoclear; the kernel lets go at the last close) is not usable and not listed.
pub(crate) fn find(sys_root: &Path, image: &Path) -> Result<Vec<LoopDev>> {
    find_with(sys_root, image, false)
}

fn find_with(sys_root: &Path, image: &Path, detaching_too: bool) -> Result<Vec<LoopDev>> {
    let image = std::fs::canonicalize(image).map_err(|e| Error::io("resolving", image, e))?;
    let block = sys_root.join("block");
    let entries = match std::fs::read_dir(&block) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io("listing", &block, e)),
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.starts_with("loop") {
            continue;
        }
        // Unbound loop devices have no loop/ directory or an empty backing_file.
        let Ok(text) = std::fs::read_to_string(entry.path().join("loop/backing_file")) else {
            continue;
        };
        if !backing_matches(&text, &image) {
            continue;
        }
        let flag = |file: &str| {
            std::fs::read_to_string(entry.path().join(file)).is_ok_and(|a| a.trim() == "1")
        };
        if !detaching_too && flag("loop/autoclear") {
            continue;
        }
        let dev_file = entry.path().join("dev");
        let Ok(text) = std::fs::read_to_string(&dev_file) else {
            // Unbound between the two reads.
            continue;
        };
        let number = parse_dev(&text).ok_or_else(|| {
            Error::Mount(mount_utils::Error::Sysfs {
                file: dev_file,
                text,
                expected: "MAJOR:MINOR",
            })
        })?;
        found.push(LoopDev {
            path: PathBuf::from("/dev").join(name),
            read_only: flag("ro"),
            number,
        });
    }
    found.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(found)
}

/// The kernel writes the path with a newline; a file removed while attached gets
/// " (deleted)", which is not our image any more.
fn backing_matches(text: &str, image: &Path) -> bool {
    let text = text.trim_end_matches('\n');
    !text.is_empty() && Path::new(text) == image
}

/// The writable (or read-only) loop device of `image`: an existing one if there is one, else
/// a newly attached one. The caller holds the volume's lock, so no second attach of the same
/// image races this one.
pub(crate) async fn ensure(sys_root: &Path, image: &Path, read_only: bool) -> Result<LoopDev> {
    if let Some(dev) = find(sys_root, image)?
        .into_iter()
        .find(|d| d.read_only == read_only)
    {
        tracing::debug!(device = %dev.path.display(), image = %image.display(), read_only, "reusing loop device");
        return Ok(dev);
    }
    let mut args: Vec<&std::ffi::OsStr> = vec!["--find".as_ref(), "--show".as_ref()];
    if read_only {
        args.push("--read-only".as_ref());
    }
    args.push(image.as_os_str());
    let out = cmd::run_ok("losetup", &args).await?;
    let path = PathBuf::from(out.stdout.trim());
    let attached = find(sys_root, image)?.into_iter().find(|d| d.path == path);
    let Some(dev) = attached else {
        return Err(Error::Mount(mount_utils::Error::Command {
            command: format!("losetup {}", image.display()),
            status: "exit code 0".into(),
            output: format!(
                "printed {:?}, which sysfs does not show bound to the image",
                out.stdout.trim()
            ),
        }));
    };
    tracing::info!(device = %dev.path.display(), image = %image.display(), read_only, "attached loop device");
    Ok(dev)
}

/// How long a detach waits for a device someone briefly holds open (udev probing it after
/// the last writer closed) to be let go by the kernel.
const DETACH_WAIT: Duration = Duration::from_secs(10);

/// Detaches the loop devices of `image` that `which` selects (`Some(ro)`: only the read-only
/// or only the writable ones; `None`: all); none is fine (a retried call). Waits until the
/// kernel has let go of them, so that the caller sees them gone; one still held open after the
/// wait goes at its last close. Returns how many were detached.
pub(crate) async fn detach(sys_root: &Path, image: &Path, which: Option<bool>) -> Result<usize> {
    if !image.exists() {
        return Ok(0);
    }
    let selected = |d: &LoopDev| which.is_none_or(|ro| d.read_only == ro);
    let devices: Vec<LoopDev> = find(sys_root, image)?
        .into_iter()
        .filter(selected)
        .collect();
    for dev in &devices {
        cmd::run_ok("losetup", ["--detach".as_ref(), dev.path.as_os_str()]).await?;
        tracing::info!(device = %dev.path.display(), image = %image.display(), "detached loop device");
    }
    let deadline = tokio::time::Instant::now() + DETACH_WAIT;
    loop {
        let left: Vec<LoopDev> = find_with(sys_root, image, true)?
            .into_iter()
            .filter(|d| devices.iter().any(|x| x.path == d.path))
            .collect();
        if left.is_empty() {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!(devices = ?left, image = %image.display(), "loop devices still held open after detach; the kernel frees them at their last close");
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(devices.len())
}

/// Makes every loop device of `image` see the image's current size.
pub(crate) async fn refresh_capacity(sys_root: &Path, image: &Path) -> Result<Vec<LoopDev>> {
    let devices = find(sys_root, image)?;
    for dev in &devices {
        cmd::run_ok("losetup", ["--set-capacity".as_ref(), dev.path.as_os_str()]).await?;
    }
    Ok(devices)
}

fn parse_dev(text: &str) -> Option<(u32, u32)> {
    let (a, b) = text.trim().split_once(':')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn finds_devices_by_backing_file_in_a_fake_sysfs() {
        let sys = tempfile::tempdir().unwrap();
        let img_dir = tempfile::tempdir().unwrap();
        let image = img_dir.path().join("v.img");
        std::fs::write(&image, b"").unwrap();
        let canon = std::fs::canonicalize(&image).unwrap();
        let add = |name: &str, minor: u32, backing: Option<String>, ro: bool| {
            let d = sys.path().join("block").join(name);
            std::fs::create_dir_all(d.join("loop")).unwrap();
            std::fs::write(d.join("dev"), format!("7:{minor}\n")).unwrap();
            std::fs::write(d.join("ro"), if ro { "1\n" } else { "0\n" }).unwrap();
            if let Some(b) = backing {
                std::fs::write(d.join("loop/backing_file"), b).unwrap();
            }
        };
        let ours = format!("{}\n", canon.display());
        add("loop3", 3, Some(ours.clone()), false);
        add("loop5", 5, Some(ours.clone()), true);
        add("loop1", 1, Some("/other/file.img\n".into()), false);
        add(
            "loop2",
            2,
            Some(format!("{} (deleted)\n", canon.display())),
            false,
        );
        add("loop0", 0, None, false);
        add("loop4", 4, Some(ours.clone()), false);
        std::fs::write(sys.path().join("block/loop4/loop/autoclear"), "1\n").unwrap();
        add("sda", 8, Some(ours), false);
        let dev = |n: u32, ro: bool| LoopDev {
            path: PathBuf::from(format!("/dev/loop{n}")),
            read_only: ro,
            number: (7, n),
        };
        assert_eq!(
            find(sys.path(), &image).unwrap(),
            vec![dev(3, false), dev(5, true)]
        );
        // Being detached: not usable, but still there until the kernel lets go.
        assert_eq!(
            find_with(sys.path(), &image, true).unwrap(),
            vec![dev(3, false), dev(4, false), dev(5, true)]
        );
        // No sysfs block dir at all: no devices.
        let empty = tempfile::tempdir().unwrap();
        assert!(find(empty.path(), &image).unwrap().is_empty());
    }

    #[test]
    fn dev_numbers_parse() {
        assert_eq!(parse_dev("7:12\n"), Some((7, 12)));
        assert_eq!(parse_dev("7"), None);
        assert_eq!(parse_dev("a:b"), None);
    }
}
