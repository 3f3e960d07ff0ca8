//! An embedded Kubernetes API server on loopback HTTPS: the ground the controllers run on. Every
//! request must authenticate with a bearer token (anonymous requests get 401, as from
//! kube-apiserver with `--anonymous-auth=false`); see `auth.rs`.
//!
//! It serves the REST API for the core, storage, coordination and events types the CSI stack
//! uses, and the apps and RBAC types its deployment manifests create, with the real server's semantics where clients can tell (resourceVersions, watch resume
//! and 410 Gone, optimistic concurrency, finalizers, status subresources, validation errors as
//! `Status` objects). kube-rs, kubectl and the Python client use it unchanged. Every request is
//! recorded for [`RunningApiServer::audit`] (who called what, as the real audit log names it).
//! `docs/apiserver.md` lists exactly what is served and how it differs from kube-apiserver.

mod app;
mod audit;
mod auth;
mod config;
mod discovery;
mod handlers;
mod http_util;
mod metrics;
mod protobuf;
mod request;
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

pub use audit::{AuditRecord, Sym};
pub use auth::{ADMIN_USER, UserInfo, write_private};
pub use config::Config;
pub use server::{ApiServer, RunningApiServer};

/// Installs rustls' `ring` provider as the process-wide default, once; later calls do nothing.
///
/// kube builds a rustls connector for every client, even for plain-HTTP URLs, and rustls picks
/// its provider from crate features. In a build that also links aws-sdk-ec2 (which enables
/// rustls' `aws-lc-rs`), both features are on and rustls refuses to guess, panicking inside
/// `kube::Client::try_from`. Every place that builds a kube client calls this first.
pub fn install_crypto_provider() {
    // Err only means a provider is already installed, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

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
    #[error("TLS or authentication setup: {0}")]
    Pki(String),
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
