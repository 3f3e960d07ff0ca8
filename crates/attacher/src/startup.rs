//! The whole `csi-attacher` process: clients, driver connection, handler choice, metrics
//! server, leader election, controller.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::Error;
use crate::config::Config;
use crate::context::Capabilities;
use crate::controller::{Controller, Driver};
use crate::metrics::CsiCallObserver;

/// The User-Agent of every API request.
pub(crate) fn user_agent() -> String {
    format!("csi-attacher/{}", env!("CARGO_PKG_VERSION"))
}

/// Runs the attacher until `shutdown` is cancelled (SIGTERM in the binary).
///
/// Two kube clients: the controller's is rate-limited by `--kube-api-qps`/`--kube-api-burst`;
/// leader election has its own, so a busy controller can never delay a lease renewal.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<(), Error> {
    let options = config.options()?;
    let common = &config.common;
    let ua = user_agent();
    let client = common.client.client(&ua).await?;
    let election_client = common.client.election_client(&ua).await?;

    let mut registry = Registry::default();
    let driver = if config.dummy {
        tracing::info!(
            "dummy mode: VolumeAttachments of attacher csi/dummy or csi-dummy are marked attached"
        );
        Driver::Dummy
    } else {
        connect_driver(&config, options.timeout, &shutdown).await?
    };
    let operations: Option<CsiCallObserver> = match &driver {
        Driver::Csi { name, .. } => {
            let ops = component_runtime::OperationMetrics::register(&mut registry, name);
            Some(Arc::new(
                move |method: &str, code, took: Duration, migrated| {
                    ops.observe(method, code, took, migrated);
                },
            ))
        }
        Driver::Dummy => None,
    };
    let driver_name = driver.name().to_string();
    let controller = Controller::new(client, driver, options, &mut registry, operations);
    tracing::info!(driver = %driver_name, handler = controller.handler_kind(), "handler chosen");

    let serving = common.serving(component_runtime::lease_name(
        "external-attacher-leader",
        &driver_name,
    ));
    component_runtime::serve_and_run(serving, registry, election_client, shutdown, |token| {
        controller.run(token)
    })
    .await
}

/// Dials the driver (retrying until `--connection-timeout`), waits for Probe, and reads its
/// name and controller capabilities.
async fn connect_driver(
    config: &Config,
    call_timeout: Duration,
    shutdown: &CancellationToken,
) -> Result<Driver, Error> {
    let common = &config.common;
    let (channel, info) = common.connect_driver(call_timeout, shutdown).await?;
    let capabilities = Capabilities::from_rpc_types(info.controller_capabilities.iter().copied());
    tracing::info!(
        driver = %info.name,
        version = %info.vendor_version,
        ?capabilities,
        "connected to the CSI driver"
    );
    if !capabilities.publish_unpublish {
        tracing::info!("the driver has no PUBLISH_UNPUBLISH_VOLUME: using the trivial handler");
    }
    Ok(Driver::Csi {
        name: info.name,
        channel,
        capabilities,
    })
}
