//! What is in the plugin registry directory: its unix sockets and their identity.
//!
//! The kubelet's plugin watcher uses fsnotify; we poll instead (see the module docs of
//! `pluginmanager`): a scan lists the sockets with their inode and change times, so a socket
//! that was removed and created again between two scans still looks different.

use std::collections::BTreeMap;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// One socket file's identity: a re-created socket differs in inode or times. (Limit: a socket
/// re-created on the same inode within one tick of the kernel's coarse clock, a few ms, looks
/// unchanged; a restarting registrar takes far longer than that.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SocketId {
    dev: u64,
    ino: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl SocketId {
    fn of(meta: &std::fs::Metadata) -> Self {
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }
}

/// The sockets in `dir` and in its subdirectories one level deep (the kubelet accepts those
/// too). Hidden entries (a name starting with `.`) and anything that is not a socket are
/// ignored, as by the kubelet. An error only when `dir` itself cannot be read.
pub(crate) fn scan(dir: &Path) -> io::Result<BTreeMap<PathBuf, SocketId>> {
    let mut sockets = BTreeMap::new();
    for (path, meta) in entries(dir)? {
        if meta.file_type().is_socket() {
            sockets.insert(path, SocketId::of(&meta));
        } else if meta.is_dir() {
            // A subdirectory may vanish between listing and reading: nothing in it then.
            for (path, meta) in entries(&path).unwrap_or_default() {
                if meta.file_type().is_socket() {
                    sockets.insert(path, SocketId::of(&meta));
                }
            }
        }
    }
    Ok(sockets)
}

/// The non-hidden entries of `dir` with their own (not followed) metadata; entries removed
/// while listing are skipped.
fn entries(dir: &Path) -> io::Result<Vec<(PathBuf, std::fs::Metadata)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let Ok(entry) = entry else { continue };
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let path = entry.path();
        if let Ok(meta) = std::fs::symlink_metadata(&path) {
            out.push((path, meta));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    #[test]
    fn sockets_are_found_one_level_deep_and_the_rest_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let _top = UnixListener::bind(d.join("a.csi-reg.sock")).unwrap();
        let _hidden = UnixListener::bind(d.join(".hidden.sock")).unwrap();
        std::fs::write(d.join("file.sock"), b"not a socket").unwrap();
        std::fs::create_dir_all(d.join("sub/deeper")).unwrap();
        let _sub = UnixListener::bind(d.join("sub/b.sock")).unwrap();
        let _deep = UnixListener::bind(d.join("sub/deeper/c.sock")).unwrap();
        std::fs::create_dir(d.join(".hiddendir")).unwrap();
        let _in_hidden = UnixListener::bind(d.join(".hiddendir/e.sock")).unwrap();
        std::os::unix::fs::symlink(d.join("a.csi-reg.sock"), d.join("link.sock")).unwrap();

        let found: Vec<PathBuf> = scan(d).unwrap().into_keys().collect();
        assert_eq!(found, vec![d.join("a.csi-reg.sock"), d.join("sub/b.sock")]);
    }

    #[test]
    fn a_recreated_socket_has_another_identity() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.sock");
        let first = UnixListener::bind(&path).unwrap();
        let before = scan(dir.path()).unwrap()[&path];
        assert_eq!(
            scan(dir.path()).unwrap()[&path],
            before,
            "stable while unchanged"
        );
        drop(first);
        std::fs::remove_file(&path).unwrap();
        // File times come from the kernel's coarse clock (one tick, up to 10 ms): a socket
        // re-created within the same tick on a reused inode would look the same.
        std::thread::sleep(std::time::Duration::from_millis(25));
        let _second = UnixListener::bind(&path).unwrap();
        assert_ne!(scan(dir.path()).unwrap()[&path], before);
    }

    #[test]
    fn a_missing_directory_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        assert!(scan(&dir.path().join("nope")).is_err());
    }
}
