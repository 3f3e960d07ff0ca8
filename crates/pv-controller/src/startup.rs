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
/// With `config.serving.leader_election`, only the holder of the Lease works; the election uses a
/// clone of `client` (give the binary's client no rate limit that could delay a renewal, or
/// build the controller's with `component_runtime::build_client` as `main.rs` does). With
/// `config.serving.http_endpoint`, `/metrics`, `/healthz` and `/readyz` are served there.
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
    tracing::info!(
        migrated = %config.options.migrated,
        cloud = config.cloud.is_some(),
        "starting the persistentvolume controller"
    );
    component_runtime::serve_and_run(
        config.serving.clone(),
        registry,
        client,
        shutdown,
        |token| controller.run(token),
    )
    .await
}
