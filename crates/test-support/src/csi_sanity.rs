//! Running the real csi-sanity (kubernetes-csi/csi-test, `cmd/csi-sanity`) against a driver's
//! socket, for the drivers' conformance tests: where the binary is ([`binary`]: from
//! `CSI_RS_K8S_ASSETS`, as the other real-Kubernetes parts are found), one run with a hard
//! deadline ([`run`]), and its Ginkgo summary ([`Summary`]).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The directory that holds the real Kubernetes binaries and csi-sanity.
pub const ASSETS_ENV: &str = "CSI_RS_K8S_ASSETS";

/// `$CSI_RS_K8S_ASSETS/csi-sanity`, or `None` after [`crate::skip_or_fail`] saying what is
/// missing.
#[track_caller]
pub fn binary() -> Option<PathBuf> {
    let Some(dir) = std::env::var_os(ASSETS_ENV).filter(|d| !d.is_empty()) else {
        crate::skip_or_fail(&format!(
            "{ASSETS_ENV} is not set (the directory with csi-sanity v5.3.1; scripts/setup finds it)"
        ));
        return None;
    };
    let bin = PathBuf::from(dir).join("csi-sanity");
    if !bin.is_file() {
        crate::skip_or_fail(&format!("{} does not exist", bin.display()));
        return None;
    }
    Some(bin)
}

/// The counts of Ginkgo's last lines: `Ran N of M Specs in ...` and
/// `SUCCESS! -- P Passed | F Failed | X Pending | S Skipped` (or `FAIL! -- ...`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    pub ran: u32,
    pub of: u32,
    pub passed: u32,
    pub failed: u32,
    pub pending: u32,
    pub skipped: u32,
}

impl Summary {
    /// The summary in `output`, if it has one.
    pub fn parse(output: &str) -> Option<Summary> {
        let ran_line = output
            .lines()
            .rev()
            .find(|l| l.contains("Ran ") && l.contains(" Specs"))?;
        let mut words = ran_line[ran_line.find("Ran ")?..].split_whitespace();
        let ran = words.nth(1)?.parse().ok()?;
        let of = words.nth(1)?.parse().ok()?;
        let counts = output
            .lines()
            .rev()
            .find(|l| l.contains(" Passed | ") && l.contains(" Failed"))?;
        let count = |what: &str| -> Option<u32> {
            counts
                .split(['|', '-'])
                .map(str::trim)
                .find_map(|part| part.strip_suffix(what))?
                .trim()
                .parse()
                .ok()
        };
        Some(Summary {
            ran,
            of,
            passed: count("Passed")?,
            failed: count("Failed")?,
            pending: count("Pending").unwrap_or(0),
            skipped: count("Skipped").unwrap_or(0),
        })
    }
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ran {} of {} specs: {} passed, {} failed, {} pending, {} skipped",
            self.ran, self.of, self.passed, self.failed, self.pending, self.skipped
        )
    }
}

/// What one csi-sanity run printed and how it ended.
#[derive(Debug)]
pub struct Outcome {
    /// Whether the process exited 0.
    pub success: bool,
    pub output: String,
    pub summary: Option<Summary>,
}

impl Outcome {
    /// The names of the failed specs (Ginkgo's `[FAIL]` lines).
    pub fn failures(&self) -> Vec<&str> {
        self.output
            .lines()
            .filter(|l| l.trim_start().starts_with("[FAIL]"))
            .collect()
    }

    /// Asserts a clean run: a summary, exit 0, no failed spec and more than `min_passed` passed
    /// specs; prints the summary for `against` (the driver and its flags) and returns it. A
    /// failure carries csi-sanity's output (and the failed specs) and the driver's log.
    pub fn assert_clean(self, against: &str, driver_log: &Path, min_passed: u32) -> Summary {
        let log = || std::fs::read_to_string(driver_log).unwrap_or_default();
        let Some(summary) = self.summary else {
            panic!(
                "csi-sanity printed no summary:\n{}\ndriver log:\n{}",
                self.output,
                log()
            );
        };
        println!("csi-sanity against {against}: {summary}");
        assert!(
            self.success && summary.failed == 0,
            "csi-sanity failed ({summary}); failed specs:\n{}\n\n{}",
            self.failures().join("\n"),
            self.output
        );
        assert!(
            summary.passed > min_passed,
            "only {} specs passed, expected more than {min_passed} ({summary})",
            summary.passed
        );
        summary
    }
}

/// Kills the csi-sanity process on drop (a panic while it runs leaves nothing behind).
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs csi-sanity against `endpoint` (a unix socket path or `unix://` URL) with its mount and
/// staging directories under `work` (which it creates and removes the targets in), plus
/// `extra` flags, and waits at most `deadline` (Ginkgo's own `--ginkgo.timeout` is a little
/// shorter, so a slow run still prints its summary). Blocking: call it from
/// `spawn_blocking` when the driver runs in-process.
pub fn run(bin: &Path, endpoint: &str, work: &Path, extra: &[&str], deadline: Duration) -> Outcome {
    let mount = work.join("mount");
    let staging = work.join("staging");
    let ginkgo_timeout = format!(
        "--ginkgo.timeout={}s",
        deadline.as_secs().saturating_sub(10).max(10)
    );
    let mut cmd = Command::new(bin);
    cmd.arg(format!("--csi.endpoint={endpoint}"))
        .arg(format!("--csi.mountdir={}", mount.display()))
        .arg(format!("--csi.stagingdir={}", staging.display()))
        .arg("--ginkgo.no-color")
        .arg(ginkgo_timeout)
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = match cmd.spawn() {
        Ok(c) => Running(c),
        Err(e) => panic!("cannot start {}: {e}", bin.display()),
    };
    let mut stdout = child.0.stdout.take();
    let mut stderr = child.0.stderr.take();
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(o) = stdout.as_mut() {
            let _ = o.read_to_string(&mut s);
        }
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(e) = stderr.as_mut() {
            let _ = e.read_to_string(&mut s);
        }
        s
    });
    let started = Instant::now();
    let status = loop {
        match child.0.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if started.elapsed() > deadline => break None,
            Ok(None) => std::thread::sleep(Duration::from_millis(100)),
            Err(e) => panic!("waiting for csi-sanity: {e}"),
        }
    };
    drop(child);
    let mut output = out.join().unwrap_or_default();
    output.push_str(&err.join().unwrap_or_default());
    if status.is_none() {
        output.push_str(&format!("\n(csi-sanity killed after {deadline:?})\n"));
    }
    let summary = Summary::parse(&output);
    Outcome {
        success: status.is_some_and(|s| s.success()),
        output,
        summary,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ginkgo_summaries() {
        let ok = "...\nRan 62 of 91 Specs in 41.377 seconds\nSUCCESS! -- 62 Passed | 0 Failed | 0 Pending | 29 Skipped\nPASS\n";
        assert_eq!(
            Summary::parse(ok),
            Some(Summary {
                ran: 62,
                of: 91,
                passed: 62,
                failed: 0,
                pending: 0,
                skipped: 29
            })
        );
        let failed = "Ran 80 of 92 Specs in 12.3 seconds\nFAIL! -- 74 Passed | 6 Failed | 1 Pending | 12 Skipped\n--- FAIL: TestSanity";
        let s = Summary::parse(failed).unwrap();
        assert_eq!(
            (s.ran, s.of, s.passed, s.failed, s.pending, s.skipped),
            (80, 92, 74, 6, 1, 12)
        );
        assert_eq!(Summary::parse("no summary at all"), None);
    }
}
