//! The whole controller process on a given client: health server, leader election, the loop.

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
    let registry = Registry::default();
    let serving = config.serving.clone();
    let work = {
        let client = client.clone();
        move |token: CancellationToken| async move {
            match Controller::start(client, config, &token).await? {
                Some(controller) => controller.run(token).await,
                None => Ok(()),
            }
        }
    };
    component_runtime::serve_and_run(serving, registry, client, shutdown, work).await
}
