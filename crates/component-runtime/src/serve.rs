//! The end of every controller's start-up: metrics and health served, the work run under a
//! Lease (or at once), the server stopped. Shared by the sidecars and kube-controller-manager's
//! controllers alike.

use std::future::Future;

use tokio_util::sync::CancellationToken;

use crate::{Error, Health, LeaderElectionConfig};

/// Where a component serves `/metrics`, `/healthz` and `/readyz`, and the Lease it works under.
#[derive(Clone, Debug)]
pub struct Serving {
    /// `--http-endpoint` (`host:port` or Go's `:port`); `None` or empty: no HTTP server.
    pub http_endpoint: Option<String>,
    /// `--metrics-path`.
    pub metrics_path: String,
    /// `None`: leader election off, the work starts at once.
    pub leader_election: Option<LeaderElectionConfig>,
}

impl Default for Serving {
    /// No HTTP server, no leader election (an in-process component).
    fn default() -> Self {
        Self {
            http_endpoint: None,
            metrics_path: "/metrics".into(),
            leader_election: None,
        }
    }
}

impl Serving {
    /// Serves `registry` at `metrics_path` and `health` on the endpoint, if there is one.
    pub async fn serve_http(
        &self,
        registry: std::sync::Arc<prometheus_client::registry::Registry>,
        health: &Health,
    ) -> Result<Option<crate::HttpServer>, Error> {
        let Some(addr) = self.http_endpoint.as_deref().filter(|a| !a.is_empty()) else {
            return Ok(None);
        };
        let server = crate::serve_http(addr, &self.metrics_path, registry, health.clone()).await?;
        tracing::info!(address = %server.local_addr(), "serving metrics and health");
        Ok(Some(server))
    }
}

/// Runs a component once its controller is built, as the Go components do: metrics and health
/// on `serving.http_endpoint` (with the `leader_election_master_status` gauge when elections are
/// on), then `work` under the Lease (or at once), then the HTTP server stopped.
///
/// `election_client` renews the Lease. Give it no rate limit, or a busy controller could delay
/// a renewal and lose the Lease; the binaries build a second client for it.
pub async fn serve_and_run<F, Fut, E>(
    serving: Serving,
    mut registry: prometheus_client::registry::Registry,
    election_client: kube::Client,
    shutdown: CancellationToken,
    work: F,
) -> Result<(), E>
where
    F: FnOnce(CancellationToken) -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: From<Error> + std::fmt::Display,
{
    let health = Health::default();
    if let Some(lease) = &serving.leader_election {
        health.register_leader_metric(&mut registry, &lease.lease_name);
    }
    let http = serving
        .serve_http(std::sync::Arc::new(registry), &health)
        .await?;
    health.set_ready(true);
    let result = match serving.leader_election {
        Some(lease) => {
            tracing::info!(lease = %lease.lease_name, namespace = %lease.namespace, identity = %lease.identity, "leader election on");
            crate::run_as_leader_with_health(election_client, lease, health.clone(), shutdown, work)
                .await
                .map_err(E::from)
        }
        None => {
            drop(election_client);
            work(shutdown).await
        }
    };
    if let Some(server) = http {
        server.shutdown().await;
    }
    result
}
