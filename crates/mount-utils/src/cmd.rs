//! Running the real tools (blkid, mkfs, fsck, mount...) with their output captured.

use std::ffi::{OsStr, OsString};
use std::process::Stdio;

use crate::{Error, Result};

/// What a finished tool left behind: its exit code (None when killed by a signal) and its
/// stdout and stderr, lossily decoded (the tools print ASCII).
#[derive(Debug)]
pub struct Output {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    /// stdout and stderr together, trimmed: what an operator needs to see in an error.
    pub fn combined(&self) -> String {
        let mut s = self.stdout.trim().to_string();
        let err = self.stderr.trim();
        if !err.is_empty() {
            if !s.is_empty() {
                s.push('\n');
            }
            s.push_str(err);
        }
        s
    }

    /// How the tool ended, as an error message says it ("exit code 4", "a signal").
    pub fn status(&self) -> String {
        match self.code {
            Some(c) => format!("exit code {c}"),
            None => "a signal".to_string(),
        }
    }
}

/// Runs `program args...` to completion with stdin closed (so no tool can sit on a prompt) and
/// returns its output whatever the exit code; callers decide what the codes mean.
pub async fn run<I, S>(program: &str, args: I) -> Result<Output>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let args = os_args(args);
    tracing::debug!(program, ?args, "running");
    let out = tokio::process::Command::new(program)
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Locale-independent messages: some callers look for "not mounted".
        .env("LC_ALL", "C")
        .output()
        .await
        .map_err(|source| Error::Spawn {
            program: program.to_string(),
            source,
        })?;
    Ok(Output {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// Like [`run`], but any exit code other than 0 is an [`Error::Command`].
pub async fn run_ok<I, S>(program: &str, args: I) -> Result<Output>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let args = os_args(args);
    let out = run(program, &args).await?;
    if out.code == Some(0) {
        Ok(out)
    } else {
        Err(command_error(program, &args, &out))
    }
}

/// The arguments collected once, so that they can be both passed on and quoted in an error.
fn os_args<I, S>(args: I) -> Vec<OsString>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    args.into_iter()
        .map(|a| a.as_ref().to_os_string())
        .collect()
}

/// The [`Error::Command`] for a tool that ran and failed: the command line, how it ended and
/// everything it printed, so that the operator sees the tool's own words.
pub fn command_error<S: AsRef<OsStr>>(program: &str, args: &[S], out: &Output) -> Error {
    Error::Command {
        command: describe(program, args),
        status: out.status(),
        output: out.combined(),
    }
}

fn describe<S: AsRef<OsStr>>(program: &str, args: &[S]) -> String {
    let mut s = program.to_string();
    for a in args {
        s.push(' ');
        s.push_str(&a.as_ref().to_string_lossy());
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn run_captures_code_and_both_streams() {
        let out = run("sh", ["-c", "echo out; echo err >&2; exit 3"])
            .await
            .unwrap();
        assert_eq!(out.code, Some(3));
        assert_eq!(out.combined(), "out\nerr");
    }

    #[tokio::test]
    async fn run_ok_turns_nonzero_into_error_with_output() {
        let err = run_ok("sh", ["-c", "echo boom >&2; exit 4"])
            .await
            .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("sh -c"), "{msg}");
        assert!(msg.contains("exit code 4"), "{msg}");
        assert!(msg.contains("boom"), "{msg}");
    }

    #[tokio::test]
    async fn missing_program_is_a_spawn_error() {
        let err = run("/nonexistent/tool", ["x"]).await.unwrap_err();
        assert!(matches!(err, Error::Spawn { .. }), "{err}");
    }
}
