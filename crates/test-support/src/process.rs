//! Stopping a binary under test the way its supervisor would: SIGTERM, then wait for it to exit
//! (kubelet's pod stop, systemd). A test asserts on the exit status: a clean shutdown is part
//! of what the binary promises.

use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

/// A child that is killed and reaped when the guard drops, so a failed test leaves no process
/// behind; stop it gracefully with [`terminate`] on `.0`.
#[derive(Debug)]
pub struct ChildGuard(pub Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        // Already exited (and reaped by a wait) is fine: kill fails, wait returns the status.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Sends SIGTERM to `child`.
pub fn sigterm(child: &Child) {
    let pid = child.id().to_string();
    let sent = Command::new("kill").args(["-TERM", &pid]).status();
    assert!(
        sent.as_ref().is_ok_and(ExitStatus::success),
        "kill -TERM {pid}: {sent:?}"
    );
}

/// SIGTERM, then the exit status once `child` has exited; panics naming `what` when it is still
/// running after `patience`. Polls without blocking the runtime: the binary may need the
/// test's in-process servers (an API server to release its lease) to shut down.
pub async fn terminate(child: &mut Child, what: &str, patience: Duration) -> ExitStatus {
    sigterm(child);
    let deadline = Instant::now() + patience;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return status,
            Ok(None) => {}
            Err(e) => panic!("waiting for {what}: {e}"),
        }
        assert!(
            Instant::now() < deadline,
            "{what} still running {patience:?} after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[tokio::test]
    async fn a_child_that_exits_on_sigterm_reports_the_signal() {
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let status = terminate(&mut child, "sleep", Duration::from_secs(10)).await;
        use std::os::unix::process::ExitStatusExt as _;
        assert_eq!(status.signal(), Some(15), "{status:?}");
    }

    #[tokio::test]
    #[should_panic(expected = "ignorer still running")]
    async fn a_child_that_ignores_sigterm_fails_the_test() {
        let mut child = Command::new("sh")
            .args(["-c", "trap '' TERM; exec sleep 5"])
            .spawn()
            .unwrap();
        // Let the shell install its trap before the signal comes.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let guard = KillOnDrop(Some(child.id()));
        terminate(&mut child, "ignorer", Duration::from_millis(200)).await;
        drop(guard);
    }

    /// Kills the child that ignores SIGTERM when the expected panic unwinds.
    struct KillOnDrop(Option<u32>);

    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            if let Some(pid) = self.0 {
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
            }
        }
    }
}
