//! "Is this path a mount of that volume?", asked of the kernel: the mount table says a path is
//! a mount point, and the inode (a directory volume) or the device number (a block volume)
//! says whose.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use mount_utils::findmnt::{self, MountEntry};

use crate::Result;
use crate::loopdev::{self, LoopDev};

/// What is mounted at `path` (the topmost mount), if anything.
pub(crate) async fn mount_at(path: &Path) -> Result<Option<MountEntry>> {
    Ok(findmnt::mounted_at(path).await?)
}

/// Same filesystem object: a bind mount of `dir` shows `dir`'s inode at the mount point.
pub(crate) fn same_inode(a: &Path, b: &Path) -> bool {
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

/// The (major, minor) of the device node at `path`, if it is one.
pub(crate) fn device_number(path: &Path) -> Option<(u32, u32)> {
    use std::os::unix::fs::FileTypeExt;
    let m = std::fs::metadata(path).ok()?;
    let t = m.file_type();
    if !(t.is_block_device() || t.is_char_device()) {
        return None;
    }
    let rdev = m.rdev();
    Some((rustix::fs::major(rdev), rustix::fs::minor(rdev)))
}

/// The mount at `path` if it is a bind of directory `dir`.
pub(crate) async fn dir_mount(path: &Path, dir: &Path) -> Result<Option<MountEntry>> {
    if !same_inode(path, dir) {
        return Ok(None);
    }
    mount_at(path).await
}

/// Whether `path` is a bind of directory `dir`, without the mount table when the kernel can
/// say (a statx): every node of a `csi-cluster` shares one table of thousands of mounts.
pub(crate) async fn is_dir_mount(path: &Path, dir: &Path) -> Result<bool> {
    if !same_inode(path, dir) {
        return Ok(false);
    }
    Ok(findmnt::is_mounted(path).await?)
}

/// The mount at `path` if it is a bind of the block device `dev`.
pub(crate) async fn device_mount(path: &Path, dev: (u32, u32)) -> Result<Option<MountEntry>> {
    Ok(mount_at(path)
        .await?
        .filter(|_| device_number(path) == Some(dev)))
}

/// The loop device of `image` that is bound onto `path`, if `path` is a mount of one of them.
pub(crate) async fn loop_mount(
    sys_root: &Path,
    image: &Path,
    path: &Path,
) -> Result<Option<LoopDev>> {
    let Some(number) = device_number(path) else {
        return Ok(None);
    };
    if !image.exists() || mount_at(path).await?.is_none() {
        return Ok(None);
    }
    Ok(loopdev::find(sys_root, image)?
        .into_iter()
        .find(|d| d.number == number))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn inodes_and_device_numbers() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        std::fs::create_dir(&a).unwrap();
        assert!(same_inode(&a, &a));
        assert!(!same_inode(&a, dir.path()));
        assert!(!same_inode(&a, &dir.path().join("missing")));
        assert_eq!(device_number(&a), None);
        // /dev/null is character device 1:3 on Linux.
        assert_eq!(device_number(Path::new("/dev/null")), Some((1, 3)));
    }

    #[tokio::test]
    async fn a_plain_directory_is_no_mount() {
        let dir = tempfile::tempdir().unwrap();
        assert!(dir_mount(dir.path(), dir.path()).await.unwrap().is_none());
        assert!(mount_at(Path::new("/")).await.unwrap().is_some());
    }
}
