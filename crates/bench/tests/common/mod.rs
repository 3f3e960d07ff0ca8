//! What the scenario tests share: stand-in processes, the binaries under test, and the check
//! that a stopped process is gone.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// An executable shell script `dir/name` running `body`: a stand-in for a component that
/// exits, hangs or never watches, as a broken one would.
pub fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// The target dir's `debug/`: `$CARGO_TARGET_DIR/debug`, else the directory above this test
/// binary (`target/debug/deps/..`).
pub fn debug_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        let d = PathBuf::from(dir).join("debug");
        if d.is_dir() {
            return d;
        }
    }
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

/// A binary named by `var`, else `name` in the target dir's `debug/`.
pub fn binary(var: &str, name: &str) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(var) {
        let p = PathBuf::from(p);
        assert!(p.exists(), "{var}={} does not exist", p.display());
        return Some(p);
    }
    Some(debug_dir().join(name)).filter(|p| p.exists())
}

/// Waits until process `pid` is gone (reaped, or a zombie for a moment), at most 10 s.
pub async fn assert_gone(pid: u32, what: &str) {
    let alive = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|stat| !stat.contains(") Z "))
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(pid) {
        assert!(Instant::now() < deadline, "{what} {pid} still runs");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
