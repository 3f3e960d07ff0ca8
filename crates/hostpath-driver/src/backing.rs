//! The files behind volumes and snapshots: `volumes/<id>/` (mount) or `volumes/<id>.img`
//! (block, sparse), and the same under `snapshots/`. Copies go to a temporary name first and
//! are renamed into place, so a crash mid-copy never leaves a half copy under the real name.

use std::path::{Path, PathBuf};

use mount_utils::cmd;

use crate::state::Kind;
use crate::{Error, Result};

pub(crate) fn volumes_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("volumes")
}

pub(crate) fn snapshots_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("snapshots")
}

/// Where a volume's content lives.
pub(crate) fn volume_path(state_dir: &Path, id: &str, kind: Kind) -> PathBuf {
    file_for(&volumes_dir(state_dir), id, kind)
}

/// Where a snapshot's content lives.
pub(crate) fn snapshot_path(state_dir: &Path, id: &str, kind: Kind) -> PathBuf {
    file_for(&snapshots_dir(state_dir), id, kind)
}

fn file_for(dir: &Path, id: &str, kind: Kind) -> PathBuf {
    match kind {
        Kind::Mount => dir.join(id),
        Kind::Block => dir.join(format!("{id}.img")),
    }
}

/// Whether `id` can name a file: IDs from the CO (ephemeral volumes) become path components.
pub(crate) fn safe_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 200
        && !id.starts_with('.')
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Creates an empty volume (or keeps the one there): a directory, or a sparse file of `size`
/// bytes (grown to `size` if it is smaller).
pub(crate) fn create_empty(path: &Path, kind: Kind, size: u64) -> Result<()> {
    match kind {
        Kind::Mount => {
            std::fs::create_dir_all(path).map_err(|e| Error::io("creating directory", path, e))
        }
        Kind::Block => {
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)
                    .map_err(|e| Error::io("creating directory", parent, e))?;
            }
            let f = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(path)
                .map_err(|e| Error::io("creating", path, e))?;
            let len = f
                .metadata()
                .map_err(|e| Error::io("inspecting", path, e))?
                .len();
            if len < size {
                f.set_len(size).map_err(|e| Error::io("sizing", path, e))?;
            }
            Ok(())
        }
    }
}

/// Copies `src` to `dst` (directory tree with owners and modes, or a sparse image), then for a
/// block volume grows the copy to `size`. A `dst` that exists already is left as it is.
pub(crate) async fn copy(src: &Path, dst: &Path, kind: Kind, size: u64) -> Result<()> {
    if dst.exists() {
        return create_empty(dst, kind, size);
    }
    if !src.exists() {
        return Err(Error::io(
            "copying from",
            src,
            std::io::Error::from(std::io::ErrorKind::NotFound),
        ));
    }
    let parent = dst.parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(parent).map_err(|e| Error::io("creating directory", parent, e))?;
    let mut tmp = dst.as_os_str().to_owned();
    tmp.push(".copying");
    let tmp = PathBuf::from(tmp);
    remove(&tmp, kind)?;
    match kind {
        Kind::Mount => {
            std::fs::create_dir_all(&tmp).map_err(|e| Error::io("creating directory", &tmp, e))?;
            let mut from = src.as_os_str().to_owned();
            from.push("/.");
            cmd::run_ok("cp", ["-a".as_ref(), from.as_os_str(), tmp.as_os_str()]).await?;
        }
        Kind::Block => {
            cmd::run_ok(
                "cp",
                ["--sparse=always".as_ref(), src.as_os_str(), tmp.as_os_str()],
            )
            .await?;
        }
    }
    std::fs::rename(&tmp, dst).map_err(|e| Error::io("renaming copy to", dst, e))?;
    create_empty(dst, kind, size)
}

/// Removes a volume's or snapshot's content; already gone is fine.
pub(crate) fn remove(path: &Path, kind: Kind) -> Result<()> {
    let r = match kind {
        Kind::Mount => std::fs::remove_dir_all(path),
        Kind::Block => std::fs::remove_file(path),
    };
    match r {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io("removing", path, e)),
    }
}

/// The size a snapshot records: the image's length, or the bytes of the files in a tree.
pub(crate) fn content_size(path: &Path, kind: Kind) -> u64 {
    match kind {
        Kind::Block => std::fs::metadata(path).map(|m| m.len()).unwrap_or(0),
        Kind::Mount => tree_size(path),
    }
}

fn tree_size(path: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(path) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => tree_size(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map(|m| m.len()).unwrap_or(0),
            _ => 0,
        })
        .fold(0u64, u64::saturating_add)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn paths_and_ids() {
        let d = Path::new("/s");
        assert_eq!(
            volume_path(d, "a", Kind::Mount),
            PathBuf::from("/s/volumes/a")
        );
        assert_eq!(
            volume_path(d, "a", Kind::Block),
            PathBuf::from("/s/volumes/a.img")
        );
        assert_eq!(
            snapshot_path(d, "s", Kind::Block),
            PathBuf::from("/s/snapshots/s.img")
        );
        assert!(safe_id("csi-0123abc_x.y"));
        for bad in ["", "../x", "a/b", ".hidden", "a b", "ü"] {
            assert!(!safe_id(bad), "{bad}");
        }
    }

    #[tokio::test]
    async fn sparse_images_and_tree_copies() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("v/a.img");
        create_empty(&img, Kind::Block, 64 << 20).unwrap();
        let meta = std::fs::metadata(&img).unwrap();
        assert_eq!(meta.len(), 64 << 20);
        // Sparse: almost no blocks allocated for 64 MiB.
        assert!(meta.blocks() * 512 < 1 << 20, "{} blocks", meta.blocks());
        let copy_img = dir.path().join("v/b.img");
        copy(&img, &copy_img, Kind::Block, 128 << 20).await.unwrap();
        assert_eq!(std::fs::metadata(&copy_img).unwrap().len(), 128 << 20);

        let tree = dir.path().join("t");
        std::fs::create_dir_all(tree.join("sub")).unwrap();
        std::fs::write(tree.join("sub/f"), b"hello").unwrap();
        let dst = dir.path().join("u");
        copy(&tree, &dst, Kind::Mount, 0).await.unwrap();
        assert_eq!(std::fs::read(dst.join("sub/f")).unwrap(), b"hello");
        assert_eq!(content_size(&dst, Kind::Mount), 5);
        assert!(!dir.path().join("u.copying").exists());
        remove(&dst, Kind::Mount).unwrap();
        remove(&dst, Kind::Mount).unwrap();
        assert!(!dst.exists());
        let err = copy(&dir.path().join("nope"), &dst, Kind::Mount, 0)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("nope"), "{err}");
    }
}
