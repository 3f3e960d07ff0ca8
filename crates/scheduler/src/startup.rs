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
/// `config.serving.leader_election` only the holder of the Lease schedules; with `config.serving.http_endpoint`,
/// `/metrics`, `/healthz` and `/readyz` are served there.
pub async fn run(client: Client, config: Config, shutdown: CancellationToken) -> Result<(), Error> {
    let mut registry = Registry::default();
    let metrics = Arc::new(Metrics::register(&mut registry, &config.scheduler_name));
    let serving = config.serving.clone();
    let work = {
        let client = client.clone();
        move |token: CancellationToken| async move {
            match Scheduler::start(client, config, metrics, &token).await? {
                Some(scheduler) => scheduler.run(token).await,
                None => Ok(()),
            }
        }
    };
    component_runtime::serve_and_run(serving, registry, client, shutdown, work).await
}
