//! Dev-only helpers shared by the workspace's tests.
//!
//! A test that needs a part of the machine (root, loop devices, `moto_server`, kubectl 1.20,
//! the shared translation vectors, a built binary) calls [`skip_or_fail`] when the part is
//! missing and then returns. On a developer's machine that prints `SKIPPED: <reason>` and
//! the test passes; under `CSI_RS_REQUIRE_ALL=1`, which `scripts/test` (and so CI) exports,
//! it panics with the reason, so a green run proves every real-part test really ran.
//!
//! The one skip allowed everywhere (see docs/contributing.md) is online ext4 growth, which
//! needs `CAP_SYS_RESOURCE`: sandboxes drop it. Tests find that out with [`has_capability`]
//! (the `CapEff` mask of `/proc/self/status`), never from a command that failed.

pub mod csi_sanity;
pub mod net;
pub mod objects;
pub mod process;
mod task;

pub use task::ComponentTask;

/// The environment variable that turns every skip into a failure.
pub const REQUIRE_ALL: &str = "CSI_RS_REQUIRE_ALL";

/// `CAP_SYS_RESOURCE` (linux/capability.h): ext4 online resize needs it to use reserved
/// blocks while it grows the filesystem.
pub const CAP_SYS_RESOURCE: u32 = 24;

/// Whether `CSI_RS_REQUIRE_ALL` asks for every test to run (set, and not empty or `0`).
pub fn require_all() -> bool {
    std::env::var(REQUIRE_ALL).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// A test cannot run because `reason`: a failure (panic) under `CSI_RS_REQUIRE_ALL`,
/// otherwise `SKIPPED: reason` on stderr. The caller returns right after.
#[track_caller]
pub fn skip_or_fail(reason: &str) {
    if require_all() {
        panic!("{REQUIRE_ALL} is set (scripts/test, CI), so this test may not skip: {reason}");
    }
    eprintln!("SKIPPED: {reason}");
}

/// Whether this process has the Linux capability `bit` in its effective set (`CapEff` in
/// `/proc/self/status`). `false` when the file cannot be read or parsed.
pub fn has_capability(bit: u32) -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| cap_eff_has(&s, bit))
}

fn cap_eff_has(status: &str, bit: u32) -> bool {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|mask| bit < 64 && mask & (1u64 << bit) != 0)
}

/// With `RUST_LOG` set, the components a test runs in-process log to stderr (once per
/// process; nextest shows it for a failing test). Without it, nothing is logged.
pub fn init_tracing() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    if std::env::var_os("RUST_LOG").is_some() {
        ONCE.call_once(|| telemetry::init_logging(0));
    }
}

/// Polls `check` every 20 ms until it returns `Some`, and panics naming `what` once `patience`
/// has passed: how tests wait for a controller to reach a state they then assert on.
pub async fn eventually<T, F, Fut>(what: &str, patience: std::time::Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {patience:?} waiting for: {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// What is mounted and which loop devices are backed by files at or below a dir: what a test
/// asserts is empty once the code under test cleaned up (mount-utils' own, which csi-cluster
/// and the benchmarks clean up with).
pub use mount_utils::below::{loop_devices_below, mounts_below};

/// Whether this machine can run a whole csi-cluster (root, loop devices, kubectl on PATH);
/// [`skip_or_fail`] says why not.
pub fn can_run_cluster() -> bool {
    let root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        })
        .unwrap_or(false);
    if !root || !std::path::Path::new("/dev/loop-control").exists() {
        skip_or_fail("csi-cluster needs root and loop devices (/dev/loop-control)");
        return false;
    }
    let kubectl = std::process::Command::new("kubectl")
        .args(["version", "--client"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
    if !kubectl.is_ok_and(|s| s.success()) {
        skip_or_fail("needs kubectl on PATH");
        return false;
    }
    true
}

/// Unmounts (deepest first, lazily if busy) everything mounted at or below `dir`: for `Drop` guards of
/// tests that mount, so a failed assertion leaves nothing mounted. Synchronous, since `Drop`
/// cannot await; errors are ignored (there is nothing left to do with them).
pub fn unmount_all_below(dir: &std::path::Path) {
    mount_utils::below::unmount_below(dir);
}

/// Every loop device and its backing file (`losetup --list`); empty if losetup fails.
pub fn loop_devices() -> Vec<(String, std::path::PathBuf)> {
    let Ok(out) = std::process::Command::new("losetup")
        .args([
            "--list",
            "--noheadings",
            "--raw",
            "--output",
            "NAME,BACK-FILE",
        ])
        .output()
    else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (dev, file) = l.split_once(' ')?;
            Some((dev.to_string(), std::path::PathBuf::from(file.trim())))
        })
        .collect()
}

/// Unmounts (lazily) every mount whose source is `device`; errors are ignored, as in
/// [`unmount_all_below`].
pub fn unmount_device(device: &str) {
    let Ok(bytes) = std::fs::read("/proc/self/mountinfo") else {
        return;
    };
    let Ok(table) = mount_utils::findmnt::parse(&bytes) else {
        return;
    };
    for e in table.into_iter().filter(|e| e.source == device) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&e.mount_point)
            .status();
    }
}

/// Debian's kubectl 1.20 (`kubernetes-client`, the one a machine without kubectl gets), which
/// `scripts/setup` unpacks into `~/.cache/csi-rs-kubectl-1.20` beside the kubectl on PATH
/// (`CSI_RS_KUBECTL_1_20` overrides where). `None`, after [`skip_or_fail`] saying why, when it
/// is not there. Panics when the binary there is not a 1.20 client.
pub fn kubectl_1_20() -> Option<std::path::PathBuf> {
    let bin = std::env::var_os("CSI_RS_KUBECTL_1_20")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| {
                std::path::PathBuf::from(h).join(".cache/csi-rs-kubectl-1.20/usr/bin/kubectl")
            })
        })
        .filter(|b| b.is_file());
    let Some(bin) = bin else {
        skip_or_fail("Debian's kubectl 1.20 is not unpacked (scripts/setup does it)");
        return None;
    };
    let version = std::process::Command::new(&bin)
        .args(["version", "--client", "--short"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_else(|e| panic!("running {}: {e}", bin.display()));
    assert!(
        version.contains("v1.20."),
        "{} is not kubectl 1.20: {version}",
        bin.display()
    );
    Some(bin)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_eff_mask_is_read_bit_by_bit() {
        // Full root set (bits 0..=40) has bit 24; a docker-like default set does not.
        let full = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\n";
        assert!(cap_eff_has(full, CAP_SYS_RESOURCE));
        let docker = "CapEff:\t00000000a80425fb\n";
        assert!(!cap_eff_has(docker, CAP_SYS_RESOURCE));
        assert!(cap_eff_has(docker, 0));
        assert!(!cap_eff_has("CapEff:\tzz\n", 0));
        assert!(!cap_eff_has("no such line\n", 0));
        assert!(!cap_eff_has(full, 64));
    }

    #[test]
    fn this_process_reports_its_capabilities() {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let mask = status
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .map(|h| u64::from_str_radix(h.trim(), 16).unwrap())
            .unwrap();
        for bit in 0..64 {
            assert_eq!(has_capability(bit), mask & (1 << bit) != 0, "bit {bit}");
        }
    }

    #[test]
    fn skip_or_fail_follows_the_environment() {
        // Run the decision in a child process so this test does not depend on (or change)
        // this process's environment.
        let exe = std::env::current_exe().unwrap();
        let run = |value: Option<&str>| {
            let mut c = std::process::Command::new(&exe);
            c.args(["--exact", "tests::child_skips", "--nocapture"])
                .env("TEST_SUPPORT_CHILD", "1");
            match value {
                Some(v) => c.env(REQUIRE_ALL, v),
                None => c.env_remove(REQUIRE_ALL),
            };
            c.output().unwrap()
        };
        let relaxed = run(None);
        assert!(relaxed.status.success());
        assert!(String::from_utf8_lossy(&relaxed.stderr).contains("SKIPPED: part X missing"));
        let zero = run(Some("0"));
        assert!(zero.status.success());
        let strict = run(Some("1"));
        assert!(!strict.status.success());
        let out = String::from_utf8_lossy(&strict.stdout).into_owned()
            + &String::from_utf8_lossy(&strict.stderr);
        assert!(
            out.contains("CSI_RS_REQUIRE_ALL is set") && out.contains("part X missing"),
            "{out}"
        );
    }

    /// The child half of `skip_or_fail_follows_the_environment`; a no-op when run directly.
    #[test]
    fn child_skips() {
        if std::env::var_os("TEST_SUPPORT_CHILD").is_some() {
            skip_or_fail("part X missing");
        }
    }
}
