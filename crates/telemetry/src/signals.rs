//! SIGTERM / SIGINT to a cancellation token: the one shutdown signal the rest of a sidecar
//! watches (leader election releases its lease on it, servers stop on it).

use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

/// A token cancelled on the first SIGTERM or SIGINT. Must be called inside a tokio runtime.
///
/// The handlers are installed before this returns, so a signal that arrives right after is not
/// lost. A second signal is left to the default handler only after the first was seen; if a
/// handler cannot be installed (never expected on Linux), the failure is logged and that
/// signal keeps its default action (the process dies), which is still a shutdown.
pub fn shutdown_on_signals() -> CancellationToken {
    let token = CancellationToken::new();
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    let cancel = token.clone();
    tokio::spawn(async move {
        let wait_term = async {
            match term {
                Ok(mut s) => {
                    s.recv().await;
                    "SIGTERM"
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot handle SIGTERM");
                    std::future::pending().await
                }
            }
        };
        let wait_int = async {
            match int {
                Ok(mut s) => {
                    s.recv().await;
                    "SIGINT"
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot handle SIGINT");
                    std::future::pending().await
                }
            }
        };
        let which = tokio::select! {
            w = wait_term => w,
            w = wait_int => w,
        };
        tracing::info!(signal = which, "shutting down");
        cancel.cancel();
    });
    token
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn sigterm_cancels_the_token() {
        let token = shutdown_on_signals();
        assert!(!token.is_cancelled());
        // Our own process: the handler is installed, so SIGTERM does not kill the test binary.
        let pid = std::process::id().to_string();
        let status = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap();
        assert!(status.success());
        tokio::time::timeout(Duration::from_secs(30), token.cancelled())
            .await
            .expect("SIGTERM cancels the token");
    }
}
