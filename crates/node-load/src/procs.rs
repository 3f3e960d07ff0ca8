//! The per-node processes (CSI driver, registrar, node agent) and the EBS controller: spawned
//! with their output in a log file, sampled for memory and CPU (attacher-load's `/proc`
//! readers), stopped with SIGTERM (SIGKILL after a grace period) and killed when dropped, so a
//! failed or interrupted run leaves nothing running.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

use crate::Error;

/// How long SIGTERM gets before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// One child process.
pub struct Proc {
    pub name: String,
    child: Child,
    pid: u32,
    log: PathBuf,
}

/// Memory of a live process, from `/proc/PID/status`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Memory {
    /// VmRSS: resident now.
    pub rss: u64,
    /// VmHWM: the peak so far.
    pub hwm: u64,
    /// RssAnon (heap, stacks) and RssFile (the binary's and libraries' pages) of VmRSS.
    pub anon: u64,
    pub file: u64,
    pub threads: u64,
}

/// A `/proc/PID/status` field in kB, as bytes (or a plain count for `Threads`).
fn status_field(text: &str, path: &str, field: &str) -> Result<u64, Error> {
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix(field).and_then(|r| r.strip_prefix(':')))
        .ok_or_else(|| Error::Proc(format!("{path}: no {field} line")))?;
    let (number, kib) = match line.trim().strip_suffix("kB") {
        Some(n) => (n.trim(), true),
        None => (line.trim(), false),
    };
    let n: u64 = number
        .parse()
        .map_err(|_| Error::Proc(format!("{path}: {field} {line:?} is not a number")))?;
    Ok(if kib { n * 1024 } else { n })
}

/// VmRSS, RssAnon, RssFile and Threads of a live process.
pub fn status_of(pid: u32) -> Result<(u64, u64, u64, u64), Error> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).map_err(|source| Error::Io {
        op: format!("reading {path}"),
        source,
    })?;
    Ok((
        status_field(&text, &path, "VmRSS")?,
        status_field(&text, &path, "RssAnon")?,
        status_field(&text, &path, "RssFile")?,
        status_field(&text, &path, "Threads")?,
    ))
}

/// The last `lines` lines of a log file.
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

impl Proc {
    /// Starts `bin args...` (with `envs` added) with stdout and stderr appended to `log`.
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
            .map_err(io(format!("opening the log {}", log.display())))?;
        let err = out
            .try_clone()
            .map_err(io(format!("opening the log {}", log.display())))?;
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
            .map_err(io(format!("starting {name} ({})", bin.display())))?;
        let pid = child
            .id()
            .ok_or_else(|| Error::Proc(format!("{name}: exited before it got a PID")))?;
        tracing::debug!(pid, %name, bin = %bin.display(), ?args, "started");
        Ok(Self {
            name,
            child,
            pid,
            log: log.to_path_buf(),
        })
    }

    #[cfg(test)]
    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    pub fn memory(&self) -> Result<Memory, Error> {
        let (rss, anon, file, threads) = status_of(self.pid)?;
        Ok(Memory {
            rss,
            hwm: attacher_load::peak_rss_bytes(self.pid).map_err(|e| Error::Proc(e.to_string()))?,
            anon,
            file,
            threads,
        })
    }

    pub fn cpu(&self) -> Option<Duration> {
        attacher_load::cpu_time(self.pid).ok()
    }

    /// An error if the process has exited (it must run until [`Self::stop`]).
    pub fn check_alive(&mut self) -> Result<(), Error> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(Error::Exited {
                name: self.name.clone(),
                status: status.to_string(),
                log_tail: log_tail(&self.log, 20),
            }),
            Err(source) => Err(Error::Io {
                op: format!("checking on {}", self.name),
                source,
            }),
        }
    }

    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log, lines)
    }

    /// SIGTERM, then SIGKILL after a grace period.
    pub async fn stop(mut self) {
        if let Ok(None) = self.child.try_wait() {
            let pid = i32::try_from(self.pid)
                .ok()
                .and_then(rustix::process::Pid::from_raw);
            if let Some(pid) = pid {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
            }
            match tokio::time::timeout(STOP_GRACE, self.child.wait()).await {
                Ok(Ok(_)) => {}
                _ => {
                    tracing::warn!(name = %self.name, "ignored SIGTERM; killing it");
                    let _ = self.child.kill().await;
                }
            }
        }
    }
}

impl Drop for Proc {
    /// SIGKILL and a short wait for the exit, so whoever cleans up after this (unmounting what
    /// the process mounted) does not race with it.
    fn drop(&mut self) {
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[tokio::test]
    async fn samples_and_stops_a_child() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = Proc::spawn(
            "sleeper",
            Path::new("sleep"),
            &["600".into()],
            &[],
            &dir.path().join("log"),
        )
        .unwrap();
        // Sample `sleep` itself, not the forked child before its exec, nor the exec half
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
        assert!(
            m.anon + m.file <= m.rss && m.file > 0 && m.threads >= 1,
            "{m:?}"
        );
        p.check_alive().unwrap();
        let pid = p.pid();
        p.stop().await;
        assert!(std::fs::metadata(format!("/proc/{pid}")).is_err());
    }

    #[tokio::test]
    async fn an_exited_child_is_an_error_with_its_log() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = Proc::spawn(
            "failing",
            Path::new("sh"),
            &["-c".into(), "echo boom >&2; exit 3".into()],
            &[],
            &dir.path().join("log"),
        )
        .unwrap();
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
}
