//! The whole `csi-node-agent` process: client, metrics and health server, the Node and its
//! CSINode, then the plugin manager, the volume manager, node status and the Lease, until
//! shutdown.

use std::sync::Arc;

use component_runtime::ObjectCache;
use k8s_openapi::api::storage::v1::CSINode;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::drivers::DriverRegistry;
use crate::metrics::Metrics;
use crate::nodeinfomanager::NodeInfoManager;
use crate::pluginmanager::PluginManager;
use crate::volumemanager::{Caches, VolumeManager, scoped_cluster_cache};
use crate::{COMPONENT, Error, nodestatus};

/// The User-Agent of every API request.
pub fn user_agent() -> String {
    format!("csi-node-agent/{}", env!("CARGO_PKG_VERSION"))
}

/// Runs the node agent until `shutdown` is cancelled (SIGTERM in the binary). Volumes stay
/// mounted across a restart: the next start reconstructs them.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<(), Error> {
    let options = config.options.clone();
    let client = component_runtime::build_client(
        config.kubeconfig.as_deref(),
        &user_agent(),
        config.kube_api_qps,
        config.kube_api_burst,
    )
    .await?;
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let drivers = DriverRegistry::default();

    let node = nodestatus::register_node(&client, &options).await?;
    let node_info =
        NodeInfoManager::new(client.clone(), &options.node_name, options.migrated.clone());
    node_info.init_csinode().await?;

    // Everything below stops with `stop`; `shutdown` is the caller's.
    let stop = shutdown.child_token();
    let caches = Caches::spawn(&client, &options.node_name, &stop);
    caches.wait_until_ready(options.cache_sync_timeout).await?;
    // Its own CSINode, read with GETs: a node may get its CSINode but not list or watch
    // CSINodes (the Node authorizer: "can only get, create, update, patch, or delete").
    let csinodes: ObjectCache<CSINode> = scoped_cluster_cache(&client, &stop);
    let plugin_manager = PluginManager::new(
        options.plugins_registry_dir(),
        drivers.clone(),
        node_info,
        &mut registry,
    );

    let health = component_runtime::Health::default();
    let http = config
        .serving
        .serve_http(Arc::new(registry), &health)
        .await?;

    let recorder = Arc::new(component_runtime::EventRecorder::new(
        client.clone(),
        COMPONENT,
    ));
    let volume_manager = VolumeManager::new(
        client.clone(),
        options.clone(),
        drivers.clone(),
        caches,
        recorder,
        metrics,
    );
    tracing::info!(
        node = %options.node_name,
        root_dir = %options.root_dir.display(),
        skip_attach = %options.skip_attach,
        migrated = %options.migrated,
        "starting the node agent"
    );
    let tasks = vec![
        tokio::spawn(nodestatus::lease::run(
            client.clone(),
            node,
            options.node_lease_duration_seconds,
            stop.clone(),
        )),
        tokio::spawn(nodestatus::run_status(
            client.clone(),
            options.clone(),
            csinodes,
            stop.clone(),
        )),
        tokio::spawn(plugin_manager.run(stop.clone())),
        tokio::spawn(volume_manager.run(stop.clone())),
    ];
    health.set_ready(true);
    shutdown.cancelled().await;
    stop.cancel();
    for t in tasks {
        let _ = t.await;
    }
    if let Some(server) = http {
        server.shutdown().await;
    }
    tracing::info!("node agent stopped; volumes stay mounted for the next start");
    Ok(())
}
