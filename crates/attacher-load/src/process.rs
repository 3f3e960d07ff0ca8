//! The attacher under test as a child process: spawned with its output in a log file, watched
//! for peak memory and CPU time, and always stopped (SIGTERM, then SIGKILL) – also when the run
//! fails halfway.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::task::JoinHandle;

use crate::Error;

/// How often the peak RSS is sampled while the attacher runs. VmHWM is already a high-water
/// mark; sampling only keeps the last value if the process dies on its own.
const SAMPLE_EVERY: Duration = Duration::from_millis(250);
/// How long SIGTERM gets before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// Peak resident set size (VmHWM) of a live process, in bytes.
pub fn peak_rss_bytes(pid: u32) -> Result<u64, Error> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).map_err(|source| Error::Io {
        op: format!("reading {path}"),
        source,
    })?;
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .ok_or_else(|| {
            Error::Proc(format!(
                "{path}: no VmHWM line (a kernel thread or zombie?)"
            ))
        })?;
    let kib: u64 = line
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .map_err(|_| Error::Proc(format!("{path}: VmHWM {line:?} is not \"N kB\"")))?;
    Ok(kib * 1024)
}

/// User + system CPU time of a live process.
pub fn cpu_time(pid: u32) -> Result<Duration, Error> {
    let path = format!("/proc/{pid}/stat");
    let text = std::fs::read_to_string(&path).map_err(|source| Error::Io {
        op: format!("reading {path}"),
        source,
    })?;
    // The command name (field 2) is in parentheses and may contain spaces: split after it.
    let after = text
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .ok_or_else(|| Error::Proc(format!("{path}: no ')' after the command name")))?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    // After the name: state is field 3, utime field 14, stime field 15 (1-based in proc(5)).
    let tick = |n: usize| -> Result<u64, Error> {
        fields
            .get(n - 3)
            .and_then(|f| f.parse().ok())
            .ok_or_else(|| Error::Proc(format!("{path}: field {n} is not a number")))
    };
    let ticks = tick(14)? + tick(15)?;
    let per_second = rustix::param::clock_ticks_per_second().max(1);
    Ok(Duration::from_secs_f64(ticks as f64 / per_second as f64))
}

/// What was measured of the attacher process.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessStats {
    pub peak_rss_bytes: Option<u64>,
    pub cpu: Option<Duration>,
}

/// The running attacher. Dropping it kills the process.
pub struct AttacherProcess {
    child: Child,
    pid: u32,
    bin: PathBuf,
    log: PathBuf,
    peak_rss: Arc<AtomicU64>,
    cpu_micros: Arc<AtomicU64>,
    sampler: JoinHandle<()>,
}

impl AttacherProcess {
    /// Starts `bin args...` with stdout and stderr appended to `log`.
    pub fn spawn(bin: &Path, args: &[String], log: &Path) -> Result<Self, Error> {
        let io = |op: String| move |source| Error::Io { op, source };
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(io(format!("opening the attacher log {}", log.display())))?;
        let err = out
            .try_clone()
            .map_err(io(format!("opening the attacher log {}", log.display())))?;
        let child = Command::new(bin)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true)
            .spawn()
            .map_err(io(format!("starting the attacher {}", bin.display())))?;
        let pid = child
            .id()
            .ok_or_else(|| Error::Proc(format!("{}: exited before it got a PID", bin.display())))?;
        tracing::info!(pid, bin = %bin.display(), ?args, log = %log.display(), "attacher started");
        let peak_rss = Arc::new(AtomicU64::new(0));
        let cpu_micros = Arc::new(AtomicU64::new(0));
        let sampler = tokio::spawn(sample(pid, Arc::clone(&peak_rss), Arc::clone(&cpu_micros)));
        Ok(Self {
            child,
            pid,
            bin: bin.to_path_buf(),
            log: log.to_path_buf(),
            peak_rss,
            cpu_micros,
            sampler,
        })
    }

    #[cfg(test)]
    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    pub fn bin(&self) -> &Path {
        &self.bin
    }

    /// Resolves when the process exits (it should not, before [`Self::stop`]).
    pub async fn exited(&mut self) -> Result<ExitStatus, Error> {
        self.child.wait().await.map_err(|source| Error::Io {
            op: format!("waiting for the attacher {}", self.bin.display()),
            source,
        })
    }

    /// The last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log, lines)
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
                Ok(Ok(status)) => tracing::info!(%status, "attacher stopped"),
                _ => {
                    tracing::warn!("attacher ignored SIGTERM; killing it");
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

impl Drop for AttacherProcess {
    fn drop(&mut self) {
        self.sampler.abort();
        // kill_on_drop covers the child too; this makes it explicit and immediate.
        let _ = self.child.start_kill();
    }
}

fn record(pid: u32, peak_rss: &AtomicU64, cpu_micros: &AtomicU64) {
    if let Ok(rss) = peak_rss_bytes(pid) {
        peak_rss.fetch_max(rss, Ordering::Relaxed);
    }
    if let Ok(cpu) = cpu_time(pid) {
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

pub(crate) fn log_tail(path: &Path, lines: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn samples_a_child_and_kills_it_on_stop() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("child.log");
        let p = AttacherProcess::spawn(
            Path::new("sh"),
            &["-c".into(), "echo started >&2; exec sleep 600".into()],
            &log,
        )
        .unwrap();
        let pid = p.pid();
        // `sleep` maps at least a few pages.
        let rss = peak_rss_bytes(pid).unwrap();
        assert!(rss > 0, "VmHWM of a live process");
        cpu_time(pid).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !p.log_tail(5).contains("started") {
            assert!(
                std::time::Instant::now() < deadline,
                "log never got the output"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let stats = p.stop().await;
        assert!(stats.peak_rss_bytes.unwrap() > 0);
        assert!(
            std::fs::metadata(format!("/proc/{pid}")).is_err(),
            "stopped and reaped"
        );
    }

    #[tokio::test]
    async fn drop_kills_the_child() {
        let dir = tempfile::tempdir().unwrap();
        let p =
            AttacherProcess::spawn(Path::new("sleep"), &["600".into()], &dir.path().join("log"))
                .unwrap();
        let pid = p.pid();
        drop(p);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        // Killed; tokio reaps it in the background (a zombie reads "State: Z" until then).
        loop {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            if status.is_empty() || status.contains("State:\tZ") {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "child still alive");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[test]
    fn proc_errors_name_the_file() {
        let err = peak_rss_bytes(u32::MAX).unwrap_err();
        assert!(err.to_string().contains("/proc/4294967295/status"), "{err}");
    }

    #[test]
    fn tail_keeps_the_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("l");
        std::fs::write(&f, "a\nb\nc\n").unwrap();
        assert_eq!(log_tail(&f, 2), "b\nc");
        assert!(log_tail(&dir.path().join("none"), 2).contains("cannot read"));
    }
}
