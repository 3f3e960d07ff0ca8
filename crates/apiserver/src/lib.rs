//! An embedded Kubernetes API server on loopback HTTP: the ground the controllers run on.
//!
//! It serves the REST API for the core, storage, coordination and events types the CSI stack
//! uses, with the real server's semantics where clients can tell (resourceVersions, watch resume
//! and 410 Gone, optimistic concurrency, finalizers, status subresources, validation errors as
//! `Status` objects). kube-rs, kubectl and the Python client use it unchanged.
//! `docs/apiserver.md` lists exactly what is served and how it differs from kube-apiserver.

mod discovery;
mod handlers;
mod http_util;
mod metrics;
mod resources;
mod selectors;
mod server;
mod status;
mod store;
mod table;
mod validation;
mod watch;

use std::net::SocketAddr;
use std::path::PathBuf;

pub use server::{ApiServer, Config, RunningApiServer};

/// Errors starting or running the server (request errors are answered as `Status` objects).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("data directory {}: {reason}", path.display())]
    DataDir { path: PathBuf, reason: String },
    #[error("cannot write the kubeconfig to {}: {source}", path.display())]
    Kubeconfig {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot build a kube client for {url}: {reason}")]
    Client { url: String, reason: String },
    #[error("cannot create the initial namespaces: {0}")]
    Seed(String),
    #[error("serving failed: {0}")]
    Serve(std::io::Error),
}

/// Runs the server until `shutdown` resolves (what `apiserver-lite` does).
pub async fn run(
    config: Config,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), Error> {
    let running = ApiServer::start(config).await?;
    tracing::info!(url = running.url(), "serving the Kubernetes API");
    shutdown.await;
    running.shutdown().await
}
