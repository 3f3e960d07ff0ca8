//! csi.v1.Identity: who the driver is and what it offers.

use std::sync::Arc;

use csi_spec::v1::identity_server::Identity;
use csi_spec::v1::plugin_capability::{service, volume_expansion};
use csi_spec::v1::{
    GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse, GetPluginInfoRequest,
    GetPluginInfoResponse, PluginCapability, ProbeRequest, ProbeResponse,
};
use tonic::{Request, Response, Status};

use crate::driver::Driver;

#[derive(Debug)]
pub(crate) struct IdentitySvc {
    driver: Arc<Driver>,
}

impl IdentitySvc {
    pub(crate) fn new(driver: Arc<Driver>) -> Self {
        Self { driver }
    }
}

#[tonic::async_trait]
impl Identity for IdentitySvc {
    async fn get_plugin_info(
        &self,
        _request: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: self.driver.config.driver_name.clone(),
            vendor_version: self.driver.config.vendor_version.clone(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _request: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        Ok(Response::new(GetPluginCapabilitiesResponse {
            capabilities: vec![
                PluginCapability::service(service::Type::ControllerService),
                // Every volume lives on the node that created it.
                PluginCapability::service(service::Type::VolumeAccessibilityConstraints),
                // Images grow and loop devices pick up the new size while in use.
                PluginCapability::volume_expansion(volume_expansion::Type::Online),
            ],
        }))
    }

    /// Ready while the state directory can be read: everything else is local.
    async fn probe(
        &self,
        _request: Request<ProbeRequest>,
    ) -> Result<Response<ProbeResponse>, Status> {
        let dir = &self.driver.config.state_dir;
        let ready = match std::fs::metadata(dir) {
            Ok(m) => m.is_dir(),
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "probe: state directory unusable");
                false
            }
        };
        Ok(Response::new(ProbeResponse { ready: Some(ready) }))
    }
}
