//! The driver: its name, what it can do, and the two calls we make.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use csi_spec::v1::controller_client::ControllerClient;
use csi_spec::v1::controller_service_capability::rpc::Type as Rpc;
use csi_spec::v1::identity_client::IdentityClient;
use csi_spec::v1::plugin_capability::service::Type as ServiceType;
use csi_spec::v1::{
    CreateVolumeRequest, DeleteVolumeRequest, GetPluginCapabilitiesRequest, Volume,
};
use tonic::transport::Channel;

use crate::Error;

/// What the driver announced.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// CREATE_DELETE_VOLUME: without it there is nothing to do.
    pub create_delete_volume: bool,
    /// CLONE_VOLUME: a PVC data source.
    pub clone_volume: bool,
    /// CREATE_DELETE_SNAPSHOT: a VolumeSnapshot data source.
    pub snapshots: bool,
    /// The VOLUME_ACCESSIBILITY_CONSTRAINTS plugin capability: topology requirements.
    pub topology: bool,
}

impl Capabilities {
    /// From ControllerGetCapabilities' RPC types and whether the plugin has topology.
    pub fn from_rpc_types(types: impl IntoIterator<Item = i32>, topology: bool) -> Self {
        let mut c = Capabilities {
            topology,
            ..Default::default()
        };
        for t in types {
            match Rpc::try_from(t) {
                Ok(Rpc::CreateDeleteVolume) => c.create_delete_volume = true,
                Ok(Rpc::CloneVolume) => c.clone_volume = true,
                Ok(Rpc::CreateDeleteSnapshot) => c.snapshots = true,
                _ => {}
            }
        }
        c
    }
}

/// A connected driver.
#[derive(Debug, Clone)]
pub struct Driver {
    pub name: String,
    pub channel: Channel,
    pub capabilities: Capabilities,
}

/// Whether the plugin announces VOLUME_ACCESSIBILITY_CONSTRAINTS (component_runtime::driver_info does not
/// read plugin capabilities other than the controller service).
pub(crate) async fn has_topology(channel: &Channel, timeout: Duration) -> Result<bool, Error> {
    let mut identity = IdentityClient::new(channel.clone());
    let mut req = tonic::Request::new(GetPluginCapabilitiesRequest {});
    req.set_timeout(timeout);
    let caps = identity
        .get_plugin_capabilities(req)
        .await
        .map_err(|s| csi_error("GetPluginCapabilities", &s))?
        .into_inner();
    Ok(caps
        .capabilities
        .iter()
        .any(|c| c.service_type() == Some(ServiceType::VolumeAccessibilityConstraints)))
}

fn csi_error(method: &'static str, s: &tonic::Status) -> Error {
    Error::Csi {
        method,
        code: s.code(),
        message: s.message().to_string(),
    }
}

/// Reports each call to the metrics (method path, code, duration).
pub(crate) type Observer = std::sync::Arc<dyn Fn(&str, tonic::Code, Duration, bool) + Send + Sync>;

impl Driver {
    pub(crate) async fn create_volume(
        &self,
        req: CreateVolumeRequest,
        timeout: Duration,
        observe: Option<&Observer>,
        migrated: bool,
    ) -> Result<Volume, Error> {
        let mut client = ControllerClient::new(self.channel.clone());
        let mut r = tonic::Request::new(req);
        r.set_timeout(timeout);
        let started = Instant::now();
        let result = deadline(
            tokio::time::timeout(timeout, client.create_volume(r)).await,
            started,
            timeout,
        );
        report(
            observe,
            "/csi.v1.Controller/CreateVolume",
            &result,
            started,
            migrated,
        );
        let volume = result
            .map_err(|s| csi_error("CreateVolume", &s))?
            .into_inner()
            .volume
            .ok_or_else(|| Error::CsiResponse {
                method: "CreateVolume",
                reason: "the answer has no volume".into(),
            })?;
        if volume.volume_id.is_empty() {
            return Err(Error::CsiResponse {
                method: "CreateVolume",
                reason: "the answer has an empty volume_id".into(),
            });
        }
        Ok(volume)
    }

    pub(crate) async fn delete_volume(
        &self,
        volume_id: &str,
        secrets: HashMap<String, String>,
        timeout: Duration,
        observe: Option<&Observer>,
        migrated: bool,
    ) -> Result<(), Error> {
        let mut client = ControllerClient::new(self.channel.clone());
        let mut r = tonic::Request::new(DeleteVolumeRequest {
            volume_id: volume_id.to_string(),
            secrets,
        });
        r.set_timeout(timeout);
        let started = Instant::now();
        let result = deadline(
            tokio::time::timeout(timeout, client.delete_volume(r)).await,
            started,
            timeout,
        );
        report(
            observe,
            "/csi.v1.Controller/DeleteVolume",
            &result,
            started,
            migrated,
        );
        match result {
            Ok(_) => Ok(()),
            // Already gone: what we wanted.
            Err(s) if s.code() == tonic::Code::NotFound => Ok(()),
            Err(s) => Err(csi_error("DeleteVolume", &s)),
        }
    }
}

/// A call cut off by its deadline reads DEADLINE_EXCEEDED, as in the Go sidecar: tonic reports
/// the server's answer to an expired deadline as CANCELLED ("Timeout expired"), and our own
/// timer may fire first.
fn deadline<T>(
    result: Result<Result<T, tonic::Status>, tokio::time::error::Elapsed>,
    started: Instant,
    timeout: Duration,
) -> Result<T, tonic::Status> {
    let expired = || tonic::Status::deadline_exceeded("context deadline exceeded");
    match result {
        Err(_) => Err(expired()),
        Ok(Err(s)) if s.code() == tonic::Code::Cancelled && started.elapsed() >= timeout => {
            Err(expired())
        }
        Ok(r) => r,
    }
}

fn report<T>(
    observe: Option<&Observer>,
    method: &str,
    result: &Result<T, tonic::Status>,
    started: Instant,
    migrated: bool,
) {
    if let Some(o) = observe {
        let code = result
            .as_ref()
            .map_or_else(tonic::Status::code, |_| tonic::Code::Ok);
        o(method, code, started.elapsed(), migrated);
    }
}
