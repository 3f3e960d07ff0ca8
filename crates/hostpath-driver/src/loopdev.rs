//! Loop devices for block volumes. The kernel is the record: a device whose
//! `/sys/block/loopN/loop/backing_file` names a volume's image is that volume's device, so a
//! restarted driver adopts it instead of attaching a second one.

use std::path::{Path, PathBuf};
use std::time::Duration;

use mount_utils::cmd;

use crate::{Error, Result};

/// The usable loop devices whose backing file is `image` (canonical path), sorted by name. A
/// device being detached (`losetup --detach` while something still held it open sets
/// autoclear; the kernel lets go at the last close) is not usable and not listed.
pub(crate) fn find(sys_root: &Path, image: &Path) -> Result<Vec<PathBuf>> {
    find_with(sys_root, image, false)
}

fn find_with(sys_root: &Path, image: &Path, detaching_too: bool) -> Result<Vec<PathBuf>> {
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
        let autoclear = std::fs::read_to_string(entry.path().join("loop/autoclear"))
            .is_ok_and(|a| a.trim() == "1");
        if detaching_too || !autoclear {
            found.push(PathBuf::from("/dev").join(name));
        }
    }
    found.sort();
    Ok(found)
}

/// The kernel writes the path with a newline; a file removed while attached gets
/// " (deleted)", which is not our image any more.
fn backing_matches(text: &str, image: &Path) -> bool {
    let text = text.trim_end_matches('\n');
    !text.is_empty() && Path::new(text) == image
}

/// The loop device of `image`: an existing one if there is one, else a newly attached one.
/// The caller holds the volume's lock, so no second attach of the same image races this one;
/// `--nooverlap` makes losetup reuse a device it finds for the file all the same.
pub(crate) async fn ensure(sys_root: &Path, image: &Path) -> Result<PathBuf> {
    if let Some(dev) = find(sys_root, image)?.into_iter().next() {
        tracing::debug!(device = %dev.display(), image = %image.display(), "reusing loop device");
        return Ok(dev);
    }
    let out = cmd::run_ok(
        "losetup",
        [
            "--find".as_ref(),
            "--show".as_ref(),
            "--nooverlap".as_ref(),
            image.as_os_str(),
        ],
    )
    .await?;
    let dev = PathBuf::from(out.stdout.trim());
    if dev.as_os_str().is_empty() {
        return Err(Error::Mount(mount_utils::Error::Command {
            command: format!("losetup --find --show --nooverlap {}", image.display()),
            status: "exit code 0".into(),
            output: "no device name printed".into(),
        }));
    }
    tracing::info!(device = %dev.display(), image = %image.display(), "attached loop device");
    Ok(dev)
}

/// How long a detach waits for a device someone briefly holds open (udev probing it after
/// the last writer closed) to be let go by the kernel.
const DETACH_WAIT: Duration = Duration::from_secs(10);

/// Detaches every loop device of `image`; none is fine (a retried call). Returns how many.
/// Waits until the kernel has let go of them, so that a caller that detached sees no device
/// of the image any more; one still held open after the wait goes at its last close.
pub(crate) async fn detach_all(sys_root: &Path, image: &Path) -> Result<usize> {
    if !image.exists() {
        return Ok(0);
    }
    let devices = find(sys_root, image)?;
    for dev in &devices {
        cmd::run_ok("losetup", ["--detach".as_ref(), dev.as_os_str()]).await?;
        tracing::info!(device = %dev.display(), image = %image.display(), "detached loop device");
    }
    let deadline = tokio::time::Instant::now() + DETACH_WAIT;
    loop {
        let left = find_with(sys_root, image, true)?;
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

/// (major, minor) of a loop device from sysfs (`/sys/block/loopN/dev`).
pub(crate) fn dev_number(sys_root: &Path, device: &Path) -> Result<(u32, u32)> {
    let name = device
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let file = sys_root.join("block").join(name).join("dev");
    let text = std::fs::read_to_string(&file).map_err(|e| Error::io("reading", &file, e))?;
    parse_dev(&text).ok_or_else(|| {
        Error::Mount(mount_utils::Error::Sysfs {
            file,
            text,
            expected: "MAJOR:MINOR",
        })
    })
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
        let add = |name: &str, backing: Option<String>| {
            let d = sys.path().join("block").join(name);
            std::fs::create_dir_all(d.join("loop")).unwrap();
            std::fs::write(d.join("dev"), "7:3\n").unwrap();
            if let Some(b) = backing {
                std::fs::write(d.join("loop/backing_file"), b).unwrap();
            }
        };
        add("loop3", Some(format!("{}\n", canon.display())));
        add("loop1", Some("/other/file.img\n".into()));
        add("loop2", Some(format!("{} (deleted)\n", canon.display())));
        add("loop0", None);
        add("loop4", Some(format!("{}\n", canon.display())));
        std::fs::write(sys.path().join("block/loop4/loop/autoclear"), "1\n").unwrap();
        add("sda", Some(format!("{}\n", canon.display())));
        assert_eq!(
            find(sys.path(), &image).unwrap(),
            vec![PathBuf::from("/dev/loop3")]
        );
        // Being detached: not usable, but still there until the kernel lets go.
        assert_eq!(
            find_with(sys.path(), &image, true).unwrap(),
            vec![PathBuf::from("/dev/loop3"), PathBuf::from("/dev/loop4")]
        );
        assert_eq!(
            dev_number(sys.path(), Path::new("/dev/loop3")).unwrap(),
            (7, 3)
        );
        assert!(dev_number(sys.path(), Path::new("/dev/loop9")).is_err());
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
