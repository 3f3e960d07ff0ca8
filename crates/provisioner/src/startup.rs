//! The whole `csi-provisioner` process: clients, driver connection, metrics server, leader
//! election, controller.

use std::time::Duration;

use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::Error;
use crate::config::Config;
use crate::controller::Controller;
use crate::csi::{Capabilities, Driver};

/// The User-Agent of every API request.
fn user_agent() -> String {
    format!("csi-provisioner/{}", env!("CARGO_PKG_VERSION"))
}

/// Runs the provisioner until `shutdown` is cancelled (SIGTERM in the binary).
///
/// Two kube clients: the controller's is rate-limited by `--kube-api-qps`/`--kube-api-burst`;
/// leader election has its own, so a busy controller never delays a lease renewal.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<(), Error> {
    config.options()?;
    let common = &config.common;
    let ua = user_agent();
    let client = common.client.client(&ua).await?;
    let election_client = common.client.election_client(&ua).await?;
    run_with_clients(config, client, election_client, None, shutdown).await
}

/// [`run`] on an existing client (csi-cluster runs the provisioner in-process). The same client
/// serves leader election; `--kubeconfig` and the QPS flags are not used.
pub async fn run_with_client(
    config: Config,
    client: kube::Client,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    run_with_clients(config, client.clone(), client, None, shutdown).await
}

/// [`run_with_client`], reading the cluster from `informers` shared with the other
/// provisioners of this process (`csi-cluster` runs one per node) instead of its own watches.
pub async fn run_with_informers(
    config: Config,
    client: kube::Client,
    informers: crate::Informers,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    run_with_clients(config, client.clone(), client, Some(informers), shutdown).await
}

async fn run_with_clients(
    config: Config,
    client: kube::Client,
    election_client: kube::Client,
    informers: Option<crate::Informers>,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let options = config.options()?;
    let common = &config.common;
    let driver = connect_driver(&config, &shutdown).await?;
    if !driver.capabilities.create_delete_volume {
        return Err(Error::Driver {
            driver: driver.name,
            reason: "it does not announce the CREATE_DELETE_VOLUME controller capability: it cannot provision volumes".into(),
        });
    }
    let mut registry = Registry::default();
    let operations = component_runtime::OperationMetrics::register(&mut registry, &driver.name);
    let driver_name = driver.name.clone();
    let mut controller = Controller::new(client, driver, options, &mut registry, Some(operations));
    if let Some(informers) = informers {
        controller = controller.with_informers(informers);
    }

    // The Go sidecar's Lease: the driver name, sanitized (ebs.csi.aws.com → ebs-csi-aws-com).
    let serving = common.serving(component_runtime::sanitize_driver_name(&driver_name));
    component_runtime::serve_and_run(serving, registry, election_client, shutdown, |token| {
        controller.run(token)
    })
    .await
}

/// Dials the driver (retrying until `--connection-timeout`), waits for Probe, and reads its
/// name and capabilities.
pub async fn connect_driver(
    config: &Config,
    shutdown: &CancellationToken,
) -> Result<Driver, Error> {
    let common = &config.common;
    let call_timeout: Duration = config.timeout;
    let (channel, info) = common.connect_driver(call_timeout, shutdown).await?;
    let topology = crate::csi::has_topology(&channel, call_timeout).await?;
    let capabilities =
        Capabilities::from_rpc_types(info.controller_capabilities.iter().copied(), topology);
    tracing::info!(driver = %info.name, version = %info.vendor_version, ?capabilities, "connected to the CSI driver");
    Ok(Driver {
        name: info.name,
        channel,
        capabilities,
    })
}
