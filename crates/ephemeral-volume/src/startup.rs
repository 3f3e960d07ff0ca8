//! The whole controller process on a given client: metrics and health server, leader
//! election, controller.

use kube::Client;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::Error;
use crate::config::Config;
use crate::controller::Controller;
use crate::metrics::Metrics;

/// The User-Agent the binary's client sends.
pub fn user_agent() -> String {
    format!(
        "csi-ephemeral-volume-controller/{}",
        env!("CARGO_PKG_VERSION")
    )
}

/// Runs the controller on `client` until `shutdown` is cancelled (SIGTERM in the binary).
///
/// With `config.serving.leader_election`, only the holder of the Lease works. With
/// `config.serving.http_endpoint`, `/metrics`, `/healthz` and `/readyz` are served there.
pub async fn run(client: Client, config: Config, shutdown: CancellationToken) -> Result<(), Error> {
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let controller = Controller::new(
        client.clone(),
        config.options.clone(),
        metrics,
        config.shared_caches.clone(),
    );
    tracing::info!(
        delete_orphaned_claims = config.options.delete_orphaned_claims,
        "starting the ephemeral volume controller"
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
