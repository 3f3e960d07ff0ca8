//! csi.v1.Controller: validates requests, calls [`ControllerService`], and leaves the
//! error-to-status mapping to `crate::error`.

use std::collections::HashMap;

use csi_spec::v1::controller_server::Controller;
use csi_spec::v1::controller_service_capability::rpc::Type as Rpc;
use csi_spec::v1::validate_volume_capabilities_response::Confirmed;
use csi_spec::v1::volume_content_source::{SnapshotSource, Type as SourceType};
use csi_spec::v1::{
    ControllerExpandVolumeRequest, ControllerExpandVolumeResponse,
    ControllerGetCapabilitiesRequest, ControllerGetCapabilitiesResponse,
    ControllerModifyVolumeRequest, ControllerModifyVolumeResponse, ControllerPublishVolumeRequest,
    ControllerPublishVolumeResponse, ControllerServiceCapability, ControllerUnpublishVolumeRequest,
    ControllerUnpublishVolumeResponse, CreateSnapshotRequest, CreateSnapshotResponse,
    CreateVolumeRequest, CreateVolumeResponse, DeleteSnapshotRequest, DeleteSnapshotResponse,
    DeleteVolumeRequest, DeleteVolumeResponse, ListSnapshotsRequest, ListSnapshotsResponse,
    ValidateVolumeCapabilitiesRequest, ValidateVolumeCapabilitiesResponse, Volume,
    VolumeContentSource, list_snapshots_response,
};
use tonic::{Request, Response, Status};

use crate::capability::{check_capabilities, check_capability, required, topology, zone_of};
use crate::controller::{ControllerService, CreateVolume};
use crate::node::DEVICE_PATH_KEY;
use crate::{Error, Result};

/// csi.v1.Controller over [`ControllerService`].
#[derive(Debug, Clone)]
pub struct CsiControllerSvc {
    service: ControllerService,
}

impl CsiControllerSvc {
    pub fn new(service: ControllerService) -> Self {
        Self { service }
    }
}

/// How long a handler may wait before it must answer, from the time the caller gives the call
/// (gRPC's `grpc-timeout` header), if it set one. A tenth of it (at most 1 s) is kept back for
/// the answer's way back: a handler that waited the caller's whole time would lose the race
/// with the caller's own timer, and the caller would see CANCELLED instead of our
/// DEADLINE_EXCEEDED (1 in 10 runs of the slow-modification test did).
fn deadline<T>(request: &Request<T>) -> Option<std::time::Duration> {
    let given = grpc_timeout(request)?;
    Some(given.saturating_sub((given / 10).min(std::time::Duration::from_secs(1))))
}

/// The `grpc-timeout` header as a duration.
fn grpc_timeout<T>(request: &Request<T>) -> Option<std::time::Duration> {
    let value = request.metadata().get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    let n: u64 = digits.parse().ok()?;
    use std::time::Duration;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

fn timestamp(secs: i64, nanos: u32) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: secs,
        nanos: i32::try_from(nanos).unwrap_or(0),
    }
}

fn csi_snapshot(s: &ebs_cloud::Snapshot) -> csi_spec::v1::Snapshot {
    csi_spec::v1::Snapshot {
        size_bytes: s.size_gib * crate::controller::params::GIB,
        snapshot_id: s.snapshot_id.clone(),
        source_volume_id: s.source_volume_id.clone(),
        creation_time: Some(timestamp(s.created.0, s.created.1)),
        ready_to_use: s.ready(),
        group_snapshot_id: String::new(),
    }
}

#[tonic::async_trait]
impl Controller for CsiControllerSvc {
    #[tracing::instrument(
        name = "CreateVolume",
        skip_all,
        err(level = "warn", Display),
        fields(name = %request.get_ref().name)
    )]
    async fn create_volume(
        &self,
        request: Request<CreateVolumeRequest>,
    ) -> Result<Response<CreateVolumeResponse>, Status> {
        let r = request.into_inner();
        required("name", &r.name)?;
        check_capabilities(&r.volume_capabilities)?;
        let (required_bytes, limit_bytes) = r
            .capacity_range
            .as_ref()
            .map(|c| (c.required_bytes, c.limit_bytes))
            .unwrap_or((0, 0));
        let snapshot_id = match r
            .volume_content_source
            .as_ref()
            .and_then(|s| s.r#type.as_ref())
        {
            None => None,
            Some(SourceType::Snapshot(s)) => {
                required("volume_content_source.snapshot.snapshot_id", &s.snapshot_id)?;
                Some(s.snapshot_id.clone())
            }
            Some(SourceType::Volume(_)) => {
                return Err(Error::invalid(
                    "volume_content_source.volume",
                    "cloning volumes is not supported (CLONE_VOLUME is not a capability)",
                )
                .into());
            }
        };
        let mut zones = Vec::new();
        let mut allowed = Vec::new();
        if let Some(req) = &r.accessibility_requirements {
            for t in &req.preferred {
                if let Some(z) = zone_of(t) {
                    zones.push(z);
                }
            }
            for t in &req.requisite {
                if let Some(z) = zone_of(t) {
                    allowed.push(z.clone());
                    if !zones.contains(&z) {
                        zones.push(z);
                    }
                }
            }
            if !allowed.is_empty() {
                zones.retain(|z| allowed.contains(z));
            }
        }
        let v = self
            .service
            .create_volume(CreateVolume {
                name: r.name,
                required_bytes,
                limit_bytes,
                parameters: r.parameters,
                mutable_parameters: r.mutable_parameters,
                zones,
                allowed_zones: allowed,
                snapshot_id,
            })
            .await?;
        let mut volume_context = HashMap::new();
        if let Some(fs) = &v.fs_type {
            volume_context.insert("fsType".to_string(), fs.clone());
        }
        Ok(Response::new(CreateVolumeResponse {
            volume: Some(Volume {
                capacity_bytes: v.capacity_bytes,
                volume_id: v.volume_id,
                volume_context,
                content_source: v.snapshot_id.map(|s| VolumeContentSource {
                    r#type: Some(SourceType::Snapshot(SnapshotSource { snapshot_id: s })),
                }),
                accessible_topology: vec![topology(&v.zone)],
            }),
        }))
    }

    #[tracing::instrument(
        name = "DeleteVolume",
        skip_all,
        err(level = "warn", Display),
        fields(volume_id = %request.get_ref().volume_id)
    )]
    async fn delete_volume(
        &self,
        request: Request<DeleteVolumeRequest>,
    ) -> Result<Response<DeleteVolumeResponse>, Status> {
        let r = request.into_inner();
        required("volume_id", &r.volume_id)?;
        self.service.delete_volume(&r.volume_id).await?;
        Ok(Response::new(DeleteVolumeResponse {}))
    }

    #[tracing::instrument(
        name = "ControllerPublishVolume",
        skip_all,
        err(level = "warn", Display),
        fields(volume_id = %request.get_ref().volume_id, node_id = %request.get_ref().node_id)
    )]
    async fn controller_publish_volume(
        &self,
        request: Request<ControllerPublishVolumeRequest>,
    ) -> Result<Response<ControllerPublishVolumeResponse>, Status> {
        let r = request.into_inner();
        required("volume_id", &r.volume_id)?;
        required("node_id", &r.node_id)?;
        let cap = r
            .volume_capability
            .as_ref()
            .ok_or_else(|| Error::invalid("volume_capability", "is required"))?;
        check_capability("volume_capability", cap)?;
        let device = self.service.publish(&r.volume_id, &r.node_id).await?;
        Ok(Response::new(ControllerPublishVolumeResponse {
            publish_context: HashMap::from([(DEVICE_PATH_KEY.to_string(), device)]),
        }))
    }

    #[tracing::instrument(
        name = "ControllerUnpublishVolume",
        skip_all,
        err(level = "warn", Display),
        fields(volume_id = %request.get_ref().volume_id, node_id = %request.get_ref().node_id)
    )]
    async fn controller_unpublish_volume(
        &self,
        request: Request<ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<ControllerUnpublishVolumeResponse>, Status> {
        let r = request.into_inner();
        required("volume_id", &r.volume_id)?;
        if r.node_id.is_empty() {
            // CSI allows an empty node ID ("from all nodes"); EBS volumes have one attachment,
            // so detach it wherever it is.
            let disk = match self.service.volume(&r.volume_id).await {
                Ok(d) => d,
                Err(Error::NotFound { .. }) => {
                    return Ok(Response::new(ControllerUnpublishVolumeResponse {}));
                }
                Err(e) => return Err(e.into()),
            };
            for a in &disk.attachments {
                self.service.unpublish(&r.volume_id, &a.instance_id).await?;
            }
        } else {
            self.service.unpublish(&r.volume_id, &r.node_id).await?;
        }
        Ok(Response::new(ControllerUnpublishVolumeResponse {}))
    }

    #[tracing::instrument(
        name = "ValidateVolumeCapabilities",
        skip_all,
        err(level = "warn", Display),
        fields(volume_id = %request.get_ref().volume_id)
    )]
    async fn validate_volume_capabilities(
        &self,
        request: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<ValidateVolumeCapabilitiesResponse>, Status> {
        let r = request.into_inner();
        required("volume_id", &r.volume_id)?;
        if r.volume_capabilities.is_empty() {
            return Err(Error::invalid("volume_capabilities", "is required").into());
        }
        self.service.volume(&r.volume_id).await?;
        let problem = r
            .volume_capabilities
            .iter()
            .find_map(|c| check_capability("volume_capabilities", c).err());
        Ok(Response::new(match problem {
            None => ValidateVolumeCapabilitiesResponse {
                confirmed: Some(Confirmed {
                    volume_context: r.volume_context,
                    volume_capabilities: r.volume_capabilities,
                    parameters: r.parameters,
                    mutable_parameters: r.mutable_parameters,
                }),
                message: String::new(),
            },
            Some(e) => ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message: e.to_string(),
            },
        }))
    }

    #[tracing::instrument(name = "ControllerGetCapabilities", skip_all)]
    async fn controller_get_capabilities(
        &self,
        _request: Request<ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<ControllerGetCapabilitiesResponse>, Status> {
        let capabilities = [
            Rpc::CreateDeleteVolume,
            Rpc::PublishUnpublishVolume,
            Rpc::CreateDeleteSnapshot,
            Rpc::ListSnapshots,
            Rpc::ExpandVolume,
            // SINGLE_NODE_SINGLE_WRITER and SINGLE_NODE_MULTI_WRITER (capability::MOUNT_MODES).
            Rpc::SingleNodeMultiWriter,
            Rpc::ModifyVolume,
        ]
        .into_iter()
        .map(ControllerServiceCapability::rpc)
        .collect();
        Ok(Response::new(ControllerGetCapabilitiesResponse {
            capabilities,
        }))
    }

    #[tracing::instrument(
        name = "CreateSnapshot",
        skip_all,
        err(level = "warn", Display),
        fields(name = %request.get_ref().name, volume_id = %request.get_ref().source_volume_id)
    )]
    async fn create_snapshot(
        &self,
        request: Request<CreateSnapshotRequest>,
    ) -> Result<Response<CreateSnapshotResponse>, Status> {
        let r = request.into_inner();
        required("name", &r.name)?;
        required("source_volume_id", &r.source_volume_id)?;
        let s = self
            .service
            .create_snapshot(&r.name, &r.source_volume_id)
            .await?;
        Ok(Response::new(CreateSnapshotResponse {
            snapshot: Some(csi_snapshot(&s)),
        }))
    }

    #[tracing::instrument(
        name = "DeleteSnapshot",
        skip_all,
        err(level = "warn", Display),
        fields(snapshot_id = %request.get_ref().snapshot_id)
    )]
    async fn delete_snapshot(
        &self,
        request: Request<DeleteSnapshotRequest>,
    ) -> Result<Response<DeleteSnapshotResponse>, Status> {
        let r = request.into_inner();
        required("snapshot_id", &r.snapshot_id)?;
        self.service.delete_snapshot(&r.snapshot_id).await?;
        Ok(Response::new(DeleteSnapshotResponse {}))
    }

    #[tracing::instrument(
        name = "ListSnapshots",
        skip_all,
        err(level = "warn", Display),
        fields(snapshot_id = %request.get_ref().snapshot_id, volume_id = %request.get_ref().source_volume_id)
    )]
    async fn list_snapshots(
        &self,
        request: Request<ListSnapshotsRequest>,
    ) -> Result<Response<ListSnapshotsResponse>, Status> {
        let r = request.into_inner();
        if r.max_entries < 0 {
            return Err(Error::invalid("max_entries", "must not be negative").into());
        }
        let nonempty = |s: &str| (!s.is_empty()).then(|| s.to_string());
        let page = self
            .service
            .list_snapshots(
                nonempty(&r.snapshot_id).as_deref(),
                nonempty(&r.source_volume_id).as_deref(),
                r.max_entries,
                nonempty(&r.starting_token).as_deref(),
            )
            .await?;
        Ok(Response::new(ListSnapshotsResponse {
            entries: page
                .snapshots
                .iter()
                .map(|s| list_snapshots_response::Entry {
                    snapshot: Some(csi_snapshot(s)),
                })
                .collect(),
            next_token: page.next_token.unwrap_or_default(),
        }))
    }

    #[tracing::instrument(
        name = "ControllerExpandVolume",
        skip_all,
        err(level = "warn", Display),
        fields(volume_id = %request.get_ref().volume_id)
    )]
    async fn controller_expand_volume(
        &self,
        request: Request<ControllerExpandVolumeRequest>,
    ) -> Result<Response<ControllerExpandVolumeResponse>, Status> {
        let r = request.into_inner();
        required("volume_id", &r.volume_id)?;
        let range = r
            .capacity_range
            .ok_or_else(|| Error::invalid("capacity_range", "is required"))?;
        let bytes = self
            .service
            .expand(&r.volume_id, range.required_bytes, range.limit_bytes)
            .await?;
        let block = r.volume_capability.as_ref().is_some_and(|c| c.is_block());
        Ok(Response::new(ControllerExpandVolumeResponse {
            capacity_bytes: bytes,
            node_expansion_required: !block,
        }))
    }

    #[tracing::instrument(
        name = "ControllerModifyVolume",
        skip_all,
        err(level = "warn", Display),
        fields(volume_id = %request.get_ref().volume_id)
    )]
    async fn controller_modify_volume(
        &self,
        request: Request<ControllerModifyVolumeRequest>,
    ) -> Result<Response<ControllerModifyVolumeResponse>, Status> {
        let deadline = deadline(&request);
        let r = request.into_inner();
        required("volume_id", &r.volume_id)?;
        // An empty `mutable_parameters` is checked in the service, after the volume's existence:
        // a missing volume is NOT_FOUND whatever else the request lacks (csi-sanity).
        self.service
            .modify_volume(&r.volume_id, &r.mutable_parameters, deadline)
            .await?;
        Ok(Response::new(ControllerModifyVolumeResponse {}))
    }
}
