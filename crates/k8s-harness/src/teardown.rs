//! What is left to clean after the processes stop: containers (their shims run in process
//! groups of their own, so stopping containerd does not stop them), mounts under the temp dir
//! (the kubelet's bind mount of its root dir, tmpfs for projected tokens, containerd's rootfs
//! overlays, shm and network namespaces), and the pod log dirs the kubelet keeps in
//! /var/log/pods whatever its root dir is.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use rustix::mount::UnmountFlags;
use rustix::process::{Pid, Signal};

/// Removes every container of containerd's `k8s.io` namespace through `ctr` (kill, delete:
/// that is what removes their cgroups and shim sockets). Best effort, bounded in time.
pub(crate) fn delete_containers(ctr: &Path, socket: &Path) {
    let ctr_cmd = |args: &[&str]| {
        let mut c = Command::new("timeout");
        c.arg("15")
            .arg(ctr)
            .arg("-a")
            .arg(socket)
            .args(["-n", "k8s.io"])
            .args(args);
        c.stdin(std::process::Stdio::null());
        c
    };
    let Ok(out) = ctr_cmd(&["tasks", "ls", "-q"]).output() else {
        return;
    };
    let ids: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect();
    if ids.is_empty() {
        return;
    }
    let mut args = vec!["tasks", "delete", "--force"];
    args.extend(ids.iter().map(String::as_str));
    let _ = ctr_cmd(&args).output();
}

/// Every process whose command line mentions `dir` (containerd shims name their socket, which
/// is in it), and everything they forked (the containers). SIGKILL to all of them.
pub(crate) fn kill_processes_of(dir: &Path) -> Vec<u32> {
    let needle = dir.to_string_lossy().into_owned();
    let me = std::process::id();
    let mut parent_of: HashMap<u32, u32> = HashMap::new();
    let mut roots = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if let Some(ppid) = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| ppid_of(&s))
        {
            parent_of.insert(pid, ppid);
        }
        if pid != me
            && std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&needle))
        {
            roots.push(pid);
        }
    }
    let mut doomed = roots.clone();
    let mut i = 0;
    while i < doomed.len() {
        let p = doomed[i];
        doomed.extend(
            parent_of
                .iter()
                .filter(|(_, pp)| **pp == p)
                .map(|(c, _)| *c),
        );
        i += 1;
    }
    doomed.sort_unstable();
    doomed.dedup();
    doomed.retain(|p| *p != me);
    for p in &doomed {
        if let Some(pid) = i32::try_from(*p).ok().and_then(Pid::from_raw) {
            let _ = rustix::process::kill_process(pid, Signal::KILL);
        }
    }
    doomed
}

/// The parent pid from a `/proc/<pid>/stat` line (after the `)` that ends the command name).
fn ppid_of(stat: &str) -> Option<u32> {
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Mount points at or below `dir`, deepest first, from `/proc/self/mountinfo`.
pub(crate) fn mounts_below(dir: &Path) -> Vec<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut points: Vec<PathBuf> = text
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape_mountinfo(p)))
        .filter(|p| p.starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    points.dedup();
    points
}

/// mountinfo writes space, tab, newline and backslash in paths as `\ooo` octal escapes.
fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        if let (b'\\', Some(d)) = (bytes[i], octal) {
            let v = d.iter().fold(0u32, |acc, b| acc * 8 + u32::from(b - b'0'));
            out.push(u8::try_from(v).unwrap_or(b'?'));
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Unmounts everything at or below `dir`, deepest first; a busy mount is detached (lazy
/// unmount). Repeats while something is left (stacked mounts), and returns what still is.
pub(crate) fn unmount_all_below(dir: &Path) -> Vec<PathBuf> {
    for _ in 0..5 {
        let points = mounts_below(dir);
        if points.is_empty() {
            return points;
        }
        for p in &points {
            if rustix::mount::unmount(p, UnmountFlags::empty()).is_err() {
                let _ = rustix::mount::unmount(p, UnmountFlags::DETACH);
            }
        }
    }
    mounts_below(dir)
}

/// The pod UIDs a kubelet with root dir `root` ran (the dirs of `<root>/pods`).
pub(crate) fn pod_uids(root: &Path) -> Vec<String> {
    std::fs::read_dir(root.join("pods"))
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Removes the kubelet's logs of these pods: `/var/log/pods/<ns>_<name>_<uid>` and the
/// `/var/log/containers` links into them (both paths are fixed in kubelet v1.26).
pub(crate) fn remove_pod_logs(uids: &[String]) {
    remove_pod_logs_in(
        Path::new("/var/log/pods"),
        Path::new("/var/log/containers"),
        uids,
    );
}

fn remove_pod_logs_in(pods: &Path, containers: &Path, uids: &[String]) {
    if uids.is_empty() {
        return;
    }
    let mut removed = Vec::new();
    if let Ok(rd) = std::fs::read_dir(pods) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if uids.iter().any(|u| name.ends_with(&format!("_{u}"))) {
                let _ = std::fs::remove_dir_all(e.path());
                removed.push(e.path());
            }
        }
    }
    if let Ok(rd) = std::fs::read_dir(containers) {
        for e in rd.flatten() {
            if std::fs::read_link(e.path()).is_ok_and(|t| removed.iter().any(|r| t.starts_with(r)))
            {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// The file in a cluster's temp dir that names the test process owning it.
pub(crate) const OWNER_FILE: &str = "owner";

/// This process as `<pid> <start time>`: the start time tells a reused pid apart.
pub(crate) fn owner_stamp() -> String {
    let me = std::process::id();
    format!("{me} {}", start_time(me).unwrap_or_default())
}

fn start_time(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 22 (starttime); fields counted from 3 (state) after the command name.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(19)
        .map(String::from)
}

/// Cleans up after clusters whose test process died without dropping them (SIGKILL, abort):
/// their Kubernetes processes died with it (parent-death signal), but containerd's shims, the
/// containers, the mounts and the temp dir outlive it. A temp dir under `tmp` with an
/// [`OWNER_FILE`] whose process is gone is torn down as `Drop` would have.
pub(crate) fn sweep_orphans(tmp: &Path) -> Vec<PathBuf> {
    let mut swept = Vec::new();
    let Ok(rd) = std::fs::read_dir(tmp) else {
        return swept;
    };
    for e in rd.flatten() {
        let dir = e.path();
        if !e.file_name().to_string_lossy().starts_with("k8s-") {
            continue;
        }
        let Ok(owner) = std::fs::read_to_string(dir.join(OWNER_FILE)) else {
            continue;
        };
        let mut it = owner.split_whitespace();
        let (Some(pid), started) = (it.next().and_then(|p| p.parse::<u32>().ok()), it.next())
        else {
            continue;
        };
        if start_time(pid).is_some_and(|t| Some(t.as_str()) == started) {
            continue; // its test is still running
        }
        let uids = pod_uids(&dir.join("kubelet"));
        let killed = kill_processes_of(&dir);
        wait_gone(&killed, Duration::from_secs(5));
        if unmount_all_below(&dir).is_empty() {
            remove_pod_logs(&uids);
            let _ = std::fs::remove_dir_all(&dir);
            swept.push(dir);
        }
    }
    swept
}

/// Waits up to `patience` for these pids to be gone (killed processes that are not our
/// children are reaped by their own parents).
pub(crate) fn wait_gone(pids: &[u32], patience: Duration) {
    let deadline = std::time::Instant::now() + patience;
    while std::time::Instant::now() < deadline
        && pids
            .iter()
            .any(|p| Path::new(&format!("/proc/{p}")).exists())
    {
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(unescape_mountinfo(r"/tmp/a\040b"), "/tmp/a b");
        assert_eq!(unescape_mountinfo(r"/x\134y\011"), "/x\\y\t");
        assert_eq!(unescape_mountinfo("/plain"), "/plain");
        assert_eq!(unescape_mountinfo(r"/short\04"), r"/short\04");
    }

    #[test]
    fn parent_pid_is_read_after_the_command_name() {
        assert_eq!(ppid_of("42 (a) b) S 7 42 42 0"), Some(7));
        assert_eq!(ppid_of("garbage"), None);
    }

    #[test]
    fn pod_logs_of_our_pods_and_their_links_go_others_stay() {
        let d = tempfile::tempdir().unwrap();
        let pods = d.path().join("pods");
        let containers = d.path().join("containers");
        std::fs::create_dir_all(pods.join("ns_a_uid-1/c")).unwrap();
        std::fs::create_dir_all(pods.join("ns_b_uid-2/c")).unwrap();
        std::fs::create_dir_all(&containers).unwrap();
        std::os::unix::fs::symlink(pods.join("ns_a_uid-1/c/0.log"), containers.join("a.log"))
            .unwrap();
        std::os::unix::fs::symlink(pods.join("ns_b_uid-2/c/0.log"), containers.join("b.log"))
            .unwrap();
        remove_pod_logs_in(&pods, &containers, &["uid-1".to_string()]);
        assert!(!pods.join("ns_a_uid-1").exists());
        assert!(pods.join("ns_b_uid-2").exists());
        assert!(std::fs::symlink_metadata(containers.join("a.log")).is_err());
        assert!(std::fs::symlink_metadata(containers.join("b.log")).is_ok());
    }

    #[test]
    fn nothing_is_mounted_below_a_fresh_dir() {
        let d = tempfile::tempdir().unwrap();
        assert!(mounts_below(d.path()).is_empty());
        assert!(mounts_below(Path::new("/")).contains(&PathBuf::from("/")));
    }
}
