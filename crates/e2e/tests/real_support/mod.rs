//! What the real-Kubernetes e2e tests (`real_*.rs`) share: our binaries as host processes,
//! waiting with the components' logs at hand, and mountinfo.
// Each test binary uses a part of this module.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long one step may take before the test fails with the logs' ends.
pub const PATIENCE: Duration = Duration::from_secs(90);

/// `path`'s line in /proc/self/mountinfo when it is a mount point.
pub fn mountinfo_line(path: &Path) -> Option<String> {
    let want = path.to_str()?;
    std::fs::read_to_string("/proc/self/mountinfo")
        .ok()?
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(want))
        .map(str::to_owned)
}

/// A child process killed (SIGKILL) and reaped on drop, also when an assertion fails.
pub struct ChildGuard(pub Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A workspace binary beside the test executable (scripts/test builds every binary).
pub fn workspace_bin(name: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    Some(exe.parent()?.parent()?.join(name)).filter(|p| p.exists())
}

/// Starts `bin` with `args`, stdout and stderr to `log`.
pub fn spawn(bin: &Path, args: &[String], log: &Path) -> ChildGuard {
    let log = std::fs::File::create(log).unwrap();
    ChildGuard(
        Command::new(bin)
            .args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display())),
    )
}

/// `probe`'s first `Some` within `timeout`, polled every 250 ms; on time-out, panics with
/// `what` and the logs `logs` names (the end of each).
pub async fn eventually<T, F, Fut, P>(what: &str, logs: &[P], mut probe: F) -> T
where
    P: AsRef<Path>,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        if Instant::now() >= deadline {
            let tails: Vec<String> = logs
                .iter()
                .map(|p| {
                    let p = p.as_ref();
                    let text = std::fs::read_to_string(p).unwrap_or_default();
                    let lines: Vec<&str> = text.lines().collect();
                    format!(
                        "--- {} ---\n{}",
                        p.display(),
                        lines[lines.len().saturating_sub(25)..].join("\n")
                    )
                })
                .collect();
            panic!(
                "timed out after {PATIENCE:?} waiting for {what}\n{}",
                tails.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Whether `path` is a mount point.
pub fn is_mount_point(path: &Path) -> bool {
    mountinfo_line(path).is_some()
}

/// A file of this repository (deploy/ manifests), by its path from the root.
pub fn repo_file(rel: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The workspace binaries `names`, in order; when one is not built, says which through
/// `test_support::skip_or_fail` (a failure under CSI_RS_REQUIRE_ALL) and gives `None`.
pub fn bins_or_skip<const N: usize>(names: [&str; N]) -> Option<[PathBuf; N]> {
    let found = names.map(workspace_bin);
    let missing: Vec<&str> = names
        .iter()
        .zip(&found)
        .filter(|(_, p)| p.is_none())
        .map(|(n, _)| *n)
        .collect();
    if !missing.is_empty() {
        test_support::skip_or_fail(&format!(
            "workspace binaries not built: {} (cargo build --workspace --bins)",
            missing.join(", ")
        ));
        return None;
    }
    Some(found.map(|p| p.expect("checked above: none is missing")))
}

/// Whether loop devices can be had (the embedded EC2 backs volumes with them); says why not
/// through `test_support::skip_or_fail`.
pub fn loop_devices_or_skip() -> bool {
    let ok = Path::new("/dev/loop-control").exists();
    if !ok {
        test_support::skip_or_fail(
            "no /dev/loop-control: the embedded EC2 backs volumes with loop devices",
        );
    }
    ok
}

/// The pod `name` once its Ready condition is True (see [`eventually`]).
pub async fn ready_pod<P: AsRef<Path>>(
    pods: &kube::Api<k8s_openapi::api::core::v1::Pod>,
    name: &str,
    logs: &[P],
) -> k8s_openapi::api::core::v1::Pod {
    eventually(&format!("pod {name} Ready"), logs, || async move {
        let p = pods.get(name).await.ok()?;
        p.status
            .as_ref()?
            .conditions
            .as_ref()?
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
            .then_some(p)
    })
    .await
}
