//! The node service: everything that happens on the machine the volume is attached to.
//!
//! The submodules are domain code only (no gRPC types): `device` finds and verifies an EBS
//! volume's block device, and `service` strings it together with the generic tools of
//! `mount-utils` (blkid, mkfs, fsck, mount, stats, resize) into idempotent
//! stage/publish/unpublish/unstage steps. This file is the thin csi.v1.Node adapter on top: it
//! validates requests, calls the domain service and leaves the error-to-status mapping to
//! `crate::error`.

pub(crate) mod device;
pub(crate) mod locks;
pub(crate) mod requests;
pub(crate) mod service;

use std::path::PathBuf;

use csi_spec::v1::node_server::Node;
use csi_spec::v1::node_service_capability::rpc::Type as Rpc;
use csi_spec::v1::volume_usage::Unit;
use csi_spec::v1::{
    NodeExpandVolumeRequest, NodeExpandVolumeResponse, NodeGetCapabilitiesRequest,
    NodeGetCapabilitiesResponse, NodeGetInfoRequest, NodeGetInfoResponse,
    NodeGetVolumeStatsRequest, NodeGetVolumeStatsResponse, NodePublishVolumeRequest,
    NodePublishVolumeResponse, NodeServiceCapability, NodeStageVolumeRequest,
    NodeStageVolumeResponse, NodeUnpublishVolumeRequest, NodeUnpublishVolumeResponse,
    NodeUnstageVolumeRequest, NodeUnstageVolumeResponse, VolumeUsage,
};
use tonic::{Request, Response, Status};

use mount_utils::{Usage, VolumeStats};
use requests::{ExpandRequest, PublishRequest, StageRequest, UnpublishRequest, UnstageRequest};

use crate::Error;
use crate::capability::{self, node_capability, required};
use service::NodeService;

/// The publish-context key under which the controller passes the device name.
pub const DEVICE_PATH_KEY: &str = "devicePath";
pub use crate::capability::{TOPOLOGY_ZONE_KEY, WELL_KNOWN_ZONE_KEY};

/// What NodeGetInfo reports.
#[derive(Debug, Clone)]
pub struct NodeInfo {
    /// The EC2 instance ID: what ControllerPublishVolume receives as node ID.
    pub node_id: String,
    /// The instance's availability zone, if known.
    pub zone: Option<String>,
    /// How many EBS volumes the CO may attach here (`--volume-attach-limit`).
    pub max_volumes_per_node: i64,
}

/// csi.v1.Node over [`NodeService`].
#[derive(Debug, Clone)]
pub struct CsiNodeSvc {
    service: NodeService,
    info: NodeInfo,
}

impl CsiNodeSvc {
    pub fn new(service: NodeService, info: NodeInfo) -> Self {
        Self { service, info }
    }
}

fn device_path(ctx: &std::collections::HashMap<String, String>) -> Option<String> {
    ctx.get(DEVICE_PATH_KEY).filter(|p| !p.is_empty()).cloned()
}

fn usage(u: Usage, unit: Unit) -> VolumeUsage {
    let clamp = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    VolumeUsage {
        available: clamp(u.available),
        total: clamp(u.total),
        used: clamp(u.used),
        unit: unit.into(),
    }
}

#[tonic::async_trait]
impl Node for CsiNodeSvc {
    #[tracing::instrument(name = "NodeStageVolume", skip_all, fields(volume_id = %request.get_ref().volume_id))]
    async fn node_stage_volume(
        &self,
        request: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        let r = request.into_inner();
        required("volume_id", &r.volume_id)?;
        required("staging_target_path", &r.staging_target_path)?;
        let cap = node_capability(r.volume_capability.as_ref())?;
        self.service
            .stage(StageRequest {
                volume_id: r.volume_id,
                device_path: device_path(&r.publish_context),
                staging_path: PathBuf::from(r.staging_target_path),
                access: cap.access,
            })
            .await?;
        Ok(Response::new(NodeStageVolumeResponse {}))
    }

    #[tracing::instrument(name = "NodeUnstageVolume", skip_all, fields(volume_id = %request.get_ref().volume_id))]
    async fn node_unstage_volume(
        &self,
        request: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        let r = request.into_inner();
        required("volume_id", &r.volume_id)?;
        required("staging_target_path", &r.staging_target_path)?;
        self.service
            .unstage(UnstageRequest {
                volume_id: r.volume_id,
                staging_path: PathBuf::from(r.staging_target_path),
            })
            .await?;
        Ok(Response::new(NodeUnstageVolumeResponse {}))
    }

    #[tracing::instrument(name = "NodePublishVolume", skip_all, fields(volume_id = %request.get_ref().volume_id))]
    async fn node_publish_volume(
        &self,
        request: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let r = request.into_inner();
        required("volume_id", &r.volume_id)?;
        // The required fields first: a request without them is INVALID_ARGUMENT whatever else
        // it lacks (csi-sanity sends neither staging nor target path, and no capability).
        required("target_path", &r.target_path)?;
        let cap = node_capability(r.volume_capability.as_ref())?;
        if r.staging_target_path.is_empty() {
            // Optional in the message, but this plugin has STAGE_UNSTAGE_VOLUME: the spec's
            // "staging target path not set" row is FAILED_PRECONDITION, not a missing field.
            return Err(Error::FailedPrecondition(
                "staging_target_path is required: this driver has STAGE_UNSTAGE_VOLUME, so NodeStageVolume must succeed first".into(),
            )
            .into());
        }
        self.service
            .publish(PublishRequest {
                volume_id: r.volume_id,
                device_path: device_path(&r.publish_context),
                staging_path: PathBuf::from(r.staging_target_path),
                target_path: PathBuf::from(r.target_path),
                access: cap.access,
                read_only: r.readonly || cap.read_only,
            })
            .await?;
        Ok(Response::new(NodePublishVolumeResponse {}))
    }

    #[tracing::instrument(name = "NodeUnpublishVolume", skip_all, fields(volume_id = %request.get_ref().volume_id))]
    async fn node_unpublish_volume(
        &self,
        request: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let r = request.into_inner();
        required("volume_id", &r.volume_id)?;
        required("target_path", &r.target_path)?;
        self.service
            .unpublish(UnpublishRequest {
                volume_id: r.volume_id,
                target_path: PathBuf::from(r.target_path),
            })
            .await?;
        Ok(Response::new(NodeUnpublishVolumeResponse {}))
    }

    #[tracing::instrument(name = "NodeGetVolumeStats", skip_all, fields(volume_id = %request.get_ref().volume_id))]
    async fn node_get_volume_stats(
        &self,
        request: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        let r = request.into_inner();
        required("volume_id", &r.volume_id)?;
        required("volume_path", &r.volume_path)?;
        let stats = self
            .service
            .volume_stats(&r.volume_id, &PathBuf::from(&r.volume_path))
            .await?;
        let usage = match stats {
            VolumeStats::Filesystem { bytes, inodes } => {
                vec![usage(bytes, Unit::Bytes), usage(inodes, Unit::Inodes)]
            }
            VolumeStats::Block { size_bytes } => vec![usage(
                Usage {
                    total: size_bytes,
                    used: 0,
                    available: 0,
                },
                Unit::Bytes,
            )],
        };
        Ok(Response::new(NodeGetVolumeStatsResponse {
            usage,
            volume_condition: None,
        }))
    }

    #[tracing::instrument(name = "NodeExpandVolume", skip_all, fields(volume_id = %request.get_ref().volume_id))]
    async fn node_expand_volume(
        &self,
        request: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        let r = request.into_inner();
        required("volume_id", &r.volume_id)?;
        required("volume_path", &r.volume_path)?;
        if let Some(cap) = &r.volume_capability {
            capability::check_capability("volume_capability", cap)?;
        }
        let required_bytes = match r.capacity_range.map(|c| c.required_bytes) {
            Some(b) if b < 0 => {
                return Err(Error::invalid(
                    "capacity_range.required_bytes",
                    format!("{b} is negative"),
                )
                .into());
            }
            Some(0) | None => None,
            Some(b) => u64::try_from(b).ok(),
        };
        let size = self
            .service
            .expand(ExpandRequest {
                volume_id: r.volume_id,
                volume_path: PathBuf::from(r.volume_path),
                required_bytes,
            })
            .await?;
        Ok(Response::new(NodeExpandVolumeResponse {
            capacity_bytes: i64::try_from(size).unwrap_or(i64::MAX),
        }))
    }

    async fn node_get_capabilities(
        &self,
        _request: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        let capabilities = [
            Rpc::StageUnstageVolume,
            Rpc::GetVolumeStats,
            Rpc::ExpandVolume,
            // SINGLE_NODE_SINGLE_WRITER and SINGLE_NODE_MULTI_WRITER (capability::MOUNT_MODES).
            Rpc::SingleNodeMultiWriter,
        ]
        .into_iter()
        .map(NodeServiceCapability::rpc)
        .collect();
        Ok(Response::new(NodeGetCapabilitiesResponse { capabilities }))
    }

    async fn node_get_info(
        &self,
        _request: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        let accessible_topology = self.info.zone.as_deref().map(capability::topology);
        Ok(Response::new(NodeGetInfoResponse {
            node_id: self.info.node_id.clone(),
            max_volumes_per_node: self.info.max_volumes_per_node,
            accessible_topology,
        }))
    }
}
