//! A recording shim in front of a real CSI driver: it serves the Identity and Node services on
//! the socket the registrar registered, keeps every NodePublishVolume request, and forwards
//! every call unchanged to the driver behind it (the real hostpath driver), whose answers it
//! returns. Tests read what the node agent really sent on the wire.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};

use csi_spec::v1::identity_client::IdentityClient;
use csi_spec::v1::identity_server::{Identity, IdentityServer};
use csi_spec::v1::node_client::NodeClient;
use csi_spec::v1::node_server::{Node, NodeServer};
use csi_spec::v1::*;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

/// The NodePublishVolume requests seen so far (in arrival order).
#[derive(Clone, Default)]
pub struct Publishes(Arc<Mutex<Vec<NodePublishVolumeRequest>>>);

impl Publishes {
    pub fn all(&self) -> Vec<NodePublishVolumeRequest> {
        self.0.lock().unwrap().clone()
    }
}

#[derive(Clone)]
struct Shim {
    channel: Channel,
    publishes: Publishes,
}

/// Serves the shim on `socket` until `stop`, forwarding to the driver on `target`.
pub fn router(target_channel: Channel, publishes: Publishes) -> tonic::transport::server::Router {
    let shim = Shim {
        channel: target_channel,
        publishes,
    };
    tonic::transport::Server::builder()
        .add_service(IdentityServer::new(shim.clone()))
        .add_service(NodeServer::new(shim))
}

fn fwd<T>(r: Request<T>) -> Request<T> {
    Request::new(r.into_inner())
}

#[tonic::async_trait]
impl Identity for Shim {
    async fn get_plugin_info(
        &self,
        r: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        IdentityClient::new(self.channel.clone())
            .get_plugin_info(fwd(r))
            .await
    }
    async fn get_plugin_capabilities(
        &self,
        r: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        IdentityClient::new(self.channel.clone())
            .get_plugin_capabilities(fwd(r))
            .await
    }
    async fn probe(&self, r: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        IdentityClient::new(self.channel.clone())
            .probe(fwd(r))
            .await
    }
}

#[tonic::async_trait]
impl Node for Shim {
    async fn node_stage_volume(
        &self,
        r: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        NodeClient::new(self.channel.clone())
            .node_stage_volume(fwd(r))
            .await
    }
    async fn node_unstage_volume(
        &self,
        r: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        NodeClient::new(self.channel.clone())
            .node_unstage_volume(fwd(r))
            .await
    }
    async fn node_publish_volume(
        &self,
        r: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        self.publishes.0.lock().unwrap().push(r.get_ref().clone());
        NodeClient::new(self.channel.clone())
            .node_publish_volume(fwd(r))
            .await
    }
    async fn node_unpublish_volume(
        &self,
        r: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        NodeClient::new(self.channel.clone())
            .node_unpublish_volume(fwd(r))
            .await
    }
    async fn node_get_volume_stats(
        &self,
        r: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        NodeClient::new(self.channel.clone())
            .node_get_volume_stats(fwd(r))
            .await
    }
    async fn node_expand_volume(
        &self,
        r: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        NodeClient::new(self.channel.clone())
            .node_expand_volume(fwd(r))
            .await
    }
    async fn node_get_capabilities(
        &self,
        r: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        NodeClient::new(self.channel.clone())
            .node_get_capabilities(fwd(r))
            .await
    }
    async fn node_get_info(
        &self,
        r: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        NodeClient::new(self.channel.clone())
            .node_get_info(fwd(r))
            .await
    }
}
