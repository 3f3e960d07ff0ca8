//! One scenario (or one idle cluster) in a `csi-bench stack` child process: the whole stack
//! runs in one process, and an allocator keeps what a stopped cluster freed, so a second
//! cluster in the same process would report the first one's memory as its own.

use crate::harness::cli::Named as _;
use std::path::Path;
use std::process::Stdio;

use rustix::process::{Pid, Signal, kill_process};
use serde::Deserialize;
use tokio::io::AsyncReadExt as _;
use tokio_util::sync::CancellationToken;

use super::report::{Report, ScenarioReport};
use super::scenarios::Scenario;
use super::{Flags, timing_name};
use cluster::Error;

/// Runs `csi-bench stack ARGS --output json` with the parent's measurement flags; its
/// progress goes to our stderr, its stdout (the JSON report) is returned with its success. On
/// `shutdown` the child gets SIGTERM (it then drops its cluster, which cleans up below its
/// dir) and is waited for.
async fn child(
    flags: &Flags,
    dir: &Path,
    args: &[String],
    shutdown: &CancellationToken,
) -> Result<(bool, String), Error> {
    let exe = std::env::current_exe()
        .map_err(|e| Error::io("finding this program", "/proc/self/exe", e))?;
    let mut child = tokio::process::Command::new(&exe)
        .arg("stack")
        .args(["--pods", &flags.pods.to_string()])
        .args(["--nodes", &flags.nodes.to_string()])
        .args(["--timing", timing_name(flags.timing)])
        .args(["--timeout", &flags.timeout.to_string()])
        .args(flags.sequential.then_some("--sequential"))
        .args(["--output", "json", "--data-dir"])
        .arg(dir)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| Error::io("running a bench child process", &exe, e))?;
    let mut stdout = child
        .stdout
        .take()
        .ok_or_else(|| Error::start("a bench child process", "no stdout pipe"))?;
    let read = async {
        let mut text = String::new();
        stdout.read_to_string(&mut text).await.map(|_| text)
    };
    let wait = async {
        tokio::select! {
            status = child.wait() => status,
            () = shutdown.cancelled() => {
                if let Some(pid) = child.id().and_then(|p| Pid::from_raw(p as i32)) {
                    let _ = kill_process(pid, Signal::TERM);
                }
                child.wait().await
            }
        }
    };
    let (text, status) = tokio::join!(read, wait);
    let status = status.map_err(|e| Error::io("waiting for a bench child process", &exe, e))?;
    let text = text.map_err(|e| Error::io("reading a bench child's report", &exe, e))?;
    Ok((status.success(), text))
}

/// Scenario `s` in a child process on `dir` (its logs stay in `dir/logs`).
pub(crate) async fn scenario(
    flags: &Flags,
    s: Scenario,
    dir: &Path,
    shutdown: &CancellationToken,
) -> ScenarioReport {
    let failed = |why: String| ScenarioReport {
        scenario: s.name().into(),
        class: s.class().into(),
        note: Some(format!("failed: {why}")),
        ..ScenarioReport::default()
    };
    let (ok, stdout) = match child(
        flags,
        dir,
        &["--scenario".into(), s.name().into()],
        shutdown,
    )
    .await
    {
        Ok(r) => r,
        Err(e) => return failed(e.to_string()),
    };
    // A failed scenario still prints its report (with the failure in its note).
    match serde_json::from_str::<Report>(&stdout) {
        Ok(mut r) if r.scenarios.len() == 1 => r.scenarios.remove(0),
        Ok(r) => failed(format!(
            "the child reported {} scenarios, not 1",
            r.scenarios.len()
        )),
        Err(e) if ok => failed(format!("the child's report is not JSON ({e}): {stdout}")),
        Err(_) => failed(format!(
            "the child process failed (its stderr is above): {stdout}"
        )),
    }
}

#[derive(Deserialize)]
struct Idle {
    idle_rss_mib: f64,
}

/// Idle VmRSS (MiB) of a ready `nodes`-node cluster, in a child process on `dir`.
pub(crate) async fn idle_rss(
    flags: &Flags,
    nodes: usize,
    dir: &Path,
    shutdown: &CancellationToken,
) -> Result<f64, Error> {
    let (ok, stdout) = child(
        flags,
        dir,
        &["--idle-nodes".into(), nodes.to_string()],
        shutdown,
    )
    .await?;
    match serde_json::from_str::<Idle>(&stdout) {
        Ok(i) if ok => Ok(i.idle_rss_mib),
        _ => Err(Error::Start {
            component: format!("the bench's idle {nodes}-node cluster"),
            reason: format!("the child process failed (its stderr is above): {stdout}"),
        }),
    }
}
