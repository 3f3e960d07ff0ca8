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
use csi_spec::v1::volume_capability::AccessType as CsiAccessType;
use csi_spec::v1::volume_capability::access_mode::Mode;
use csi_spec::v1::volume_usage::Unit;
use csi_spec::v1::{
    NodeExpandVolumeRequest, NodeExpandVolumeResponse, NodeGetCapabilitiesRequest,
    NodeGetCapabilitiesResponse, NodeGetInfoRequest, NodeGetInfoResponse,
    NodeGetVolumeStatsRequest, NodeGetVolumeStatsResponse, NodePublishVolumeRequest,
    NodePublishVolumeResponse, NodeServiceCapability, NodeStageVolumeRequest,
    NodeStageVolumeResponse, NodeUnpublishVolumeRequest, NodeUnpublishVolumeResponse,
    NodeUnstageVolumeRequest, NodeUnstageVolumeResponse, Topology, VolumeCapability, VolumeUsage,
};
use tonic::{Request, Response, Status};

use crate::{Error, Result};
use mount_utils::{Usage, VolumeStats};
use requests::{
    AccessType, ExpandRequest, PublishRequest, StageRequest, UnpublishRequest, UnstageRequest,
};
use service::NodeService;

/// The publish-context key under which the controller passes the device name.
pub const DEVICE_PATH_KEY: &str = "devicePath";
/// The driver's own zone topology key (the one PVs carry in their node affinity)...
pub const TOPOLOGY_ZONE_KEY: &str = "topology.ebs.csi.aws.com/zone";
/// ...and the well-known Kubernetes one, so schedulers that only know that one work too.
pub const WELL_KNOWN_ZONE_KEY: &str = "topology.kubernetes.io/zone";

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

fn required(field: &'static str, value: &str) -> Result<()> {
    if value.is_empty() {
        Err(Error::invalid(field, "is required"))
    } else {
        Ok(())
    }
}

/// The access type the request asks for, and whether its access mode makes it read-only.
/// EBS volumes attach to one node: single-node modes are supported, and multi-node
/// multi-writer only for raw block (io2 Multi-Attach, where the application coordinates).
fn access(cap: Option<&VolumeCapability>) -> Result<(AccessType, bool)> {
    let cap = cap.ok_or_else(|| Error::invalid("volume_capability", "is required"))?;
    let access = match &cap.access_type {
        Some(CsiAccessType::Mount(m)) => AccessType::Mount {
            fs_type: m.fs_type.clone(),
            mount_flags: m.mount_flags.clone(),
        },
        Some(CsiAccessType::Block(_)) => AccessType::Block,
        None => {
            return Err(Error::invalid(
                "volume_capability.access_type",
                "is required (mount or block)",
            ));
        }
    };
    let mode = cap.mode().ok_or_else(|| {
        Error::invalid(
            "volume_capability.access_mode",
            "is required and must be a known mode",
        )
    })?;
    let read_only = match mode {
        Mode::SingleNodeWriter => false,
        Mode::SingleNodeReaderOnly => true,
        Mode::MultiNodeMultiWriter if access == AccessType::Block => false,
        other => {
            return Err(Error::invalid(
                "volume_capability.access_mode",
                format!(
                    "{} is not supported for {} volumes (supported: SINGLE_NODE_WRITER, SINGLE_NODE_READER_ONLY, and MULTI_NODE_MULTI_WRITER for block)",
                    other.as_str_name(),
                    if access == AccessType::Block {
                        "block"
                    } else {
                        "mount"
                    }
                ),
            ));
        }
    };
    Ok((access, read_only))
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
    async fn node_stage_volume(
        &self,
        request: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        let r = request.into_inner();
        required("volume_id", &r.volume_id)?;
        required("staging_target_path", &r.staging_target_path)?;
        let (access, _) = access(r.volume_capability.as_ref())?;
        self.service
            .stage(StageRequest {
                volume_id: r.volume_id,
                device_path: device_path(&r.publish_context),
                staging_path: PathBuf::from(r.staging_target_path),
                access,
            })
            .await?;
        Ok(Response::new(NodeStageVolumeResponse {}))
    }

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

    async fn node_publish_volume(
        &self,
        request: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let r = request.into_inner();
        required("volume_id", &r.volume_id)?;
        // Required because this plugin has STAGE_UNSTAGE_VOLUME.
        required("staging_target_path", &r.staging_target_path)?;
        required("target_path", &r.target_path)?;
        let (access, mode_read_only) = access(r.volume_capability.as_ref())?;
        self.service
            .publish(PublishRequest {
                volume_id: r.volume_id,
                device_path: device_path(&r.publish_context),
                staging_path: PathBuf::from(r.staging_target_path),
                target_path: PathBuf::from(r.target_path),
                access,
                read_only: r.readonly || mode_read_only,
            })
            .await?;
        Ok(Response::new(NodePublishVolumeResponse {}))
    }

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

    async fn node_expand_volume(
        &self,
        request: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        let r = request.into_inner();
        required("volume_id", &r.volume_id)?;
        required("volume_path", &r.volume_path)?;
        if r.volume_capability.is_some() {
            access(r.volume_capability.as_ref())?;
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
        let accessible_topology = self.info.zone.as_ref().map(|zone| {
            Topology::from_segments([
                (TOPOLOGY_ZONE_KEY, zone.as_str()),
                (WELL_KNOWN_ZONE_KEY, zone.as_str()),
            ])
        });
        Ok(Response::new(NodeGetInfoResponse {
            node_id: self.info.node_id.clone(),
            max_volumes_per_node: self.info.max_volumes_per_node,
            accessible_topology,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_modes_are_checked_per_access_type() {
        let (a, ro) = access(Some(&VolumeCapability::mount(
            "xfs",
            vec![],
            Mode::SingleNodeReaderOnly,
        )))
        .unwrap();
        assert!(ro);
        assert_eq!(
            a,
            AccessType::Mount {
                fs_type: "xfs".into(),
                mount_flags: vec![]
            }
        );
        let (a, ro) = access(Some(&VolumeCapability::block(Mode::MultiNodeMultiWriter))).unwrap();
        assert!(!ro && a == AccessType::Block);
        let err = access(Some(&VolumeCapability::mount(
            "",
            vec![],
            Mode::MultiNodeMultiWriter,
        )))
        .unwrap_err();
        assert!(
            err.to_string().contains("volume_capability.access_mode"),
            "{err}"
        );
        assert!(err.to_string().contains("MULTI_NODE_MULTI_WRITER"), "{err}");
        let err = access(None).unwrap_err();
        assert!(err.to_string().contains("volume_capability"), "{err}");
        let no_type = VolumeCapability {
            access_type: None,
            ..VolumeCapability::block(Mode::SingleNodeWriter)
        };
        assert!(
            access(Some(&no_type))
                .unwrap_err()
                .to_string()
                .contains("access_type")
        );
        let no_mode = VolumeCapability {
            access_mode: None,
            ..VolumeCapability::block(Mode::SingleNodeWriter)
        };
        assert!(
            access(Some(&no_mode))
                .unwrap_err()
                .to_string()
                .contains("access_mode")
        );
    }
}
