//! The whole controller process on a given client: health server, leader election, the loop.

use std::sync::Arc;

use kube::Client;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::Error;
use crate::config::Config;
use crate::controller::Controller;

/// The User-Agent the binary's client sends.
pub fn user_agent() -> String {
    format!("statefulset-controller/{}", env!("CARGO_PKG_VERSION"))
}

/// Runs the controller on `client` until `shutdown` is cancelled (SIGTERM in the binary).
/// `Config::default()` is the in-process controller: no HTTP server, no leader election.
pub async fn run(client: Client, config: Config, shutdown: CancellationToken) -> Result<(), Error> {
    let mut registry = Registry::default();
    let health = sidecar::Health::default();
    if let Some(lease) = &config.leader_election {
        health.register_leader_metric(&mut registry, &lease.lease_name);
    }
    let registry = Arc::new(registry);
    let http = match &config.http_endpoint {
        Some(addr) => {
            let server = sidecar::serve_http(addr, "/metrics", registry, health.clone()).await?;
            tracing::info!(address = %server.local_addr(), "serving health");
            Some(server)
        }
        None => None,
    };
    health.set_ready(true);
    let work = {
        let client = client.clone();
        let config = config.clone();
        move |token: CancellationToken| async move {
            match Controller::start(client, config, &token).await? {
                Some(controller) => controller.run(token).await,
                None => Ok(()),
            }
        }
    };
    let result = match config.leader_election.clone() {
        Some(lease) => sidecar::run_as_leader_with_health(
            client,
            lease,
            health.clone(),
            shutdown.clone(),
            work,
        )
        .await
        .map_err(Error::from),
        None => work(shutdown.clone()).await,
    };
    if let Some(server) = http {
        server.shutdown().await;
    }
    result
}
