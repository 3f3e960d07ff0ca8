//! A `--driver` plugin as a supervised child process: `sh -c COMMAND` in a process group of its
//! own (so a driver's own children get the signals too), output appended to its log file.
//! One run of the supervisor's factory waits on the child: a child that exits is a failed
//! run, restarted with the supervisor's back-off. Stopping sends SIGTERM to the group, then
//! SIGKILL after [`GRACE`]; a run dropped where it stands (`kill`, an `up` that failed
//! half-way, a panic) SIGKILLs the group and reaps the child in its `Drop`.

use std::fs::OpenOptions;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use rustix::process::{Pid, Signal, kill_process_group};
use tokio_util::sync::CancellationToken;

use crate::supervisor::{Factory, RunResult};

/// How long a plugin may take to exit after SIGTERM (the kubelet's default grace period is 30
/// s; a CSI driver only has to close its socket).
const GRACE: Duration = Duration::from_secs(10);

/// What one plugin process runs with.
#[derive(Debug, Clone)]
pub(crate) struct Child {
    /// For messages: `x.example.com (node plugin on node-1)`.
    pub(crate) what: String,
    /// The shell command, placeholders replaced.
    pub(crate) command: String,
    pub(crate) env: Vec<(String, String)>,
    /// The socket the plugin binds: a stale one is removed before each start and after stop.
    pub(crate) socket: PathBuf,
    pub(crate) log: PathBuf,
}

/// The supervisor's factory for `child`.
pub(crate) fn child_factory(child: Child) -> Factory {
    let child = Arc::new(child);
    Arc::new(move |stop: CancellationToken| {
        let child = child.clone();
        Box::pin(async move { run(&child, stop).await })
    })
}

/// Kills and reaps the process group unless the child was reaped already.
struct Running {
    child: tokio::process::Child,
    group: Option<Pid>,
    reaped: bool,
}

impl Running {
    fn signal(&self, signal: Signal) {
        if let Some(group) = self.group {
            // ESRCH: the group is gone already, which is what we want.
            let _ = kill_process_group(group, signal);
        }
    }

    /// SIGTERM, then SIGKILL after the grace period; returns how the child ended.
    async fn terminate(&mut self) -> String {
        self.signal(Signal::TERM);
        let status = match tokio::time::timeout(GRACE, self.child.wait()).await {
            Ok(status) => status,
            Err(_) => {
                self.signal(Signal::KILL);
                self.child.wait().await
            }
        };
        self.reaped = true;
        // Whatever the plugin started and left behind in its group.
        self.signal(Signal::KILL);
        match status {
            Ok(s) => s.to_string(),
            Err(e) => format!("not reaped: {e}"),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.reaped {
            return;
        }
        self.signal(Signal::KILL);
        // SIGKILL takes effect at once; reap it here so no zombie outlives the run.
        for _ in 0..100 {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        tracing::warn!("a driver process did not exit within 1 s of SIGKILL");
    }
}

async fn run(c: &Child, stop: CancellationToken) -> RunResult {
    remove_socket(c);
    let mut log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&c.log)
        .map_err(|e| format!("{}: opening its log {}: {e}", c.what, c.log.display()))?;
    // The log is appended across restarts; a header says where each run starts.
    let _ = writeln!(
        log,
        "--- csi-cluster {}: starting sh -c {:?}",
        jiff::Timestamp::now(),
        c.command
    );
    let stderr = log
        .try_clone()
        .map_err(|e| format!("{}: {}: {e}", c.what, c.log.display()))?;
    let child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(&c.command)
        .envs(c.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(stderr)
        .process_group(0)
        .spawn()
        .map_err(|e| format!("{}: starting sh -c {:?}: {e}", c.what, c.command))?;
    let group = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .and_then(Pid::from_raw);
    tracing::info!(plugin = %c.what, pid = ?group, "started");
    let mut running = Running {
        child,
        group,
        reaped: false,
    };
    let result = tokio::select! {
        status = running.child.wait() => {
            running.reaped = true;
            // Its own children may still hold the socket.
            running.signal(Signal::KILL);
            let status = status.map_or_else(|e| e.to_string(), |s| s.to_string());
            Err(format!("{} exited ({status}); its output is in {}", c.what, c.log.display()))
        }
        () = stop.cancelled() => {
            let status = running.terminate().await;
            tracing::info!(plugin = %c.what, %status, "stopped");
            Ok(())
        }
    };
    remove_socket(c);
    result
}

/// Removes the plugin's socket file if one is there (a killed plugin leaves it; many drivers
/// refuse to start on an existing path).
fn remove_socket(c: &Child) {
    use std::os::unix::fs::FileTypeExt as _;
    if std::fs::symlink_metadata(&c.socket).is_ok_and(|m| m.file_type().is_socket()) {
        let _ = std::fs::remove_file(&c.socket);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn child(dir: &std::path::Path, command: &str) -> Child {
        Child {
            what: "test plugin".into(),
            command: command.into(),
            env: vec![("CSI_ENDPOINT".into(), "unix:///nowhere".into())],
            socket: dir.join("csi.sock"),
            log: dir.join("plugin.log"),
        }
    }

    fn alive(pid: &str) -> bool {
        // A zombie is not alive: it has exited and only waits to be reaped.
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| s.split(") ").nth(1).is_some_and(|r| !r.starts_with('Z')))
    }

    async fn pids(log: &std::path::Path, n: usize) -> Vec<String> {
        for _ in 0..200 {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let found: Vec<String> = text
                .lines()
                .filter_map(|l| l.strip_prefix("pid "))
                .map(str::to_string)
                .collect();
            if found.len() >= n {
                return found;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("no pids in {}", log.display());
    }

    /// Waits (up to 5 s) until none of `pids` runs.
    async fn gone(pids: &[String]) {
        for _ in 0..250 {
            if pids.iter().all(|p| !alive(p)) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("{pids:?} still alive");
    }

    #[tokio::test]
    async fn stop_terminates_the_whole_group_and_an_exit_is_a_failed_run() {
        let dir = tempfile::tempdir().unwrap();
        // The shell and a grandchild: both must go on stop.
        let c = child(
            dir.path(),
            "echo $CSI_ENDPOINT; sleep 300 & echo pid $!; echo pid $$; wait",
        );
        let stop = CancellationToken::new();
        let task = tokio::spawn({
            let (c, stop) = (c.clone(), stop.clone());
            async move { run(&c, stop).await }
        });
        let found = pids(&c.log, 2).await;
        assert!(found.iter().all(|p| alive(p)), "{found:?}");
        stop.cancel();
        let result = tokio::time::timeout(Duration::from_secs(20), task)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(result, Ok(()));
        // kill(2) returns before the signalled process is gone: give the grandchild a moment.
        gone(&found).await;
        let log = std::fs::read_to_string(&c.log).unwrap();
        assert!(log.contains("unix:///nowhere"), "{log}");

        let failing = child(dir.path(), "echo bye; exit 3");
        let e = run(&failing, CancellationToken::new()).await.unwrap_err();
        assert!(e.contains("exit status: 3"), "{e}");
        assert!(e.contains("plugin.log"), "{e}");
    }

    #[tokio::test]
    async fn a_dropped_run_kills_the_group() {
        let dir = tempfile::tempdir().unwrap();
        let c = child(dir.path(), "sleep 300 & echo pid $!; echo pid $$; wait");
        let task = tokio::spawn({
            let c = c.clone();
            async move { run(&c, CancellationToken::new()).await }
        });
        let found = pids(&c.log, 2).await;
        task.abort();
        let _ = task.await;
        gone(&found).await;
    }
}
