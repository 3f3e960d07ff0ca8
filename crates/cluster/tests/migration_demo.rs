//! `csi-cluster demo migration`, the real binary, to its end: the upgrade and downgrade of
//! the migration design (docs/design/migration.md) with every step's path in its output, nothing
//! left below its data dir; and its refusal to run without root.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// With realistic EC2 timing (attach and detach of seconds each) the demo takes ~40 s on an
/// idle machine; a loaded one gets this much.
const LIMIT: Duration = Duration::from_secs(115);

/// Unmounts and releases whatever a failed demo left below its data dir.
struct Cleanup(std::path::PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        test_support::unmount_all_below(&self.0);
        for (dev, _) in common::loop_devices_below(&self.0) {
            let _ = Command::new("losetup").arg("-d").arg(dev).status();
        }
    }
}

/// The table line of a step: its title, then the path per operation.
fn table_line<'a>(out: &'a str, title: &str) -> Vec<&'a str> {
    let line = out
        .lines()
        .rev()
        .find(|l| l.starts_with(title) && l[title.len()..].starts_with("  "))
        .unwrap_or_else(|| panic!("no table line for {title:?}:\n{out}"));
    line[title.len()..].split_whitespace().collect()
}

#[test]
fn demo_migration_walks_seed_003_and_leaves_nothing() {
    if !common::can_run() {
        return;
    }
    let work = tempfile::Builder::new()
        .prefix("csi-migd-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let data = work.path().join("d");
    let _cleanup = Cleanup(data.clone());
    let (stdout, stderr) = (work.path().join("out"), work.path().join("err"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_csi-cluster"))
        // Realistic timing: the in-tree detach is still waiting for EC2 when the CSI attach of
        // the next step begins, which once made the attach/detach controller delete the new
        // VolumeAttachment (fast timing hides that window).
        .args(["demo", "migration", "--timing", "realistic", "--data-dir"])
        .arg(&data)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout).unwrap())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if started.elapsed() > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let out = std::fs::read_to_string(&stdout).unwrap();
    let err = std::fs::read_to_string(&stderr).unwrap();
    let status = status.unwrap_or_else(|| panic!("not done after {LIMIT:?}:\n{out}\n{err}"));
    assert!(status.success(), "{status}:\n{out}\n{err}");
    assert!(out.contains(cluster::demo::migration::DONE_LINE), "{out}");
    assert!(
        !out.contains("BOTH"),
        "an operation done by both paths:\n{out}"
    );
    // The migration design's sequence, each step's paths: provision attach mount unmount detach
    // delete data.
    let row = |t| table_line(&out, t);
    assert_eq!(
        row("in-tree everywhere"),
        [
            "in-tree", "in-tree", "in-tree", "-", "-", "-", "read", "back"
        ]
    );
    assert_eq!(
        row("controller migrated"),
        ["-", "-", "-", "-", "-", "-", "read", "back"]
    );
    assert_eq!(row("node drained")[3..5], ["in-tree", "in-tree"]);
    assert_eq!(row("CSI everywhere")[..3], ["-", "CSI", "CSI"]);
    assert_eq!(row("node drained (CSI)")[3..5], ["CSI", "CSI"]);
    assert_eq!(
        row("in-tree again (controller still migrated)")[..3],
        ["-", "in-tree", "in-tree"]
    );
    assert_eq!(row("cleaned up")[3..6], ["in-tree", "in-tree", "in-tree"]);
    assert_eq!(out.matches("data intact:").count(), 5, "{out}");
    assert!(out.contains("VolumeAttachments: csi-"), "{out}");
    assert!(
        common::mounts_below(&data).is_empty(),
        "{:?}",
        common::mounts_below(&data)
    );
    assert!(common::loop_devices_below(&data).is_empty());
    assert!(common::sockets_below(&data).is_empty());
}

#[test]
fn demo_migration_needs_root() {
    if !common::can_run() {
        return;
    }
    // As nobody: refused before anything starts, saying why.
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_csi-cluster"))
        .args(["demo", "migration"])
        .output();
    let Ok(out) = out else {
        test_support::skip_or_fail("needs setpriv (util-linux)");
        return;
    };
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("root"), "{err}");
}
