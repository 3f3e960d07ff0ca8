//! A component under test running as a tokio task: what every crate's test commons had as
//! their own `Task` / `Running`. Dropping it cancels the component (a failed test leaves
//! nothing running); [`ComponentTask::stop`] cancels it and fails the test unless it ended in
//! time and without an error.

use std::future::Future;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// A component's `run(…, shutdown)` future, spawned.
#[derive(Debug)]
pub struct ComponentTask<E> {
    stop: CancellationToken,
    task: Option<JoinHandle<Result<(), E>>>,
}

impl<E: std::fmt::Debug + Send + 'static> ComponentTask<E> {
    /// Spawns `run` with a fresh shutdown token.
    pub fn spawn<F>(run: impl FnOnce(CancellationToken) -> F) -> Self
    where
        F: Future<Output = Result<(), E>> + Send + 'static,
    {
        let stop = CancellationToken::new();
        Self {
            task: Some(tokio::spawn(run(stop.clone()))),
            stop,
        }
    }

    /// Whether it ended on its own (returned, failed or panicked): a test that waits for a
    /// component to come up fails early when it did not.
    pub fn is_finished(&self) -> bool {
        self.task.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Cancels it and waits up to `patience` for it to end; panics, naming `what`, if it does
    /// not end in time, panicked, or returned an error.
    pub async fn stop(self, what: &str, patience: Duration) {
        if let Some(problem) = self.end(what, patience).await {
            panic!("{problem}");
        }
    }

    /// Cancels it and waits up to `patience`, whatever the outcome (a test that broke the
    /// component on purpose): what went wrong is printed, naming `what`, not failed on.
    pub async fn abandon(self, what: &str, patience: Duration) {
        if let Some(problem) = self.end(what, patience).await {
            eprintln!("{problem}");
        }
    }

    /// Cancels it and waits up to `patience`: what went wrong, naming `what`, if anything.
    async fn end(mut self, what: &str, patience: Duration) -> Option<String> {
        self.stop.cancel();
        let task = self.task.take()?;
        match tokio::time::timeout(patience, task).await {
            Err(_) => Some(format!("{what} did not stop within {patience:?}")),
            Ok(Err(e)) => Some(format!("{what} panicked: {e}")),
            Ok(Ok(Err(e))) => Some(format!("{what} ended with an error: {e:?}")),
            Ok(Ok(Ok(()))) => None,
        }
    }
}

impl<E> Drop for ComponentTask<E> {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATIENCE: Duration = Duration::from_secs(5);

    async fn until_stopped(stop: CancellationToken) -> Result<(), String> {
        stop.cancelled().await;
        Ok(())
    }

    #[tokio::test]
    async fn a_component_that_stops_cleanly_passes() {
        let t = ComponentTask::spawn(until_stopped);
        assert!(!t.is_finished());
        t.stop("it", PATIENCE).await;
    }

    #[tokio::test]
    #[should_panic(expected = "it ended with an error: \"broken\"")]
    async fn an_error_fails_the_stop() {
        let t = ComponentTask::spawn(|stop: CancellationToken| async move {
            stop.cancelled().await;
            Err::<(), _>("broken".to_string())
        });
        t.stop("it", PATIENCE).await;
    }

    #[tokio::test]
    #[should_panic(expected = "it did not stop within")]
    async fn a_component_that_ignores_the_token_fails_the_stop() {
        let t = ComponentTask::spawn(|_stop| async {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok::<(), String>(())
        });
        t.stop("it", Duration::from_millis(50)).await;
    }

    #[tokio::test]
    async fn dropping_it_cancels_the_component() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let t = ComponentTask::spawn(|stop: CancellationToken| async move {
            stop.cancelled().await;
            let _ = tx.send(());
            Ok::<(), String>(())
        });
        drop(t);
        tokio::time::timeout(PATIENCE, rx).await.unwrap().unwrap();
    }
}
