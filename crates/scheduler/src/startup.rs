//! The whole scheduler process on a given client: metrics and health server, leader election,
//! the scheduling loop.

use std::sync::Arc;

use kube::Client;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::Error;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::scheduling::Scheduler;

/// The User-Agent the binary's client sends.
pub fn user_agent() -> String {
    format!("csi-scheduler/{}", env!("CARGO_PKG_VERSION"))
}

/// Schedules pods on `client` until `shutdown` is cancelled (SIGTERM in the binary).
///
/// `Config::default()` is the in-process scheduler: no HTTP server, no leader election. With
/// `config.leader_election` only the holder of the Lease schedules; with `config.http_endpoint`,
/// `/metrics`, `/healthz` and `/readyz` are served there.
pub async fn run(client: Client, config: Config, shutdown: CancellationToken) -> Result<(), Error> {
    let mut registry = Registry::default();
    let metrics = Arc::new(Metrics::register(&mut registry, &config.scheduler_name));
    let health = sidecar::Health::default();
    if let Some(lease) = &config.leader_election {
        health.register_leader_metric(&mut registry, &lease.lease_name);
    }
    let registry = Arc::new(registry);
    let http = match &config.http_endpoint {
        Some(addr) => {
            let server =
                sidecar::serve_http(addr, &config.metrics_path, registry.clone(), health.clone())
                    .await?;
            tracing::info!(address = %server.local_addr(), "serving metrics and health");
            Some(server)
        }
        None => None,
    };
    health.set_ready(true);
    let work = {
        let client = client.clone();
        let config = config.clone();
        move |token: CancellationToken| async move {
            match Scheduler::start(client, config, metrics, &token).await? {
                Some(scheduler) => scheduler.run(token).await,
                None => Ok(()),
            }
        }
    };
    let result = match config.leader_election.clone() {
        Some(lease) => {
            tracing::info!(lease = %lease.lease_name, namespace = %lease.namespace, identity = %lease.identity, "leader election on");
            sidecar::run_as_leader_with_health(
                client,
                lease,
                health.clone(),
                shutdown.clone(),
                work,
            )
            .await
            .map_err(Error::from)
        }
        None => work(shutdown.clone()).await,
    };
    if let Some(server) = http {
        server.shutdown().await;
    }
    result
}
