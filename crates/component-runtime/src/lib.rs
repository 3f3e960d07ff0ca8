//! The runtime every component runs on: the CSI sidecars, kube-controller-manager's
//! controllers, the scheduler and the node agent (kube-rs' `kube-runtime` and client-go's
//! component-base together).
//!
//! - [`flags`]: Go `flag` syntax on top of clap ([`normalize_go_args`]), Go durations and
//!   booleans, and the [`CommonFlags`] every sidecar takes with the Go sidecars' defaults
//!   (their leader election group, [`LeaderElectionFlags`], also on its own).
//! - [`controller_flags`]: the flag groups of the kube-controller-manager-style components
//!   (client, `--leader-elect*`, `--http-endpoint`/`--metrics-path`/`-v`).
//! - [`object_cache`], [`shared_caches`]: watch-fed caches of one kind, shared by the
//!   components of one process as kube-controller-manager shares its informers;
//!   [`wait_all_ready`] waits for a component's caches to fill.
//! - [`serve_and_run`]: the end of every controller's start-up (metrics and health, work
//!   under a Lease).
//! - [`kube_client`]: a `kube::Client` whose every request waits on a client-go style token
//!   bucket (`--kube-api-qps` / `--kube-api-burst`) and carries the sidecar's User-Agent.
//! - [`csi_conn`]: dial the driver's unix socket with retries, Probe it, read its name and
//!   controller capabilities.
//! - [`leader`]: leader election on a `coordination.k8s.io/v1` Lease that is released on
//!   shutdown and watched by candidates, so failover takes well under two seconds.
//! - [`http`]: metrics and health endpoints on `--http-endpoint`.
//! - [`events`]: core/v1 Events recorded as client-go's recorder does (a repeat bumps the
//!   first Event's count).
//! - [`node_selector`]: Kubernetes' NodeSelector rules, shared by the scheduler, the PV
//!   controller and the provisioner's node deployment.
//! - [`metrics`]: `csi_sidecar_operations_seconds`, labelled as csi-lib-utils labels it.
//! - [`workqueue`]: client-go's rate-limited work queue (dedup, one worker per key, per-key
//!   exponential backoff) with lanes and the `workqueue_*` metrics; the attacher's and the
//!   provisioner's controllers run on it.
//! - [`run_component`]: a binary's `main` around its `run` (logging, TLS provider, the tokio
//!   runtime of a [`RuntimeShape`], shutdown on signals).
//! - [`init_logging`] and [`shutdown_on_signals`]: klog-like verbosity (our crates only) to
//!   tracing, SIGTERM/SIGINT to a token.
//!
//! [`http`], logging and signals live in the kube-free `telemetry` crate (the EBS driver uses
//! them without a Kubernetes client) and are re-exported here.

pub mod controller_flags;
pub mod csi_conn;
pub mod events;
pub mod flags;
pub mod kube_client;
pub mod leader;
pub mod metrics;
pub mod node_selector;
pub mod object_cache;
mod process;
mod serve;
pub mod shared_caches;
pub mod workqueue;

pub use telemetry::http;

use std::path::PathBuf;
use std::time::Duration;

pub use controller_flags::{
    CloudFlags, ControllerFlags, KubeClientFlags, LeaderElectFlags, TelemetryFlags,
};
pub use csi_conn::{DriverInfo, connect, connect_and_describe, driver_info, probe_until_ready};
pub use events::{EventRecorder, EventType, Recorded};
pub use flags::{
    CommonFlags, LeaderElectionFlags, go_bools, normalize_go_args, parse_go_bool, parse_go_duration,
};
pub use kube_client::{build_client, install_crypto_provider, rate_limited};
pub use leader::{
    LeaderElectionConfig, default_identity, default_namespace, lease_name, run_as_leader,
    run_as_leader_with_health, sanitize_driver_name,
};
pub use metrics::OperationMetrics;
pub use object_cache::{
    CacheNotReady, CachedKind, ObjectCache, Readiness, ScopedPolicy, wait_all_ready, watch_events,
};
pub use process::{RuntimeShape, run_component};
pub use serve::{Serving, serve_and_run};
pub use shared_caches::SharedCaches;
pub use telemetry::{Health, HttpServer, init_logging, shutdown_on_signals};

/// Binds `addr` (`host:port`, or Go's `:port`) and serves `registry` at `metrics_path` plus
/// the health endpoints; see [`telemetry::serve_http`].
pub async fn serve_http(
    addr: &str,
    metrics_path: &str,
    registry: std::sync::Arc<prometheus_client::registry::Registry>,
    health: Health,
) -> Result<HttpServer, Error> {
    Ok(telemetry::serve_http(addr, metrics_path, registry, health).await?)
}

/// Errors of the sidecar plumbing. Each variant names what failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The CSI endpoint could not be parsed or dialled.
    #[error("CSI driver at {address:?}: {source}")]
    CsiEndpoint {
        address: String,
        #[source]
        source: csi_spec::Error,
    },
    /// The driver's socket did not accept a connection within `--connection-timeout`.
    #[error(
        "CSI driver at {address:?}: no connection within {timeout:?} (--connection-timeout); last error: {last_error}"
    )]
    ConnectTimeout {
        address: String,
        timeout: Duration,
        last_error: String,
    },
    /// The driver did not report ready within the allowed time.
    #[error("CSI driver did not become ready within {timeout:?}: {last_error}")]
    ProbeTimeout {
        timeout: Duration,
        last_error: String,
    },
    /// A CSI call failed.
    #[error("CSI {method} failed: {status}")]
    Csi {
        method: &'static str,
        status: Box<tonic::Status>,
    },
    /// The driver answered with something the spec does not allow.
    #[error("CSI {method}: {reason}")]
    CsiResponse {
        method: &'static str,
        reason: String,
    },
    /// No kubeconfig could be loaded (neither the given file, in-cluster, nor the defaults).
    #[error("Kubernetes client configuration: {0}")]
    KubeConfig(String),
    /// The kubeconfig file could not be read or used.
    #[error("kubeconfig {}: {reason}", path.display())]
    Kubeconfig { path: PathBuf, reason: String },
    /// `--kube-api-qps` / `--kube-api-burst` / user agent were not usable.
    #[error("Kubernetes client: {0}")]
    ClientSettings(String),
    /// Building the kube client failed.
    #[error("building the Kubernetes client: {0}")]
    Client(#[source] kube::Error),
    /// A Kubernetes API call failed.
    #[error("{what}: {source}")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
    /// A flag's value cannot be used; the message names the flag.
    #[error("{0}")]
    Flag(String),
    /// The leader election settings are inconsistent.
    #[error("leader election: {0}")]
    LeaderConfig(String),
    /// This process held the lease and lost it (renew deadline passed or someone else took it).
    #[error("leader election: lost the lease {namespace}/{name} (identity {identity}): {reason}")]
    LostLeadership {
        namespace: String,
        name: String,
        identity: String,
        reason: String,
    },
    /// The work run under the lease failed.
    #[error("the work run as leader failed: {0}")]
    Work(String),
    /// Shutdown came before the start-up step named here was done.
    #[error("shut down before {0}")]
    ShutDown(&'static str),
    /// The metrics/health HTTP endpoint is malformed or cannot be bound.
    #[error(transparent)]
    Http(#[from] telemetry::Error),
}
