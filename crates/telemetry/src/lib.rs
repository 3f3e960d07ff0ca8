//! Process plumbing every binary of the project shares, with no Kubernetes client in it, so
//! the EBS driver can use it as well as the sidecars (`component-runtime` re-exports all of it):
//!
//! - [`logging`]: klog's `-v` mapped onto tracing for **our** crates only; libraries (kube,
//!   hyper, h2, rustls, tonic, aws-*) stay at info, as the Go sidecars' `-v` leaves client-go's
//!   transport alone. `RUST_LOG` overrides everything. Text or JSON (`--logging-format`).
//! - [`signals`]: SIGTERM / SIGINT to a `CancellationToken`.
//! - [`go_flags`]: Go's `-flag` / `-v=5` command-line syntax rewritten for clap.
//! - [`http`]: metrics (OpenMetrics text) and health endpoints on `--http-endpoint`.

pub mod go_flags;
pub mod http;
pub mod logging;
pub mod signals;

pub use go_flags::{normalize_go_args, parse_go_bool, parse_go_duration};
pub use http::{Health, HttpServer, METRICS_CONTENT_TYPE, ReadyCheck, serve_http};
pub use logging::{LogFormat, OUR_TARGETS, init_logging, init_logging_with, level_for_verbosity};
pub use signals::shutdown_on_signals;

/// Errors of the process plumbing.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The HTTP endpoint is malformed or cannot be bound.
    #[error("--http-endpoint {addr:?}: {reason}")]
    HttpBind { addr: String, reason: String },
}
