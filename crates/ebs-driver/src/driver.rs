//! Serving the driver's CSI services on the endpoint until shutdown.

use std::future::Future;

use csi_spec::UnixSocket;
use csi_spec::v1::identity_server::IdentityServer;
use csi_spec::v1::node_server::NodeServer;
use tonic::transport::Server;

use crate::identity::{CsiIdentitySvc, IdentityConfig};
use crate::node::requests::NodeConfig;
use crate::node::service::NodeService;
use crate::node::{CsiNodeSvc, NodeInfo};
use crate::{Error, Result};

/// Everything `ebs-csi-driver` needs to run (node mode; the controller comes later).
#[derive(Debug, Clone)]
pub struct DriverConfig {
    /// `unix:///path/csi.sock` or a plain path.
    pub endpoint: String,
    pub identity: IdentityConfig,
    pub node: NodeConfig,
    pub node_info: NodeInfo,
}

/// Binds the endpoint, then serves Identity and Node until `shutdown` resolves. The socket file
/// is removed on the way out.
pub async fn run(config: DriverConfig, shutdown: impl Future<Output = ()>) -> Result<()> {
    // Bad flags fail before the socket exists, so kubelet never sees a half-started driver.
    let node = build_node(&config)?;
    let socket = UnixSocket::bind(&config.endpoint).map_err(Error::Endpoint)?;
    serve_with(socket, node, config, shutdown).await
}

/// Like [`run`] on a socket that is already bound (tests bind first to know when it is ready).
pub async fn serve(
    socket: UnixSocket,
    config: DriverConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    let node = build_node(&config)?;
    serve_with(socket, node, config, shutdown).await
}

fn build_node(config: &DriverConfig) -> Result<NodeService> {
    if config.node_info.node_id.is_empty() {
        return Err(Error::invalid(
            "node_id",
            "is required (the EC2 instance ID)",
        ));
    }
    NodeService::new(config.node.clone())
}

async fn serve_with(
    socket: UnixSocket,
    node: NodeService,
    config: DriverConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    tracing::info!(
        driver = %config.identity.driver_name,
        node_id = %config.node_info.node_id,
        endpoint = %socket.path().display(),
        "starting node service"
    );
    let router = Server::builder()
        .add_service(IdentityServer::new(CsiIdentitySvc::new(config.identity)))
        .add_service(NodeServer::new(CsiNodeSvc::new(node, config.node_info)));
    socket
        .serve(router, shutdown)
        .await
        .map_err(Error::Endpoint)
}
