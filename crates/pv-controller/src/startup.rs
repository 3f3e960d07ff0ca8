//! The whole pv-controller process on a given client: metrics and health server, leader
//! election, controller.

use std::sync::Arc;

use kube::Client;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::Error;
use crate::config::Config;
use crate::controller::Controller;
use crate::metrics::Metrics;

/// The User-Agent the binary's client sends (the audit trail tells the controller's writes by
/// it).
pub fn user_agent() -> String {
    format!("pv-controller/{}", env!("CARGO_PKG_VERSION"))
}

/// Runs the controllers on `client` until `shutdown` is cancelled (SIGTERM in the binary).
///
/// With `config.leader_election`, only the holder of the Lease works; the election uses a
/// clone of `client` (give the binary's client no rate limit that could delay a renewal, or
/// build the controller's with `sidecar::build_client` as `main.rs` does). With
/// `config.http_endpoint`, `/metrics`, `/healthz` and `/readyz` are served there.
pub async fn run(client: Client, config: Config, shutdown: CancellationToken) -> Result<(), Error> {
    let mut registry = Registry::default();
    let metrics = Arc::new(Metrics::register(&mut registry));
    let controller = Controller::new(
        client.clone(),
        config.options.clone(),
        config.cloud.clone(),
        metrics,
        config.shared_caches.clone(),
    );
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
    tracing::info!(
        migrated = %config.options.migrated,
        cloud = config.cloud.is_some(),
        "starting the persistentvolume controller"
    );
    let result = match config.leader_election.clone() {
        Some(lease) => {
            tracing::info!(lease = %lease.lease_name, namespace = %lease.namespace, identity = %lease.identity, "leader election on");
            sidecar::run_as_leader_with_health(
                client,
                lease,
                health.clone(),
                shutdown.clone(),
                |token| controller.run(token),
            )
            .await
            .map_err(Error::from)
        }
        None => controller.run(shutdown.clone()).await,
    };
    if let Some(server) = http {
        server.shutdown().await;
    }
    result
}
