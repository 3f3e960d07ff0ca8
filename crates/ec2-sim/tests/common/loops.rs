//! Helpers of the loop-device tests: whether they can run, which loop devices serve an image,
//! and cleanup guards for a failing test.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Why the loop tests cannot run here, if they cannot.
pub fn skip_reason() -> Option<String> {
    // /proc/self/status carries the effective UID (no libc call needed).
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let euid = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(2))
        .unwrap_or("");
    if euid != "0" {
        return Some(format!("not root (euid {euid})"));
    }
    if !Path::new("/dev/loop-control").exists() {
        return Some("no /dev/loop-control".into());
    }
    for tool in ["losetup", "mkfs.ext4", "mount", "umount"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if !found {
            return Some(format!("{tool} not on PATH"));
        }
    }
    None
}

/// The loop devices whose backing file is `image` (`losetup -j`).
pub fn loops_of(image: &Path) -> Vec<String> {
    let out = Command::new("losetup")
        .arg("-j")
        .arg(image)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split(':').next().map(str::to_string))
        .collect()
}

/// The backing file a loop device serves now (empty once it is free).
pub fn backing_of(loop_dev: &Path) -> String {
    let name = loop_dev.file_name().unwrap().to_string_lossy().to_string();
    std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

pub async fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Detaches every loop device of an image on drop (a crashed simulator's leftovers).
pub struct LoopCleanup(pub PathBuf);

impl Drop for LoopCleanup {
    fn drop(&mut self) {
        for dev in loops_of(&self.0) {
            let _ = Command::new("losetup").arg("-d").arg(&dev).status();
        }
    }
}

/// Detaches the loop devices of every image in `STATE/volumes` on drop: for tests that learn
/// their volume IDs only after the guard must exist (declared before a child process, so that
/// the child is killed first).
pub struct VolumesCleanup(pub PathBuf);

impl Drop for VolumesCleanup {
    fn drop(&mut self) {
        let Ok(entries) = std::fs::read_dir(self.0.join("volumes")) else {
            return;
        };
        for image in entries.flatten().map(|e| e.path()) {
            drop(LoopCleanup(image));
        }
    }
}
