//! The whole `attach-detach-controller` process: clients, metrics and health server, leader
//! election, controller.

use std::sync::Arc;

use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::Error;
use crate::config::Config;
use crate::controller::Controller;

/// The User-Agent of every API request (the audit trail tells the controller's writes by it).
pub fn user_agent() -> String {
    format!("attach-detach-controller/{}", env!("CARGO_PKG_VERSION"))
}

/// Runs the controller until `shutdown` is cancelled (SIGTERM in the binary).
///
/// Two kube clients: the controller's is rate-limited by `--kube-api-qps`/`--kube-api-burst`;
/// leader election has its own, so a busy controller never delays a lease renewal.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<(), Error> {
    let ua = user_agent();
    let client = sidecar::build_client(
        config.kubeconfig.as_deref(),
        &ua,
        config.kube_api_qps,
        config.kube_api_burst,
    )
    .await?;
    let mut registry = Registry::default();
    let controller = Controller::new(
        client,
        config.options.clone(),
        config.cloud.clone(),
        &mut registry,
    )
    .with_shared_caches(config.shared_caches.clone());
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
        skip_attach = %config.options.skip_attach,
        migrated = %config.options.migrated,
        cloud = config.cloud.is_some(),
        "starting the attach/detach controller"
    );
    let result = match config.leader_election.clone() {
        Some(lease) => {
            let election_client = sidecar::build_client(
                config.kubeconfig.as_deref(),
                &format!("{ua} leader-election"),
                -1.0,
                0,
            )
            .await?;
            tracing::info!(lease = %lease.lease_name, namespace = %lease.namespace, identity = %lease.identity, "leader election on");
            sidecar::run_as_leader_with_health(
                election_client,
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
