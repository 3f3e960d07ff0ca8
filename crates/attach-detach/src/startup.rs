//! The whole `attach-detach-controller` process: clients, metrics and health server, leader
//! election, controller.

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
    let client = component_runtime::build_client(
        config.kubeconfig.as_deref(),
        &ua,
        config.kube_api_qps,
        config.kube_api_burst,
    )
    .await?;
    let mut registry = Registry::default();
    let controller = Controller::new(
        client.clone(),
        config.options.clone(),
        config.cloud.clone(),
        &mut registry,
    )
    .with_shared_caches(config.shared_caches.clone());
    tracing::info!(
        skip_attach = %config.options.skip_attach,
        migrated = %config.options.migrated,
        cloud = config.cloud.is_some(),
        "starting the attach/detach controller"
    );
    let election_client = match config.serving.leader_election {
        Some(_) => {
            component_runtime::build_client(
                config.kubeconfig.as_deref(),
                &format!("{ua} leader-election"),
                -1.0,
                0,
            )
            .await?
        }
        None => client,
    };
    component_runtime::serve_and_run(
        config.serving.clone(),
        registry,
        election_client,
        shutdown,
        |token| controller.run(token),
    )
    .await
}
