//! Reading a process's memory and CPU time from `/proc`, and the end of a log file.

use std::path::Path;
use std::time::Duration;

use crate::Error;

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

fn read(path: &str) -> Result<String, Error> {
    std::fs::read_to_string(path).map_err(|source| Error::Io {
        op: format!("reading {path}"),
        source,
    })
}

/// A `/proc/PID/status` field in kB, as bytes (or a plain count for `Threads`).
fn status_field(text: &str, path: &str, field: &str) -> Result<u64, Error> {
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix(field).and_then(|r| r.strip_prefix(':')))
        .ok_or_else(|| {
            Error::Proc(format!(
                "{path}: no {field} line (a kernel thread or zombie?)"
            ))
        })?;
    let (number, kib) = match line.trim().strip_suffix("kB") {
        Some(n) => (n.trim(), true),
        None => (line.trim(), false),
    };
    let n: u64 = number
        .parse()
        .map_err(|_| Error::Proc(format!("{path}: {field} {line:?} is not a number")))?;
    Ok(if kib { n * 1024 } else { n })
}

/// Peak resident set size (VmHWM) of a live process, in bytes.
pub fn peak_rss_bytes(pid: u32) -> Result<u64, Error> {
    let path = format!("/proc/{pid}/status");
    status_field(&read(&path)?, &path, "VmHWM")
}

/// VmRSS, VmHWM, RssAnon, RssFile and Threads of a live process.
pub fn memory(pid: u32) -> Result<Memory, Error> {
    let path = format!("/proc/{pid}/status");
    let text = read(&path)?;
    let field = |name| status_field(&text, &path, name);
    Ok(Memory {
        rss: field("VmRSS")?,
        hwm: field("VmHWM")?,
        anon: field("RssAnon")?,
        file: field("RssFile")?,
        threads: field("Threads")?,
    })
}

/// User + system CPU time of a live process.
pub fn cpu_time(pid: u32) -> Result<Duration, Error> {
    let path = format!("/proc/{pid}/stat");
    let text = read(&path)?;
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

/// This process's own CPU time (the in-process control plane, the watches, the client).
pub fn own_cpu_time() -> Option<Duration> {
    cpu_time(std::process::id()).ok()
}

/// The last `lines` lines of a log file (a note instead when it cannot be read).
pub fn log_tail(path: &Path, lines: usize) -> String {
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
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn reads_this_process() {
        let m = memory(std::process::id()).unwrap();
        assert!(m.rss > 0 && m.hwm >= m.rss && m.threads >= 1, "{m:?}");
        assert!(m.anon + m.file <= m.rss, "{m:?}");
        assert!(peak_rss_bytes(std::process::id()).unwrap() >= m.rss);
        assert!(own_cpu_time().is_some());
    }

    #[test]
    fn errors_name_the_file() {
        let err = peak_rss_bytes(u32::MAX).unwrap_err();
        assert!(err.to_string().contains("/proc/4294967295/status"), "{err}");
        let err = status_field("VmRSS:\tlots kB\n", "/proc/1/status", "VmRSS").unwrap_err();
        assert!(err.to_string().contains("VmRSS"), "{err}");
        let err = status_field("", "/proc/1/status", "VmHWM").unwrap_err();
        assert!(err.to_string().contains("no VmHWM line"), "{err}");
    }

    #[test]
    fn fields_in_kb_are_bytes_and_counts_are_counts() {
        let text = "VmHWM:\t  2048 kB\nThreads:\t7\n";
        assert_eq!(status_field(text, "p", "VmHWM").unwrap(), 2048 * 1024);
        assert_eq!(status_field(text, "p", "Threads").unwrap(), 7);
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
