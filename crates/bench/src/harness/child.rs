//! A process under test: spawned with its output appended to a log file, its peak RSS (VmHWM)
//! and CPU time sampled in the background (so they survive the process dying on its own),
//! stopped with SIGTERM (SIGKILL after a grace period), and killed and reaped when dropped, so
//! a failed or interrupted run leaves nothing running and nothing racing its clean-up.
//!
//! [`during`] runs a phase of a scenario against its children: it ends with the phase's result,
//! an error with every child's log when one exits, or an error with the progress and the logs
//! when the deadline passes, instead of a long wait for a process that is gone.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::process::Command;
use tokio::task::JoinHandle;

use crate::Error;
use crate::harness::procfs::{self, Memory};

/// How often peak RSS and CPU time are sampled. VmHWM is already a high-water mark; sampling
/// only keeps the last value if the process dies on its own.
const SAMPLE_EVERY: Duration = Duration::from_millis(250);
/// How long SIGTERM gets before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// Log lines of each child shown with an error.
pub const TAIL_LINES: usize = 25;

/// What was measured of a process by the time it stopped.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessStats {
    pub peak_rss_bytes: Option<u64>,
    pub cpu: Option<Duration>,
}

/// One running child. Dropping it kills it.
pub struct Child {
    name: String,
    child: tokio::process::Child,
    pid: u32,
    bin: PathBuf,
    log: PathBuf,
    peak_rss: Arc<AtomicU64>,
    cpu_micros: Arc<AtomicU64>,
    sampler: JoinHandle<()>,
}

impl Child {
    /// Starts `bin args...` (with `envs` added) as `name`, stdout and stderr appended to `log`.
    pub fn spawn(
        name: impl Into<String>,
        bin: &Path,
        args: &[String],
        envs: &[(&str, String)],
        log: &Path,
    ) -> Result<Self, Error> {
        let name = name.into();
        let io = |op: String| move |source| Error::Io { op, source };
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(io(format!("opening {name}'s log {}", log.display())))?;
        let err = out
            .try_clone()
            .map_err(io(format!("opening {name}'s log {}", log.display())))?;
        let mut cmd = Command::new(bin);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let child = cmd
            .spawn()
            .map_err(io(format!("starting the {name} ({})", bin.display())))?;
        let pid = child
            .id()
            .ok_or_else(|| Error::Proc(format!("{name}: exited before it got a PID")))?;
        tracing::debug!(pid, %name, bin = %bin.display(), ?args, log = %log.display(), "started");
        let peak_rss = Arc::new(AtomicU64::new(0));
        let cpu_micros = Arc::new(AtomicU64::new(0));
        let sampler = tokio::spawn(sample(pid, Arc::clone(&peak_rss), Arc::clone(&cpu_micros)));
        Ok(Self {
            name,
            child,
            pid,
            bin: bin.to_path_buf(),
            log: log.to_path_buf(),
            peak_rss,
            cpu_micros,
            sampler,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    pub fn bin(&self) -> &Path {
        &self.bin
    }

    /// Memory now (VmRSS and the rest) and the peak so far.
    pub fn memory(&self) -> Result<Memory, Error> {
        procfs::memory(self.pid)
    }

    /// CPU time so far; `None` once the process is gone.
    pub fn cpu(&self) -> Option<Duration> {
        procfs::cpu_time(self.pid).ok()
    }

    /// Resolves when the process exits (it should not, before [`Self::stop`]).
    pub async fn exited(&mut self) -> Result<ExitStatus, Error> {
        self.child.wait().await.map_err(|source| Error::Io {
            op: format!("waiting for the {} ({})", self.name, self.bin.display()),
            source,
        })
    }

    /// An error with the end of its log if the process has exited: it must run until
    /// [`Self::stop`].
    pub fn check_alive(&mut self) -> Result<(), Error> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(Error::exited(
                &self.name,
                "the run",
                status.to_string(),
                self.log_tail(TAIL_LINES),
            )),
            Err(source) => Err(Error::Io {
                op: format!("checking on the {}", self.name),
                source,
            }),
        }
    }

    /// Waits until the process has created `socket` (a driver's CSI socket: its callers give
    /// up when it is not there yet); an error if the process exits first or `timeout` passes.
    pub async fn wait_for_socket(&mut self, socket: &Path, timeout: Duration) -> Result<(), Error> {
        let deadline = Instant::now() + timeout;
        while !socket.exists() {
            self.check_alive()?;
            if Instant::now() > deadline {
                return Err(Error::timeout(
                    format!("{}: its socket", self.name),
                    format!("{} does not exist after {timeout:?}", socket.display()),
                    self.log_tail(TAIL_LINES),
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    /// The last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        procfs::log_tail(&self.log, lines)
    }

    /// Takes a last sample, then SIGTERM (SIGKILL after a grace period).
    pub async fn stop(mut self) -> ProcessStats {
        record(self.pid, &self.peak_rss, &self.cpu_micros);
        self.sampler.abort();
        let stats = self.stats();
        if let Ok(None) = self.child.try_wait() {
            let pid = i32::try_from(self.pid)
                .ok()
                .and_then(rustix::process::Pid::from_raw);
            if let Some(pid) = pid {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
            }
            match tokio::time::timeout(STOP_GRACE, self.child.wait()).await {
                Ok(Ok(status)) => tracing::debug!(name = %self.name, %status, "stopped"),
                _ => {
                    tracing::warn!(name = %self.name, "ignored SIGTERM; killing it");
                    let _ = self.child.kill().await;
                }
            }
        }
        stats
    }

    fn stats(&self) -> ProcessStats {
        let rss = self.peak_rss.load(Ordering::Relaxed);
        let cpu = self.cpu_micros.load(Ordering::Relaxed);
        ProcessStats {
            peak_rss_bytes: (rss > 0).then_some(rss),
            cpu: (cpu > 0).then(|| Duration::from_micros(cpu)),
        }
    }
}

impl Drop for Child {
    /// SIGKILL and a short wait for the exit, so whoever cleans up after this (unmounting what
    /// the process mounted) does not race with it.
    fn drop(&mut self) {
        self.sampler.abort();
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.start_kill();
            let deadline = Instant::now() + Duration::from_secs(2);
            while Instant::now() < deadline {
                if !matches!(self.child.try_wait(), Ok(None)) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
}

fn record(pid: u32, peak_rss: &AtomicU64, cpu_micros: &AtomicU64) {
    if let Ok(rss) = procfs::peak_rss_bytes(pid) {
        peak_rss.fetch_max(rss, Ordering::Relaxed);
    }
    if let Ok(cpu) = procfs::cpu_time(pid) {
        let micros = u64::try_from(cpu.as_micros()).unwrap_or(u64::MAX);
        cpu_micros.fetch_max(micros, Ordering::Relaxed);
    }
}

async fn sample(pid: u32, peak_rss: Arc<AtomicU64>, cpu_micros: Arc<AtomicU64>) {
    loop {
        record(pid, &peak_rss, &cpu_micros);
        tokio::time::sleep(SAMPLE_EVERY).await;
    }
}

/// Where the binaries under test are by default: beside this one (`target/release/` when
/// csi-bench was built there with them).
pub fn default_bin_dir() -> Result<PathBuf, Error> {
    let exe = std::env::current_exe().map_err(|source| Error::Io {
        op: "finding this binary".into(),
        source,
    })?;
    exe.parent()
        .map(Path::to_path_buf)
        .ok_or_else(|| Error::Config(format!("{} has no directory", exe.display())))
}

/// The ends of the children's logs, each under its name.
pub fn logs_of<'a>(children: impl IntoIterator<Item = &'a Child>, lines: usize) -> String {
    children
        .into_iter()
        .map(|c| format!("--- {} ---\n{}", c.name, c.log_tail(lines)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Runs `work`, the phase `phase` of a scenario, until it finishes, one of `children` exits
/// (an error with every child's log), or `deadline` passes (an error with `progress()` and the
/// logs).
pub async fn during<T>(
    children: &mut [&mut Child],
    phase: &str,
    deadline: Instant,
    progress: impl FnOnce() -> String,
    work: impl Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    enum Outcome<T> {
        Done(Result<T, Error>),
        Exited(usize, Result<ExitStatus, Error>),
        TimedOut,
    }
    let outcome = {
        let exits = async {
            if children.is_empty() {
                return std::future::pending().await;
            }
            let waits = children
                .iter_mut()
                .map(|c| Box::pin(c.exited()))
                .collect::<Vec<_>>();
            let (status, index, _) = futures::future::select_all(waits).await;
            (index, status)
        };
        tokio::select! {
            r = work => Outcome::Done(r),
            (index, status) = exits => Outcome::Exited(index, status),
            () = tokio::time::sleep_until(deadline.into()) => Outcome::TimedOut,
        }
    };
    let logs = || logs_of(children.iter().map(|c| &**c), TAIL_LINES);
    match outcome {
        Outcome::Done(r) => r,
        Outcome::Exited(index, status) => {
            let status = match status {
                Ok(s) => s.to_string(),
                Err(e) => e.to_string(),
            };
            let who = children
                .get(index)
                .map(|c| format!("the {} ({})", c.name, c.bin.display()))
                .unwrap_or_default();
            Err(Error::exited(&who, phase, status, logs()))
        }
        Outcome::TimedOut => Err(Error::timeout(phase, progress(), logs())),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn sh(dir: &Path, name: &str, script: &str) -> Child {
        Child::spawn(
            name,
            Path::new("sh"),
            &["-c".into(), script.into()],
            &[],
            &dir.join(format!("{name}.log")),
        )
        .unwrap()
    }

    #[tokio::test]
    async fn samples_and_stops_a_child() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = sh(dir.path(), "sleeper", "echo started >&2; exec sleep 600");
        // Sample `sleep` itself, not the forked shell before its exec, nor the exec half
        // done: the kernel names the process before it maps the binary (a CI run sampled
        // 8 KiB of RSS and no file pages there).
        let deadline = Instant::now() + Duration::from_secs(10);
        let m = loop {
            let comm = std::fs::read_to_string(format!("/proc/{}/comm", p.pid()));
            if comm.is_ok_and(|c| c == "sleep\n")
                && let Ok(m) = p.memory()
                && m.file > 0
            {
                break m;
            }
            assert!(Instant::now() < deadline, "sleep never ran");
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        assert!(m.rss > 0 && m.hwm >= m.rss, "{m:?}");
        assert!(m.file > 0 && m.threads >= 1, "{m:?}");
        assert!(p.cpu().is_some());
        while !p.log_tail(5).contains("started") {
            assert!(Instant::now() < deadline, "the log never got the output");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        p.check_alive().unwrap();
        let pid = p.pid();
        let stats = p.stop().await;
        assert!(stats.peak_rss_bytes.unwrap() > 0);
        assert!(
            std::fs::metadata(format!("/proc/{pid}")).is_err(),
            "stopped and reaped"
        );
    }

    #[tokio::test]
    async fn drop_kills_and_reaps_the_child() {
        let dir = tempfile::tempdir().unwrap();
        let p = sh(dir.path(), "sleeper", "exec sleep 600");
        let pid = p.pid();
        drop(p);
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        assert!(
            status.is_empty() || status.contains("State:\tZ"),
            "still running after drop: {status}"
        );
    }

    #[tokio::test]
    async fn an_exited_child_is_an_error_with_its_log() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = sh(dir.path(), "failing", "echo boom >&2; exit 3");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Err(e) = p.check_alive() {
                let text = e.to_string();
                assert!(text.contains("failing") && text.contains("boom"), "{text}");
                break;
            }
            assert!(Instant::now() < deadline);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn waits_for_a_socket_until_the_child_exits_or_time_runs_out() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("csi.sock");
        let script = format!("sleep 0.2; touch {}; exec sleep 600", sock.display());
        let mut late = sh(dir.path(), "late", &script);
        late.wait_for_socket(&sock, Duration::from_secs(10))
            .await
            .unwrap();
        assert!(sock.exists());

        let mut quitter = sh(dir.path(), "quitter", "echo no socket for you >&2; exit 3");
        let err = quitter
            .wait_for_socket(&dir.path().join("never.sock"), Duration::from_secs(10))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("quitter exited"), "{err}");
        assert!(err.contains("no socket for you"), "{err}");

        let mut idler = sh(dir.path(), "idler", "echo idling >&2; exec sleep 600");
        let err = idler
            .wait_for_socket(&dir.path().join("never.sock"), Duration::from_millis(300))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("idler: its socket"), "{err}");
        assert!(
            err.contains("never.sock does not exist after 300ms"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_child_that_exits_ends_the_phase_with_every_log() {
        let dir = tempfile::tempdir().unwrap();
        let mut adc = sh(dir.path(), "adc", "echo adc up; exec sleep 600");
        let mut attacher = sh(
            dir.path(),
            "attacher",
            "sleep 0.3; echo 'no driver' >&2; exit 4",
        );
        let err = during(
            &mut [&mut adc, &mut attacher],
            "start-up",
            Instant::now() + Duration::from_secs(30),
            String::new,
            std::future::pending::<Result<(), Error>>(),
        )
        .await
        .unwrap_err();
        let text = err.to_string();
        assert!(text.starts_with("the attacher (sh) exited"), "{text}");
        assert!(text.contains("during start-up"), "{text}");
        assert!(text.contains("exit status: 4"), "{text}");
        assert!(
            text.contains("--- adc ---\nadc up") && text.contains("--- attacher ---\nno driver"),
            "{text}"
        );
        assert!(adc.stop().await.peak_rss_bytes.is_some());
    }

    #[tokio::test]
    async fn a_deadline_reports_progress_and_work_that_finishes_wins() {
        let dir = tempfile::tempdir().unwrap();
        let mut adc = sh(dir.path(), "adc", "exec sleep 600");
        let n = during(
            &mut [&mut adc],
            "quick",
            Instant::now() + Duration::from_secs(30),
            String::new,
            async { Ok(7) },
        )
        .await
        .unwrap();
        assert_eq!(n, 7);
        let err = during(
            &mut [&mut adc],
            "through-adc: attach",
            Instant::now() + Duration::from_millis(100),
            || "3 of 20 listed".to_owned(),
            std::future::pending::<Result<(), Error>>(),
        )
        .await
        .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("through-adc: attach did not finish in time (3 of 20 listed)"),
            "{text}"
        );
        // No children: only the work and the deadline count.
        let err = during(
            &mut [],
            "alone",
            Instant::now() + Duration::from_millis(50),
            || "nothing".to_owned(),
            std::future::pending::<Result<(), Error>>(),
        )
        .await
        .unwrap_err();
        assert!(err.to_string().starts_with("alone did not finish"), "{err}");
    }
}
