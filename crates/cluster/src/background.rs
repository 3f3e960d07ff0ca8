//! `csi-cluster up --background`: the same `up` again, without `--background`, in a session of
//! its own (`setsid`: no terminal, so neither Ctrl-C nor closing the terminal reaches it), its
//! output appended to `<data-dir>/logs/up.out`. This process waits until that output says the
//! cluster is ready, prints what `up` printed, and returns; `csi-cluster down` stops the
//! cluster through its pid file as for a foreground one. If the cluster's process ends first,
//! the end of its output is printed and this fails.

use std::ffi::OsString;
use std::fs::OpenOptions;
use std::io::{Read as _, Seek as _, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::config::UpConfig;
use crate::{Error, READY_LINE};

/// How long the cluster may take to say it is ready (its own patience for the nodes is 180 s,
/// and starting comes before that).
const PATIENCE: Duration = Duration::from_secs(300);

/// How many lines of a failed cluster's output are shown (enough for its error and a
/// backtrace after it, with RUST_BACKTRACE set).
const TAIL_LINES: usize = 200;

const WHAT: &str = "csi-cluster up --background";

/// Starts the cluster in the background and waits until it is ready.
pub async fn start(config: &UpConfig) -> Result<(), Error> {
    let logs = config.data_dir.join("logs");
    std::fs::create_dir_all(&logs).map_err(|e| Error::io("creating", &logs, e))?;
    let out_path = logs.join("up.out");
    let out = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&out_path)
        .map_err(|e| Error::io("opening", &out_path, e))?;
    // Earlier runs' output stays in the file; this run's starts here.
    let offset = out
        .metadata()
        .map_err(|e| Error::io("reading", &out_path, e))?
        .len();
    let err = out
        .try_clone()
        .map_err(|e| Error::io("opening", &out_path, e))?;
    let exe = std::env::current_exe().map_err(|e| Error::start(WHAT, e))?;
    let args = foreground_args(std::env::args_os().skip(1));
    let mut command = match on_path("setsid") {
        Some(setsid) => {
            let mut c = Command::new(setsid);
            c.arg(&exe);
            c
        }
        // Without util-linux's setsid, a process group of its own still keeps the terminal's
        // Ctrl-C away from it.
        None => {
            use std::os::unix::process::CommandExt as _;
            let mut c = Command::new(&exe);
            c.process_group(0);
            c
        }
    };
    let mut child = command
        .args(&args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| Error::start(WHAT, format!("starting {}: {e}", exe.display())))?;
    let started = Instant::now();
    loop {
        let text = read_from(&out_path, offset);
        if let Some(end) = text.find(READY_LINE) {
            let line_end = text[end..].find('\n').map_or(text.len(), |n| end + n + 1);
            print!("{}", &text[..line_end]);
            let pid = std::fs::read_to_string(config.data_dir.join("csi-cluster.pid"))
                .ok()
                .map_or_else(|| child.id().to_string(), |p| p.trim().to_string());
            println!(
                "csi-cluster runs in the background (pid {pid}); its output goes to {}. Stop it with `csi-cluster down --data-dir {}`.",
                out_path.display(),
                config.data_dir.display()
            );
            return Ok(());
        }
        if let Some(status) = child
            .try_wait()
            .map_err(|e| Error::start(WHAT, format!("waiting for the cluster: {e}")))?
        {
            eprint!("{}", tail(&text));
            return Err(Error::start(
                WHAT,
                format!(
                    "the cluster's process ended ({status}) before it was ready; its output is above and in {}",
                    out_path.display()
                ),
            ));
        }
        if started.elapsed() > PATIENCE {
            eprint!("{}", tail(&text));
            return Err(Error::Timeout {
                what: format!("{READY_LINE:?} in {}", out_path.display()),
                waited: PATIENCE,
                progress: format!(
                    "the cluster (pid {}) still runs; stop it with `csi-cluster down --data-dir {}`",
                    child.id(),
                    config.data_dir.display()
                ),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The arguments of this `up` without `--background` (the flag takes no value).
fn foreground_args(args: impl Iterator<Item = OsString>) -> Vec<OsString> {
    args.filter(|a| a != "--background").collect()
}

/// What was appended to `path` after `offset`.
fn read_from(path: &Path, offset: u64) -> String {
    let mut text = Vec::new();
    if let Ok(mut f) = std::fs::File::open(path)
        && f.seek(SeekFrom::Start(offset)).is_ok()
    {
        let _ = f.read_to_end(&mut text);
    }
    String::from_utf8_lossy(&text).into_owned()
}

/// The last [`TAIL_LINES`] lines of `text`.
fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let from = lines.len().saturating_sub(TAIL_LINES);
    lines[from..].iter().map(|l| format!("{l}\n")).collect()
}

fn on_path(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(tool))
            .find(|p| p.is_file())
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_foreground_up_gets_every_flag_but_background() {
        let args = ["up", "--background", "--nodes", "2", "--data-dir", "/d"]
            .map(OsString::from)
            .into_iter();
        assert_eq!(
            foreground_args(args),
            ["up", "--nodes", "2", "--data-dir", "/d"].map(OsString::from)
        );
    }

    #[test]
    fn output_is_read_from_the_offset_and_tailed() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("up.out");
        std::fs::write(&p, "old run\nnew 1\n").unwrap();
        assert_eq!(read_from(&p, 8), "new 1\n");
        let long: String = (0..300).map(|i| format!("line {i}\n")).collect();
        let t = tail(&long);
        assert_eq!(t.lines().count(), TAIL_LINES);
        assert!(t.ends_with("line 299\n"));
    }
}
