//! The components' tasks, in the stages they stop in: workloads first (nothing new is asked
//! for), then the controllers, provisioners and node agents (nothing new is mounted or
//! attached), then the drivers and registrars they were calling.
//!
//! Every component is started from a factory, so it can be started again: after it failed
//! (as the kubelet restarts a crashed container, with a back-off), after [`Supervisor::kill`]
//! (the in-process SIGKILL: the task is dropped where it stands, nothing of its graceful stop
//! runs) and by [`Supervisor::restart`] (a graceful stop, then a start with what the factory
//! reads now, e.g. a changed migration gate).
//!
//! Each run has its own thread and tokio runtime, as each component would be its own process:
//! a kill drops that runtime with every task the component spawned (its gRPC connections,
//! its workers, its in-flight operations), not only the task the supervisor holds. With one
//! shared runtime those spawned tasks outlived a kill and went on attaching and mounting, so
//! a "killed" node agent still published volumes.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::Error;

/// When a component stops, in shutdown order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Stage {
    Workloads,
    Controllers,
    Drivers,
}

const STAGES: [Stage; 3] = [Stage::Workloads, Stage::Controllers, Stage::Drivers];

/// How long one stage (or one restarted component) may take to stop before it is aborted.
const STOP_PATIENCE: Duration = Duration::from_secs(30);

/// The first wait before a failed component starts again; it doubles up to [`BACKOFF_MAX`]
/// (the kubelet's CrashLoopBackOff, shortened for one machine).
const BACKOFF_INITIAL: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// What a component's run ends with.
pub(crate) type RunResult = Result<(), String>;

/// One run of a component, until the token is cancelled.
pub(crate) type Run = Pin<Box<dyn Future<Output = RunResult> + Send>>;

/// Makes one run of a component (called again for every restart).
pub(crate) type Factory = Arc<dyn Fn(CancellationToken) -> Run + Send + Sync>;

/// Wraps a component's future and error type into a [`Run`].
pub(crate) fn run<F, E>(component: F) -> Run
where
    F: Future<Output = Result<(), E>> + Send + 'static,
    E: std::fmt::Display,
{
    Box::pin(async move { component.await.map_err(|e| e.to_string()) })
}

struct Component {
    stage: Stage,
    factory: Factory,
    /// This run's stop token (a child of its stage's).
    stop: CancellationToken,
    handle: Option<JoinHandle<()>>,
    /// Starts so far, the first included.
    starts: Arc<Mutex<u32>>,
}

/// Runs the components and stops them stage by stage. Cheap to share: `&self` everywhere.
pub(crate) struct Supervisor {
    tokens: [CancellationToken; 3],
    components: Mutex<BTreeMap<String, Component>>,
}

impl Supervisor {
    pub(crate) fn new() -> Self {
        Self {
            tokens: [
                CancellationToken::new(),
                CancellationToken::new(),
                CancellationToken::new(),
            ],
            components: Mutex::new(BTreeMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Component>> {
        // A panic while holding this lock cannot leave the map half-updated (every update is
        // one insert or field store), so a poisoned lock is still good to use.
        self.components
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Runs `factory`'s component until its stage stops, starting it again when it fails or
    /// ends on its own (after a back-off, said on stderr and in cluster.log).
    pub(crate) fn spawn(&self, name: impl Into<String>, stage: Stage, factory: Factory) {
        let name = name.into();
        let stop = self.tokens[stage as usize].child_token();
        let starts = Arc::new(Mutex::new(0));
        let handle = supervise(name.clone(), factory.clone(), stop.clone(), starts.clone());
        self.lock().insert(
            name,
            Component {
                stage,
                factory,
                stop,
                handle: Some(handle),
                starts,
            },
        );
    }

    /// The names of every component, sorted.
    pub(crate) fn names(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    /// How many times `name` has been started (1 for one that never restarted).
    pub(crate) fn starts(&self, name: &str) -> Option<u32> {
        self.lock().get(name).map(|c| {
            *c.starts
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        })
    }

    /// Whether `name`'s task runs (false after [`Supervisor::kill`]).
    pub(crate) fn is_running(&self, name: &str) -> bool {
        self.lock()
            .get(name)
            .and_then(|c| c.handle.as_ref())
            .is_some_and(|h| !h.is_finished())
    }

    /// The in-process SIGKILL: drops `name`'s task where it stands. Its sockets, mounts and
    /// half-done operations stay as a killed process leaves them; nothing restarts it until
    /// [`Supervisor::start`].
    pub(crate) fn kill(&self, name: &str) -> Result<(), Error> {
        let mut components = self.lock();
        let c = components.get_mut(name).ok_or_else(|| unknown(name))?;
        if let Some(h) = c.handle.take() {
            h.abort();
        }
        tracing::warn!(component = %name, "killed");
        Ok(())
    }

    /// Starts a killed component again (a no-op for a running one).
    pub(crate) fn start(&self, name: &str) -> Result<(), Error> {
        let mut components = self.lock();
        let c = components.get_mut(name).ok_or_else(|| unknown(name))?;
        if c.handle.as_ref().is_some_and(|h| !h.is_finished()) {
            return Ok(());
        }
        c.stop = self.tokens[c.stage as usize].child_token();
        c.handle = Some(supervise(
            name.to_string(),
            c.factory.clone(),
            c.stop.clone(),
            c.starts.clone(),
        ));
        Ok(())
    }

    /// Stops `name` gracefully and starts it again: its factory runs anew, so it picks up
    /// what changed (a migration gate).
    pub(crate) async fn restart(&self, name: &str) -> Result<(), Error> {
        let (stop, handle) = {
            let mut components = self.lock();
            let c = components.get_mut(name).ok_or_else(|| unknown(name))?;
            (c.stop.clone(), c.handle.take())
        };
        stop.cancel();
        if let Some(h) = handle {
            let abort = h.abort_handle();
            if tokio::time::timeout(STOP_PATIENCE, h).await.is_err() {
                tracing::warn!(component = %name, "did not stop in time; aborted");
                abort.abort();
            }
        }
        tracing::info!(component = %name, "restarting");
        self.start(name)
    }

    /// Stops every stage in order, waiting for each (aborting what does not stop in time).
    pub(crate) async fn stop(&self) {
        for stage in STAGES {
            self.tokens[stage as usize].cancel();
            let handles: Vec<(String, JoinHandle<()>)> = self
                .lock()
                .iter_mut()
                .filter(|(_, c)| c.stage == stage)
                .filter_map(|(n, c)| c.handle.take().map(|h| (n.clone(), h)))
                .collect();
            for (name, h) in handles {
                let abort = h.abort_handle();
                if tokio::time::timeout(STOP_PATIENCE, h).await.is_err() {
                    tracing::warn!(component = %name, "did not stop in time; aborted");
                    abort.abort();
                }
            }
        }
    }
}

fn unknown(name: &str) -> Error {
    Error::Config(format!("no component named {name:?}"))
}

/// Runs the component until `stop`, restarting it with a back-off when it ends before.
fn supervise(
    name: String,
    factory: Factory,
    stop: CancellationToken,
    starts: Arc<Mutex<u32>>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut backoff = BACKOFF_INITIAL;
        loop {
            *starts
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) += 1;
            let result = run_isolated(&name, &factory, stop.clone()).await;
            if stop.is_cancelled() {
                match result {
                    Ok(()) => tracing::info!(component = %name, "stopped"),
                    Err(e) => {
                        tracing::warn!(component = %name, error = %e, "stopped with an error")
                    }
                }
                return;
            }
            let why = match result {
                Ok(()) => "ended on its own".to_string(),
                Err(e) => format!("failed: {e}"),
            };
            tracing::error!(component = %name, why = %why, restart_in = ?backoff, "component down");
            eprintln!(
                "csi-cluster: {name} {why}; starting it again in {:.0} s",
                backoff.as_secs_f64()
            );
            tokio::select! {
                () = tokio::time::sleep(backoff) => {}
                () = stop.cancelled() => return,
            }
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    })
}

/// Blocking calls (mounts, mkfs, file reads) a component runs at once; more wait their turn.
/// tokio's default is 512 per runtime: at 1,000 pods the ten node agents held ~235 threads,
/// each with its stack and a share of malloc's arenas, for work two cores do a few at a time.
const MAX_BLOCKING_THREADS: usize = 32;

/// One run of a component on its own thread and current-thread runtime. Dropping the returned
/// future (the supervisor's task aborted by a kill) ends the runtime and drops every task the
/// component spawned on it; blocking calls already under way (a mount) finish on their own,
/// as a syscall of a killed process does.
async fn run_isolated(name: &str, factory: &Factory, stop: CancellationToken) -> RunResult {
    let (result_tx, result_rx) = tokio::sync::oneshot::channel();
    // Never sent: dropping it (with this future) is the kill.
    let (kill_tx, kill_rx) = tokio::sync::oneshot::channel::<()>();
    let factory = factory.clone();
    let thread_name: String = name.chars().take(15).collect();
    let spawned = std::thread::Builder::new()
        .name(thread_name.clone())
        .spawn(move || {
            // Its blocking pool (file reads, mounts) under its name too: `perf` and `top -H`
            // then say which component the time is spent for.
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .thread_name(thread_name)
                .max_blocking_threads(MAX_BLOCKING_THREADS)
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    let _ = result_tx.send(Err(format!("building its runtime: {e}")));
                    return;
                }
            };
            let result = runtime.block_on(async move {
                tokio::select! {
                    r = factory(stop) => Some(r),
                    _ = kill_rx => None,
                }
            });
            runtime.shutdown_background();
            if let Some(r) = result {
                let _ = result_tx.send(r);
            }
        });
    if let Err(e) = spawned {
        return Err(format!("starting its thread: {e}"));
    }
    let result = result_rx.await;
    drop(kill_tx);
    result.unwrap_or_else(|_| Err("its runtime ended without a result".into()))
}

impl Drop for Supervisor {
    /// An `up` that failed half-way: whatever was started stops.
    fn drop(&mut self) {
        for t in &self.tokens {
            t.cancel();
        }
        for c in self.lock().values() {
            if let Some(h) = &c.handle {
                h.abort();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A component that counts its starts and, while `fail` is set, fails at once.
    fn counting(fail: Arc<std::sync::atomic::AtomicBool>, runs: Arc<AtomicU32>) -> Factory {
        Arc::new(move |stop: CancellationToken| {
            let fail = fail.clone();
            let runs = runs.clone();
            run(async move {
                runs.fetch_add(1, Ordering::SeqCst);
                if fail.load(Ordering::SeqCst) {
                    return Err("boom");
                }
                stop.cancelled().await;
                Ok(())
            })
        })
    }

    #[tokio::test]
    async fn a_failed_component_starts_again_after_a_backoff() {
        let sup = Supervisor::new();
        let fail = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let runs = Arc::new(AtomicU32::new(0));
        sup.spawn(
            "c",
            Stage::Controllers,
            counting(fail.clone(), runs.clone()),
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "no restart before the back-off"
        );
        fail.store(false, Ordering::SeqCst);
        tokio::time::sleep(BACKOFF_INITIAL + Duration::from_millis(500)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        assert_eq!(sup.starts("c"), Some(2));
        assert!(sup.is_running("c"));
        sup.stop().await;
        assert!(!sup.is_running("c"));
    }

    /// What a component spawns dies with it on a kill (as a process's threads do), and a
    /// restart's graceful stop reaches it through the stop token.
    #[tokio::test]
    async fn a_kill_ends_the_tasks_a_component_spawned() {
        let sup = Supervisor::new();
        let ticks = Arc::new(AtomicU32::new(0));
        let counted = ticks.clone();
        sup.spawn(
            "spawner",
            Stage::Controllers,
            Arc::new(move |stop: CancellationToken| {
                let ticks = counted.clone();
                run(async move {
                    tokio::spawn(async move {
                        loop {
                            ticks.fetch_add(1, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    });
                    stop.cancelled().await;
                    Ok::<(), String>(())
                })
            }),
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(ticks.load(Ordering::SeqCst) > 0, "the spawned task ran");
        sup.kill("spawner").unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let after_kill = ticks.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            ticks.load(Ordering::SeqCst),
            after_kill,
            "a task the killed component spawned still runs"
        );
        sup.start("spawner").unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            ticks.load(Ordering::SeqCst) > after_kill,
            "runs again after start"
        );
        sup.stop().await;
        assert!(!sup.is_running("spawner"));
    }

    #[tokio::test]
    async fn kill_start_and_restart() {
        let sup = Supervisor::new();
        let fail = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let runs = Arc::new(AtomicU32::new(0));
        sup.spawn("c", Stage::Drivers, counting(fail, runs.clone()));
        tokio::time::sleep(Duration::from_millis(50)).await;
        sup.kill("c").unwrap();
        tokio::time::sleep(BACKOFF_INITIAL * 2).await;
        assert!(!sup.is_running("c"), "a killed component stays down");
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        sup.start("c").unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        sup.restart("c").await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 3);
        assert_eq!(sup.starts("c"), Some(3));
        assert!(sup.kill("nope").unwrap_err().to_string().contains("nope"));
        sup.stop().await;
    }
}
