//! `csi-mock-driver`: the mock CSI driver as a process, to run any sidecar against.

use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use csi_mock::MockConfig;

/// A mock CSI driver (Identity + Controller publish/unpublish/list) on a unix socket. It keeps
/// published volumes in memory and answers the way the CSI spec asks.
#[derive(Debug, Parser)]
#[command(name = "csi-mock-driver", version)]
struct Flags {
    /// Where to serve: unix:///path/csi.sock or a plain path.
    #[arg(long, default_value = "unix:///run/csi/socket")]
    endpoint: String,

    /// The driver name GetPluginInfo answers.
    #[arg(long, default_value = "mock.csi.rs")]
    name: String,

    /// Do not advertise PUBLISH_UNPUBLISH_VOLUME (an attacher then uses its trivial handler).
    #[arg(long)]
    no_publish_unpublish: bool,

    /// Do not advertise PUBLISH_READONLY.
    #[arg(long)]
    no_publish_readonly: bool,

    /// Do not advertise LIST_VOLUMES and LIST_VOLUMES_PUBLISHED_NODES.
    #[arg(long)]
    no_list_published_nodes: bool,

    /// Do not advertise the CONTROLLER_SERVICE plugin capability.
    #[arg(long)]
    no_controller_service: bool,

    /// Added to every Publish and Unpublish, e.g. 10ms, 1.5s, 1m.
    #[arg(long, default_value = "0s", value_parser = component_runtime::parse_go_duration)]
    delay: Duration,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // Info to stderr, RUST_LOG overrides: what every sidecar does.
    component_runtime::init_logging(0);
    let f = Flags::parse();
    let config = MockConfig {
        name: f.name,
        publish_unpublish: !f.no_publish_unpublish,
        publish_readonly: !f.no_publish_readonly,
        list_published_nodes: !f.no_list_published_nodes,
        controller_service: !f.no_controller_service,
        delay: f.delay,
        ..MockConfig::default()
    };
    // Handlers first, so a SIGTERM right after start-up is not lost.
    let shutdown = component_runtime::shutdown_on_signals();
    let driver = csi_mock::start_at(&f.endpoint, config)
        .await
        .with_context(|| format!("csi-mock-driver: starting on {}", f.endpoint))?;
    shutdown.cancelled().await;
    driver.shutdown().await;
    Ok(())
}
