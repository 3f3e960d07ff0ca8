//! csi.v1.Identity: who the driver is and what it offers.

use csi_spec::v1::identity_server::Identity;
use csi_spec::v1::plugin_capability::{service, volume_expansion};
use csi_spec::v1::{
    GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse, GetPluginInfoRequest,
    GetPluginInfoResponse, PluginCapability, ProbeRequest, ProbeResponse,
};
use tonic::{Request, Response, Status};

use crate::controller::ControllerService;

/// The name `ebs.csi.aws.com` is what CSIDriver objects and PVs refer to.
pub const DEFAULT_DRIVER_NAME: &str = "ebs.csi.aws.com";

#[derive(Debug, Clone)]
pub struct IdentityConfig {
    pub driver_name: String,
    pub vendor_version: String,
    /// Whether this process also serves csi.v1.Controller (not in node mode).
    pub controller_service: bool,
}

impl Default for IdentityConfig {
    fn default() -> Self {
        Self {
            driver_name: DEFAULT_DRIVER_NAME.to_string(),
            vendor_version: env!("CARGO_PKG_VERSION").to_string(),
            controller_service: false,
        }
    }
}

#[derive(Debug, Clone)]
pub struct CsiIdentitySvc {
    config: IdentityConfig,
    /// The controller, whose cheap EC2 call Probe makes (none in node mode).
    controller: Option<ControllerService>,
}

impl CsiIdentitySvc {
    pub fn new(config: IdentityConfig) -> Self {
        Self {
            config,
            controller: None,
        }
    }

    /// Probe asks the controller (one cheap EC2 call) whether it can work.
    pub fn with_probe(mut self, controller: ControllerService) -> Self {
        self.controller = Some(controller);
        self
    }
}

#[tonic::async_trait]
impl Identity for CsiIdentitySvc {
    async fn get_plugin_info(
        &self,
        _request: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: self.config.driver_name.clone(),
            vendor_version: self.config.vendor_version.clone(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _request: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        let mut capabilities = vec![
            // Volumes live in one availability zone.
            PluginCapability::service(service::Type::VolumeAccessibilityConstraints),
            // EBS grows volumes while attached, and the node grows filesystems while mounted.
            PluginCapability::volume_expansion(volume_expansion::Type::Online),
        ];
        if self.config.controller_service {
            capabilities.insert(
                0,
                PluginCapability::service(service::Type::ControllerService),
            );
        }
        Ok(Response::new(GetPluginCapabilitiesResponse {
            capabilities,
        }))
    }

    /// The node side has nothing remote to depend on: it is ready once it serves. The
    /// controller is ready while a cheap EC2 call (DescribeAvailabilityZones) succeeds.
    async fn probe(
        &self,
        _request: Request<ProbeRequest>,
    ) -> Result<Response<ProbeResponse>, Status> {
        let ready = match &self.controller {
            None => true,
            Some(c) => match c.probe().await {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(error = %e, "probe: EC2 is not reachable");
                    false
                }
            },
        };
        Ok(Response::new(ProbeResponse { ready: Some(ready) }))
    }
}
