//! What the real-Kubernetes tests of several crates share around a [`Cluster`](crate::Cluster):
//! our own binaries as host processes ([`workspace_bin`], [`bins_or_skip`], [`spawn_component`]
//! on ports [`free_ports`] found), waiting with their logs' ends in the failure
//! ([`eventually_with_logs`]); objects made from JSON are `test_support::objects::create_json`.
//! Test helpers: where the cluster's API returns [`Error`](crate::Error), these panic (a failed
//! test) or skip through `test_support::skip_or_fail`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub use crate::process::free_ports;

pub use test_support::process::ChildGuard;

/// Starts `bin` with `args`, stdin from /dev/null, stdout and stderr to `log`; panics when it
/// cannot.
pub fn spawn_component(bin: &Path, args: &[String], log: &Path) -> ChildGuard {
    let out =
        std::fs::File::create(log).unwrap_or_else(|e| panic!("creating {}: {e}", log.display()));
    let err = out
        .try_clone()
        .unwrap_or_else(|e| panic!("opening {}: {e}", log.display()));
    ChildGuard(
        Command::new(bin)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display())),
    )
}

/// A workspace binary beside the test executable (`target/<profile>/<name>`: scripts/test
/// builds every binary), when it is built.
pub fn workspace_bin(name: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    Some(exe.parent()?.parent()?.join(name)).filter(|p| p.exists())
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
    Some(found.map(|p| p.unwrap_or_default()))
}

/// `probe`'s first `Some` within `patience`, polled every 200 ms; on time-out, panics with
/// `what` and the last 30 lines of each log in `logs`.
pub async fn eventually_with_logs<T, F, Fut, P>(
    what: &str,
    patience: Duration,
    logs: &[P],
    mut probe: F,
) -> T
where
    P: AsRef<Path>,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + patience;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        if Instant::now() >= deadline {
            let tails: Vec<String> = logs
                .iter()
                .map(|p| {
                    let p = p.as_ref();
                    format!("--- {} ---\n{}", p.display(), crate::process::tail(p, 30))
                })
                .collect();
            panic!(
                "timed out after {patience:?} waiting for {what}\n{}",
                tails.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Panics listing every key whose value differs between what kcm's run recorded and what ours
/// did (a key one side lacks is `null` there), leaving out the keys `skip` holds for: the
/// check of a component that must write what kube-controller-manager writes.
pub fn assert_same_as_kcm(
    kcm: &BTreeMap<String, Value>,
    ours: &BTreeMap<String, Value>,
    skip: impl Fn(&str) -> bool,
) {
    let keys: BTreeSet<&String> = kcm.keys().chain(ours.keys()).collect();
    let differ: Vec<String> = keys
        .into_iter()
        .filter(|k| !skip(k) && kcm.get(*k) != ours.get(*k))
        .map(|k| {
            let of = |m: &BTreeMap<String, Value>| m.get(k).unwrap_or(&Value::Null).to_string();
            format!("{k}:\n  kcm:  {}\n  ours: {}", of(kcm), of(ours))
        })
        .collect();
    assert!(
        differ.is_empty(),
        "ours differs from kcm's in {} place(s):\n{}",
        differ.len(),
        differ.join("\n")
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_records_pass_and_a_difference_is_listed() {
        let kcm: BTreeMap<String, Value> =
            [("a".into(), Value::from(1)), ("b".into(), Value::from("x"))].into();
        assert_same_as_kcm(&kcm, &kcm.clone(), |_| false);
        let mut ours = kcm.clone();
        ours.insert("b".into(), Value::from("y"));
        ours.insert("skip/me".into(), Value::from(true));
        assert_same_as_kcm(&kcm, &ours, |k| k == "b" || k.starts_with("skip/"));
        let message = std::panic::catch_unwind(|| assert_same_as_kcm(&kcm, &ours, |_| false))
            .unwrap_err()
            .downcast::<String>()
            .unwrap();
        assert!(message.contains("in 2 place(s)"), "{message}");
        assert!(
            message.contains("b:\n  kcm:  \"x\"\n  ours: \"y\""),
            "{message}"
        );
        assert!(
            message.contains("skip/me:\n  kcm:  null\n  ours: true"),
            "{message}"
        );
    }

    #[test]
    fn a_guarded_child_is_killed_and_its_output_logged() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("sh.log");
        let guard = spawn_component(
            Path::new("/bin/sh"),
            &["-c".into(), "echo out; echo err >&2; exec sleep 60".into()],
            &log,
        );
        let pid = guard.0.id();
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::fs::read_to_string(&log).unwrap() != "out\nerr\n" {
            assert!(Instant::now() < deadline, "{log:?}: no output");
            std::thread::sleep(Duration::from_millis(20));
        }
        drop(guard);
        // Killed and reaped: no zombie left under its pid.
        assert!(!Path::new(&format!("/proc/{pid}")).exists());
        assert_eq!(workspace_bin("no-such-binary-in-this-workspace"), None);
    }

    #[tokio::test]
    async fn a_time_out_names_what_and_shows_the_logs_ends() {
        let dir = tempfile::tempdir().unwrap();
        let logs = [dir.path().join("c.log")];
        std::fs::write(&logs[0], "first\nlast words\n").unwrap();
        let header = format!("--- {} ---\nfirst\nlast words", logs[0].display());
        let never = async move {
            let patience = Duration::from_millis(300);
            eventually_with_logs("never", patience, &logs, || async { None::<()> }).await
        };
        let panic = tokio::spawn(never).await.unwrap_err().into_panic();
        let msg = panic.downcast_ref::<String>().unwrap();
        assert!(
            msg.contains("waiting for never") && msg.contains(&header),
            "{msg}"
        );
    }
}
