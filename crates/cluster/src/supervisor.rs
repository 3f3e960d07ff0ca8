//! The components' tasks, in the stages they stop in: workloads first (nothing new is asked
//! for), then the controllers, provisioners and node agents (nothing new is mounted or
//! attached), then the drivers and registrars they were calling.

use std::future::Future;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// When a component stops, in shutdown order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Stage {
    Workloads,
    Controllers,
    Drivers,
}

const STAGES: [Stage; 3] = [Stage::Workloads, Stage::Controllers, Stage::Drivers];

/// How long one stage may take to stop before its tasks are aborted.
const STOP_PATIENCE: Duration = Duration::from_secs(30);

struct Task {
    name: String,
    stage: Stage,
    handle: JoinHandle<()>,
}

/// Runs the components and stops them stage by stage.
pub(crate) struct Supervisor {
    tokens: [CancellationToken; 3],
    tasks: Vec<Task>,
}

impl Supervisor {
    pub(crate) fn new() -> Self {
        Self {
            tokens: [
                CancellationToken::new(),
                CancellationToken::new(),
                CancellationToken::new(),
            ],
            tasks: Vec::new(),
        }
    }

    /// The token that stops `stage`'s components.
    pub(crate) fn token(&self, stage: Stage) -> CancellationToken {
        self.tokens[stage as usize].clone()
    }

    /// Runs `component` until its stage stops. A component that ends with an error before
    /// that says so on stderr and in cluster.log; the others keep running (as a crashed pod
    /// would leave its neighbours), so what still works can be looked at.
    pub(crate) fn spawn<F, E>(&mut self, name: impl Into<String>, stage: Stage, component: F)
    where
        F: Future<Output = Result<(), E>> + Send + 'static,
        E: std::fmt::Display + Send + 'static,
    {
        let name = name.into();
        let stopping = self.token(stage);
        let who = name.clone();
        let handle = tokio::spawn(async move {
            let result = component.await;
            match result {
                Ok(()) if stopping.is_cancelled() => {
                    tracing::info!(component = %who, "stopped");
                }
                Ok(()) => {
                    tracing::warn!(component = %who, "ended on its own");
                    eprintln!("csi-cluster: {who} ended on its own");
                }
                Err(e) => {
                    tracing::error!(component = %who, error = %e, "failed");
                    eprintln!("csi-cluster: {who} failed: {e}");
                }
            }
        });
        self.tasks.push(Task {
            name,
            stage,
            handle,
        });
    }

    /// Stops every stage in order, waiting for each (aborting what does not stop in time).
    pub(crate) async fn stop(mut self) {
        for stage in STAGES {
            self.tokens[stage as usize].cancel();
            let (now, later): (Vec<Task>, Vec<Task>) = std::mem::take(&mut self.tasks)
                .into_iter()
                .partition(|t| t.stage == stage);
            self.tasks = later;
            for t in now {
                let abort = t.handle.abort_handle();
                if tokio::time::timeout(STOP_PATIENCE, t.handle).await.is_err() {
                    tracing::warn!(component = %t.name, "did not stop in time; aborted");
                    abort.abort();
                }
            }
        }
    }
}

impl Drop for Supervisor {
    /// An `up` that failed half-way: whatever was started stops.
    fn drop(&mut self) {
        for t in &self.tokens {
            t.cancel();
        }
        for t in &self.tasks {
            t.handle.abort();
        }
    }
}
