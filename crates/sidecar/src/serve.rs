//! The end of every sidecar's start-up, shared by csi-attacher and csi-provisioner.

use std::future::Future;

use tokio_util::sync::CancellationToken;

use crate::{Error, Health, LeaderElectionConfig};

/// What a sidecar's `run` does once its controller is built, as the Go sidecars do: metrics and
/// health on `--http-endpoint` (with the leader gauge when elections are on), then `work` under
/// the Lease `lease` (or at once when it is `None`), then the HTTP server stopped.
pub async fn serve_and_run<F, Fut, E>(
    common: &crate::CommonFlags,
    mut registry: prometheus_client::registry::Registry,
    lease: Option<LeaderElectionConfig>,
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
    if let Some(lease) = &lease {
        health.register_leader_metric(&mut registry, &lease.lease_name);
    }
    let registry = std::sync::Arc::new(registry);
    let http = match common.http_endpoint_addr() {
        Some(addr) => {
            let server =
                crate::serve_http(addr, &common.metrics_path, registry.clone(), health.clone())
                    .await?;
            tracing::info!(address = %server.local_addr(), "serving metrics and health");
            Some(server)
        }
        None => None,
    };
    health.set_ready(true);
    let result = match lease {
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
