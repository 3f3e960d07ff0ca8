//! Plugin registration (the kubelet's `pluginmanager` with its CSI registration handler).
//!
//! Drivers announce themselves with a unix socket in `<root-dir>/plugins_registry/` (usually
//! the `csi-node-driver-registrar` sidecar's `<driver>-reg.sock`) that serves the
//! `pluginregistration.v1` `Registration` service. For each socket the manager:
//!
//! 1. dials it and calls `GetInfo` (10 s to connect, 1 s for the call, as the kubelet);
//! 2. checks the answer as the kubelet's CSI handler does: type `CSIPlugin` (the only type
//!    handled here; the kubelet also handles `DevicePlugin`), a name, a 1.x CSI version among
//!    `supported_versions`; an empty `endpoint` means the registration socket itself;
//! 3. calls NodeGetInfo (node ID required) and NodeGetCapabilities on the driver's endpoint;
//! 4. records the driver on the Node and its CSINode ([`NodeInfoManager::install_driver`]) and
//!    in the [`DriverRegistry`];
//! 5. answers `NotifyRegistrationStatus(true)`, or `(false, reason)` after any failure in
//!    steps 2–4.
//!
//! A socket that goes away (or is replaced by a new one at the same path: a restarted
//! registrar) deregisters its driver: out of the registry and the CSINode, topology labels
//! kept. A driver name registered again from another socket replaces the earlier registration;
//! the earlier socket's removal then leaves the driver alone.
//!
//! **Watching**: the kubelet uses fsnotify; we poll the directory every 200 ms and compare
//! (path, device, inode, mtime, ctime). Polling cannot miss an event (no watch to set up on new
//! subdirectories, no queue overflow) and costs one `readdir` per tick; a socket deleted and
//! created again between two polls still shows as replaced because its inode or times differ.
//!
//! **Retries**: the kubelet's reconciler retries a failed registration with exponential
//! backoff (500 ms doubling to about 2 min) and at once when the socket changes; so do we, per
//! socket. At most one operation runs per socket at a time; sockets are handled concurrently.
//!
//! **Metric**: `plugin_manager_total_plugins{socket_path, state}` (states
//! `desired_state_of_world`: sockets found; `actual_state_of_world`: registered).

mod handler;
mod metrics;
mod validation;
mod watcher;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use component_runtime::workqueue::{Backoff, Failures};

use self::handler::{CsiHandler, Registered};
use self::metrics::Metrics;
use self::watcher::SocketId;
use crate::drivers::DriverRegistry;
use crate::nodeinfomanager::NodeInfoManager;

/// How often the registry directory is scanned.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(200);
/// First pause before retrying a failed registration (the kubelet's).
pub const DEFAULT_RETRY_INITIAL: Duration = Duration::from_millis(500);
/// Longest pause between retries of a failed registration (the kubelet's 2 min 2 s).
pub const DEFAULT_RETRY_MAX: Duration = Duration::from_secs(122);

/// Watches the plugin registry directory and (de)registers CSI drivers.
pub struct PluginManager {
    registry_dir: PathBuf,
    handler: Arc<CsiHandler>,
    metrics: Metrics,
    poll_interval: Duration,
    retry: Backoff,
}

impl std::fmt::Debug for PluginManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginManager")
            .field("registry_dir", &self.registry_dir)
            .field("poll_interval", &self.poll_interval)
            .finish_non_exhaustive()
    }
}

/// What a finished operation reports back to the loop.
enum Outcome {
    Registered(SocketId, Result<Registered, String>),
    Deregistered,
}

impl PluginManager {
    /// `registry_dir`: `<root-dir>/plugins_registry` (created by [`PluginManager::run`] if
    /// missing). Registers `plugin_manager_total_plugins` in `registry`.
    pub fn new(
        registry_dir: PathBuf,
        drivers: DriverRegistry,
        node_info: NodeInfoManager,
        registry: &mut prometheus_client::registry::Registry,
    ) -> Self {
        Self {
            registry_dir,
            handler: Arc::new(CsiHandler::new(drivers, node_info)),
            metrics: Metrics::register(registry),
            poll_interval: DEFAULT_POLL_INTERVAL,
            retry: Backoff {
                start: DEFAULT_RETRY_INITIAL,
                max: DEFAULT_RETRY_MAX,
            },
        }
    }

    /// Scans the directory every `interval` instead of [`DEFAULT_POLL_INTERVAL`].
    pub fn with_poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval.max(Duration::from_millis(1));
        self
    }

    /// Retries failed registrations after `initial`, doubling up to `max`, instead of the
    /// kubelet's 500 ms … 2 min 2 s.
    pub fn with_retry_backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.retry = Backoff {
            start: initial,
            max: max.max(initial),
        };
        self
    }

    /// Runs until `stop`: watches the directory and (de)registers drivers. Operations still
    /// running at `stop` are abandoned (registrations stay on the CSINode, as the kubelet
    /// leaves them when it stops).
    pub async fn run(self, stop: CancellationToken) {
        let dir = self.registry_dir.clone();
        if let Err(e) = std::fs::create_dir_all(&dir) {
            tracing::error!(dir = %dir.display(), error = %e, "cannot create the plugin registry directory; retrying while watching");
        }
        tracing::info!(dir = %dir.display(), interval = ?self.poll_interval, "watching for plugin registration sockets");
        let mut state = State {
            actual: HashMap::new(),
            in_flight: HashMap::new(),
            failures: Failures::new(self.retry),
            ops: JoinSet::new(),
            desired_metric: BTreeSet::new(),
            actual_metric: BTreeSet::new(),
            scan_error: None,
        };
        let mut ticker = tokio::time::interval(self.poll_interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                done = state.ops.join_next_with_id(), if !state.ops.is_empty() => {
                    self.finished(&mut state, done);
                }
                _ = ticker.tick() => {
                    match watcher::scan(&dir) {
                        Ok(desired) => {
                            state.scan_error = None;
                            self.reconcile(&mut state, &desired);
                        }
                        Err(e) => {
                            let message = e.to_string();
                            if state.scan_error.as_deref() != Some(message.as_str()) {
                                tracing::error!(dir = %dir.display(), error = %message, "cannot read the plugin registry directory");
                                state.scan_error = Some(message);
                            }
                            if e.kind() == std::io::ErrorKind::NotFound {
                                let _ = std::fs::create_dir_all(&dir);
                            }
                        }
                    }
                }
            }
        }
        state.ops.shutdown().await;
        tracing::info!(dir = %dir.display(), "plugin manager stopped");
    }

    /// One pass of the kubelet's reconciler: deregister what is registered but gone or
    /// replaced, then register what is there but not registered (failures after backoff).
    fn reconcile(&self, state: &mut State, desired: &BTreeMap<PathBuf, SocketId>) {
        state.desired_metric =
            self.metrics
                .set(metrics::DESIRED, &state.desired_metric, desired.keys());

        let stale: Vec<PathBuf> = state
            .actual
            .iter()
            .filter(|(path, (id, _))| {
                !state.in_flight.contains_key(*path) && desired.get(*path) != Some(id)
            })
            .map(|(path, _)| path.clone())
            .collect();
        for path in stale {
            let Some((id, registered)) = state.actual.remove(&path) else {
                continue;
            };
            let handler = Arc::clone(&self.handler);
            let socket = path.clone();
            let task = state.ops.spawn(async move {
                handler.deregister(&socket, id, &registered).await;
                Outcome::Deregistered
            });
            state.in_flight.insert(path, task.id());
        }

        state.failures.retain(|path| desired.contains_key(path));
        for (path, id) in desired {
            if state.actual.contains_key(path)
                || state.in_flight.contains_key(path)
                || state.failures.backing_off(path, id)
            {
                continue;
            }
            let handler = Arc::clone(&self.handler);
            let (socket, id) = (path.clone(), *id);
            let task = state
                .ops
                .spawn(async move { Outcome::Registered(id, handler.register(&socket, id).await) });
            state.in_flight.insert(path.clone(), task.id());
        }

        state.actual_metric =
            self.metrics
                .set(metrics::ACTUAL, &state.actual_metric, state.actual.keys());
    }

    fn finished(
        &self,
        state: &mut State,
        done: Option<Result<(tokio::task::Id, Outcome), tokio::task::JoinError>>,
    ) {
        let (task, outcome) = match done {
            None => return,
            Some(Ok((task, outcome))) => (task, Some(outcome)),
            Some(Err(e)) => {
                tracing::error!(error = %e, "a plugin registration task failed");
                (e.id(), None)
            }
        };
        let Some(path) = state
            .in_flight
            .iter()
            .find(|(_, t)| **t == task)
            .map(|(p, _)| p.clone())
        else {
            return;
        };
        state.in_flight.remove(&path);
        match outcome {
            Some(Outcome::Registered(id, Ok(registered))) => {
                state.failures.succeeded(&path);
                state.actual.insert(path, (id, registered));
                state.actual_metric =
                    self.metrics
                        .set(metrics::ACTUAL, &state.actual_metric, state.actual.keys());
            }
            Some(Outcome::Registered(id, Err(reason))) => {
                let pause = state.failures.failed(&path, id);
                tracing::warn!(
                    socket = %path.display(),
                    error = %reason,
                    retry_in = ?pause,
                    "plugin registration failed"
                );
            }
            Some(Outcome::Deregistered) | None => {}
        }
    }
}

/// The reconciler's memory (the kubelet's actual state of the world plus its pending
/// operations).
struct State {
    /// Registered sockets: identity at registration and what they registered.
    actual: HashMap<PathBuf, (SocketId, Registered)>,
    /// Sockets with a running operation.
    in_flight: HashMap<PathBuf, tokio::task::Id>,
    /// Sockets whose registration failed: retried once their backoff passes, or at once
    /// when the socket changes.
    failures: Failures<PathBuf, SocketId>,
    ops: JoinSet<Outcome>,
    desired_metric: BTreeSet<PathBuf>,
    actual_metric: BTreeSet<PathBuf>,
    /// The last scan error, logged once until it changes.
    scan_error: Option<String>,
}
