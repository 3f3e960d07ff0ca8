//! `<data-dir>/csi-cluster.pid`: one `up` per data dir, and how `down` finds it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};

use crate::Error;

pub(crate) fn path(data_dir: &Path) -> PathBuf {
    data_dir.join("csi-cluster.pid")
}

/// The pid in the file, if the file exists and holds one.
fn read(data_dir: &Path) -> Option<i32> {
    std::fs::read_to_string(path(data_dir))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Whether `pid` is a live csi-cluster process (not a zombie, not a reused pid of something
/// else).
fn is_cluster(pid: i32) -> bool {
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    let Ok(stat) = std::fs::read_to_string(proc_dir.join("stat")) else {
        return false;
    };
    // "pid (comm) S ...": the state follows the last ')'.
    let zombie = stat
        .rsplit_once(')')
        .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X']));
    if zombie {
        return false;
    }
    std::fs::read(proc_dir.join("cmdline"))
        .is_ok_and(|c| String::from_utf8_lossy(&c).contains("csi-cluster"))
}

/// `<data-dir>/csi-cluster.lock`: held (flock) for as long as a cluster runs on the data dir.
/// The lock, not the pid file, decides who runs: two `up`s started in the same instant both
/// see no live pid, but only one gets the lock. The kernel drops it when the process dies, so
/// a SIGKILLed cluster leaves no lock behind.
fn lock_path(data_dir: &Path) -> PathBuf {
    data_dir.join("csi-cluster.lock")
}

/// Claims the data dir for this process: fails if a live csi-cluster holds it, replaces a
/// stale pid file.
pub(crate) fn claim(data_dir: &Path) -> Result<PidFile, Error> {
    let lock_file = lock_path(data_dir);
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_file)
        .map_err(|e| Error::io("opening the lock file", &lock_file, e))?;
    if let Err(e) = rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        if e == rustix::io::Errno::WOULDBLOCK {
            return Err(Error::AlreadyRunning {
                pid: read(data_dir).unwrap_or(0),
                data_dir: data_dir.to_path_buf(),
            });
        }
        return Err(Error::io("locking", &lock_file, e.into()));
    }
    let file = path(data_dir);
    std::fs::write(&file, format!("{}\n", std::process::id()))
        .map_err(|e| Error::io("writing the pid file", &file, e))?;
    Ok(PidFile {
        path: file,
        _lock: lock,
    })
}

/// Removes the pid file when dropped, then releases the lock.
#[derive(Debug)]
pub(crate) struct PidFile {
    path: PathBuf,
    _lock: std::fs::File,
}

impl Drop for PidFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// `csi-cluster down`: SIGTERM to the cluster running on `data_dir`, then waits (up to
/// `timeout`) until it has exited. A stale pid file is removed and reported as not running.
pub async fn down(data_dir: &Path, timeout: Duration) -> Result<i32, Error> {
    let not_running = |reason: String| Error::NotRunning {
        data_dir: data_dir.to_path_buf(),
        reason,
    };
    let Some(pid) = read(data_dir) else {
        return Err(not_running(format!(
            "no pid file at {}",
            path(data_dir).display()
        )));
    };
    if !is_cluster(pid) {
        let _ = std::fs::remove_file(path(data_dir));
        return Err(not_running(format!(
            "pid {pid} from {} is not running (stale pid file removed)",
            path(data_dir).display()
        )));
    }
    let target = Pid::from_raw(pid).ok_or_else(|| not_running(format!("bad pid {pid}")))?;
    kill_process(target, Signal::TERM).map_err(|e| {
        Error::io(
            "sending SIGTERM to the process of",
            path(data_dir),
            e.into(),
        )
    })?;
    let started = Instant::now();
    while is_cluster(pid) {
        if started.elapsed() > timeout {
            return Err(Error::Timeout {
                what: format!("csi-cluster (pid {pid}) stopping after SIGTERM"),
                waited: timeout,
                progress: format!("see {}", data_dir.join("logs").display()),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(pid)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn a_stale_pid_file_is_replaced_and_removed_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        // No process has pid i32::MAX.
        std::fs::write(path(dir.path()), format!("{}\n", i32::MAX)).unwrap();
        let claimed = claim(dir.path()).unwrap();
        assert_eq!(read(dir.path()), Some(std::process::id() as i32));
        let second = claim(dir.path()).unwrap_err();
        assert!(
            matches!(second, Error::AlreadyRunning { pid, .. } if pid == std::process::id() as i32),
            "{second}"
        );
        drop(claimed);
        assert!(!path(dir.path()).exists());
        drop(claim(dir.path()).unwrap());
    }

    #[tokio::test]
    async fn down_without_a_cluster_says_so_and_cleans_a_stale_file() {
        let dir = tempfile::tempdir().unwrap();
        let e = down(dir.path(), Duration::from_secs(1)).await.unwrap_err();
        assert!(e.to_string().contains("no pid file"), "{e}");
        std::fs::write(path(dir.path()), format!("{}\n", i32::MAX)).unwrap();
        let e = down(dir.path(), Duration::from_secs(1)).await.unwrap_err();
        assert!(e.to_string().contains("stale pid file removed"), "{e}");
        assert!(!path(dir.path()).exists());
    }
}
