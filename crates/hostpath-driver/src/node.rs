//! csi.v1.Node: bind mounts of volume directories, loop devices bound onto files for block
//! volumes, stats, and CSI ephemeral inline volumes. Every call looks at the mount table and
//! the loop devices first, so a retried or repeated call finds its work done.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use csi_spec::v1::node_server::Node;
use csi_spec::v1::node_service_capability::rpc::Type as Rpc;
use csi_spec::v1::volume_capability::access_mode::Mode;
use csi_spec::v1::volume_usage::Unit;
use csi_spec::v1::{
    NodeExpandVolumeRequest, NodeExpandVolumeResponse, NodeGetCapabilitiesRequest,
    NodeGetCapabilitiesResponse, NodeGetInfoRequest, NodeGetInfoResponse,
    NodeGetVolumeStatsRequest, NodeGetVolumeStatsResponse, NodePublishVolumeRequest,
    NodePublishVolumeResponse, NodeServiceCapability, NodeStageVolumeRequest,
    NodeStageVolumeResponse, NodeUnpublishVolumeRequest, NodeUnpublishVolumeResponse,
    NodeUnstageVolumeRequest, NodeUnstageVolumeResponse, VolumeCondition, VolumeUsage,
};
use mount_utils::{Usage, VolumeStats, mount};
use tonic::{Request, Response, Status};

use crate::config::{DEFAULT_VOLUME_SIZE, EPHEMERAL_CONTEXT_KEY};
use crate::controller::reserve;
use crate::driver::Driver;
use crate::loopdev::{self, LoopDev};
use crate::state::{Kind, Published, Staged, Volume};
use crate::validate::{self, non_empty};
use crate::{Error, Result, backing, expand, mounts};

#[derive(Debug)]
pub(crate) struct NodeSvc {
    driver: Arc<Driver>,
}

impl NodeSvc {
    pub(crate) fn new(driver: Arc<Driver>) -> Self {
        Self { driver }
    }
}

fn path_field(field: &str, value: &str) -> Result<PathBuf> {
    non_empty(field, value)?;
    Ok(PathBuf::from(value))
}

fn io_ok_if_missing(r: std::io::Result<()>, op: &'static str, path: &Path) -> Result<()> {
    match r {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(op, path, e)),
    }
}

impl NodeSvc {
    fn sys(&self) -> &Path {
        &self.driver.config.sys_root
    }

    /// The writable or read-only loop device of a block volume (adopted if one exists).
    async fn loop_device(&self, v: &Volume, read_only: bool) -> Result<LoopDev> {
        loopdev::ensure(self.sys(), &self.driver.volume_path(v), read_only).await
    }

    /// Detaches the loop devices a block volume no longer needs: the writable one once it is
    /// neither staged nor published read-write, the read-only one once no read-only
    /// publication is left.
    async fn release_loop(&self, v: &Volume) -> Result<()> {
        if v.kind != Kind::Block {
            return Ok(());
        }
        let image = self.driver.volume_path(v);
        let need_rw = v.staged.is_some() || v.published.values().any(|p| !p.read_only);
        let need_ro = v.published.values().any(|p| p.read_only);
        if !need_rw {
            loopdev::detach(self.sys(), &image, Some(false)).await?;
        }
        if !need_ro {
            loopdev::detach(self.sys(), &image, Some(true)).await?;
        }
        Ok(())
    }

    #[tracing::instrument(skip_all, fields(volume_id = %req.volume_id))]
    async fn stage(&self, req: NodeStageVolumeRequest) -> Result<()> {
        let d = &self.driver;
        if !d.config.stage_unstage {
            return Err(Error::Unimplemented(
                "NodeStageVolume: this driver runs with --stage-unstage=false".into(),
            ));
        }
        non_empty("volume_id", &req.volume_id)?;
        let staging = path_field("staging_target_path", &req.staging_target_path)?;
        validate::capability("volume_capability", req.volume_capability.as_ref())?;
        let _lock = d.locks.lock(&req.volume_id).await;
        let v = d.existing_volume(&req.volume_id).await?;
        validate::access_for(&v, req.volume_capability.as_ref())?;
        if let Some(s) = &v.staged {
            if s.path != staging {
                return Err(Error::AlreadyExists(format!(
                    "volume {} is already staged at {}, not at staging_target_path {}",
                    v.id,
                    s.path.display(),
                    staging.display()
                )));
            }
        }
        let mut mounted_now = false;
        let loop_device = match v.kind {
            Kind::Mount => {
                let dir = d.volume_path(&v);
                std::fs::create_dir_all(&staging)
                    .map_err(|e| Error::io("creating", &staging, e))?;
                if !mounts::is_dir_mount(&staging, &dir).await? {
                    if let Some(other) = mounts::mount_at(&staging).await? {
                        return Err(Error::AlreadyExists(format!(
                            "staging_target_path {} already has {} mounted, not volume {}",
                            staging.display(),
                            other.source,
                            v.id
                        )));
                    }
                    mount::bind(&dir, &staging, false).await?;
                    mounted_now = true;
                }
                None
            }
            Kind::Block => {
                // Nothing is mounted there, but the path is the volume's on this node (stats
                // and expansion may name it), as the kubelet expects it to exist.
                std::fs::create_dir_all(&staging)
                    .map_err(|e| Error::io("creating", &staging, e))?;
                Some(self.loop_device(&v, false).await?.path)
            }
        };
        let id = v.id.clone();
        let recorded = d
            .update(|s| {
                if let Some(v) = s.volumes.get_mut(&id) {
                    v.staged = Some(Staged {
                        path: staging.clone(),
                        loop_device,
                    });
                }
                Ok(())
            })
            .await;
        if let Err(e) = recorded {
            // A stage the state does not know about would let DeleteVolume remove the volume
            // under its mount: undo the mount, so the failure leaves nothing behind.
            if mounted_now {
                undo_mount(&staging).await;
            }
            return Err(e);
        }
        tracing::info!("staged");
        Ok(())
    }

    #[tracing::instrument(skip_all, fields(volume_id = %req.volume_id))]
    async fn unstage(&self, req: NodeUnstageVolumeRequest) -> Result<()> {
        let d = &self.driver;
        if !d.config.stage_unstage {
            return Err(Error::Unimplemented(
                "NodeUnstageVolume: this driver runs with --stage-unstage=false".into(),
            ));
        }
        non_empty("volume_id", &req.volume_id)?;
        let staging = path_field("staging_target_path", &req.staging_target_path)?;
        let _lock = d.locks.lock(&req.volume_id).await;
        let v = d.existing_volume(&req.volume_id).await?;
        let recorded = v.staged.as_ref().is_some_and(|s| s.path == staging);
        if v.kind == Kind::Mount {
            let ours = mounts::is_dir_mount(&staging, &d.volume_path(&v)).await?;
            if ours || recorded {
                mount::unmount(&staging).await?;
            }
        }
        let id = v.id.clone();
        let after = d
            .update(|s| {
                let v = s
                    .volumes
                    .get_mut(&id)
                    .ok_or_else(|| Error::volume_not_found(&id))?;
                if recorded {
                    v.staged = None;
                }
                Ok(v.clone())
            })
            .await?;
        self.release_loop(&after).await?;
        tracing::info!("unstaged");
        Ok(())
    }

    /// The volume to publish: the one on record, or a new ephemeral one when the kubelet
    /// publishes an inline volume it never created. The bool says whether it is new.
    async fn volume_to_publish(&self, req: &NodePublishVolumeRequest) -> Result<(Volume, bool)> {
        let d = &self.driver;
        if let Some(v) = d.volume(&req.volume_id).await {
            return Ok((v, false));
        }
        let ephemeral = req
            .volume_context
            .get(EPHEMERAL_CONTEXT_KEY)
            .is_some_and(|v| v == "true");
        if !ephemeral {
            return Err(Error::volume_not_found(&req.volume_id));
        }
        if !backing::safe_id(&req.volume_id) {
            return Err(Error::invalid(
                "volume_id",
                format!(
                    "{:?} cannot name an ephemeral volume's directory (letters, digits, '-', '_', '.')",
                    req.volume_id
                ),
            ));
        }
        let access = validate::capability("volume_capability", req.volume_capability.as_ref())?;
        if access.kind != Kind::Mount {
            return Err(Error::invalid(
                "volume_capability.access_type",
                "an ephemeral inline volume is a directory: only mount access is supported",
            ));
        }
        let v = Volume {
            id: req.volume_id.clone(),
            name: req.volume_id.clone(),
            kind: Kind::Mount,
            capacity_bytes: DEFAULT_VOLUME_SIZE,
            ephemeral: true,
            source: None,
            staged: None,
            published: Default::default(),
        };
        reserve(d, &v).await?;
        if let Err(e) = backing::create_empty(&d.volume_path(&v), Kind::Mount, 0) {
            d.update(|s| Ok(s.volumes.remove(&v.id))).await?;
            return Err(e);
        }
        tracing::info!("created ephemeral volume");
        Ok((v, true))
    }

    #[tracing::instrument(skip_all, fields(volume_id = %req.volume_id, target = %req.target_path))]
    async fn publish(&self, req: NodePublishVolumeRequest) -> Result<()> {
        let d = &self.driver;
        non_empty("volume_id", &req.volume_id)?;
        let target = path_field("target_path", &req.target_path)?;
        validate::capability("volume_capability", req.volume_capability.as_ref())?;
        let _lock = d.locks.lock(&req.volume_id).await;
        let (v, created) = self.volume_to_publish(&req).await?;
        let result = self.publish_volume(&req, &v, &target).await;
        if result.is_err() && v.kind == Kind::Block {
            // A loop device attached for a publish that failed is not left behind.
            if let Some(now) = d.volume(&v.id).await {
                if let Err(e) = self.release_loop(&now).await {
                    tracing::warn!(error = %e, "releasing loop devices after a failed publish");
                }
            }
        }
        if result.is_err() && created {
            // An ephemeral volume that never got published is not left behind.
            let _ = backing::remove(&d.volume_path(&v), v.kind);
            d.update(|s| Ok(s.volumes.remove(&v.id))).await?;
        }
        result
    }

    async fn publish_volume(
        &self,
        req: &NodePublishVolumeRequest,
        v: &Volume,
        target: &Path,
    ) -> Result<()> {
        let d = &self.driver;
        let access = validate::access_for(v, req.volume_capability.as_ref())?;
        let read_only = req.readonly || access.read_only_mode();
        let mode = access.mode.as_str_name().to_string();
        if let Some(p) = v.published.get(target) {
            if p.read_only != read_only || p.access_mode != mode {
                return Err(Error::AlreadyExists(format!(
                    "volume {} is already published at target_path {} with read_only={} and {}; asked for read_only={read_only} and {mode}",
                    v.id,
                    target.display(),
                    p.read_only,
                    p.access_mode
                )));
            }
        }
        let single = Mode::SingleNodeSingleWriter.as_str_name();
        if let Some((other, _)) = v
            .published
            .iter()
            .find(|(t, p)| t.as_path() != target && (p.access_mode == single || mode == single))
        {
            return Err(Error::FailedPrecondition(format!(
                "volume {} is SINGLE_NODE_SINGLE_WRITER and already published at {}",
                v.id,
                other.display()
            )));
        }
        let staging =
            (!req.staging_target_path.is_empty()).then(|| PathBuf::from(&req.staging_target_path));
        let mut mounted_now = false;
        let existing = match v.kind {
            Kind::Mount => {
                let dir = d.volume_path(v);
                let staged_at = match (&staging, &v.staged) {
                    (Some(s), Some(st)) if st.path == *s => {
                        mounts::is_dir_mount(s, &dir).await?.then(|| s.clone())
                    }
                    _ => None,
                };
                std::fs::create_dir_all(target).map_err(|e| Error::io("creating", target, e))?;
                let existing = mounts::dir_mount(target, &dir).await?;
                if existing.is_none() {
                    self.refuse_foreign_mount(v, target).await?;
                    let source = staged_at.as_deref().unwrap_or(&dir);
                    mount::bind(source, target, read_only).await?;
                    mounted_now = true;
                }
                existing
            }
            Kind::Block => {
                let dev = self.loop_device(v, read_only).await?;
                if let Some(parent) = target.parent() {
                    std::fs::create_dir_all(parent)
                        .map_err(|e| Error::io("creating", parent, e))?;
                }
                let existing = mounts::device_mount(target, dev.number).await?;
                if existing.is_none() {
                    self.refuse_foreign_mount(v, target).await?;
                    std::fs::OpenOptions::new()
                        .create(true)
                        .truncate(false)
                        .write(true)
                        .open(target)
                        .map_err(|e| Error::io("creating the block target file", target, e))?;
                    mount::bind(&dev.path, target, read_only).await?;
                    mounted_now = true;
                }
                existing
            }
        };
        if let Some(entry) = existing {
            if entry.read_only() != read_only {
                return Err(Error::AlreadyExists(format!(
                    "volume {} is already mounted at target_path {} {}, but {} was asked for",
                    v.id,
                    target.display(),
                    if entry.read_only() {
                        "read-only"
                    } else {
                        "read-write"
                    },
                    if read_only { "read-only" } else { "read-write" },
                )));
            }
        }
        let (id, target, record) = (
            v.id.clone(),
            target.to_path_buf(),
            Published {
                read_only,
                staging_path: staging,
                access_mode: mode,
            },
        );
        let recorded = d
            .update(|s| {
                if let Some(v) = s.volumes.get_mut(&id) {
                    v.published.insert(target.clone(), record);
                }
                Ok(())
            })
            .await;
        if let Err(e) = recorded {
            // As for a stage: an unrecorded publish must not stay mounted.
            if mounted_now {
                undo_mount(&target).await;
            }
            return Err(e);
        }
        tracing::info!(read_only, "published");
        Ok(())
    }

    /// Something else is mounted at the target: never stacked over.
    async fn refuse_foreign_mount(&self, v: &Volume, target: &Path) -> Result<()> {
        match mounts::mount_at(target).await? {
            Some(other) => Err(Error::AlreadyExists(format!(
                "target_path {} already has {} mounted, not volume {}",
                target.display(),
                other.source,
                v.id
            ))),
            None => Ok(()),
        }
    }

    #[tracing::instrument(skip_all, fields(volume_id = %req.volume_id, target = %req.target_path))]
    async fn unpublish(&self, req: NodeUnpublishVolumeRequest) -> Result<()> {
        let d = &self.driver;
        non_empty("volume_id", &req.volume_id)?;
        let target = path_field("target_path", &req.target_path)?;
        let _lock = d.locks.lock(&req.volume_id).await;
        let v = d.existing_volume(&req.volume_id).await?;
        let recorded = v.published.contains_key(&target);
        let ours = match v.kind {
            Kind::Mount => mounts::is_dir_mount(&target, &d.volume_path(&v)).await?,
            Kind::Block => mounts::loop_mount(self.sys(), &d.volume_path(&v), &target)
                .await?
                .is_some(),
        };
        if ours || recorded {
            mount::unmount(&target).await?;
            // CSI: the plugin removes what it created at target_path.
            let removed = if target.is_dir() {
                std::fs::remove_dir(&target)
            } else {
                std::fs::remove_file(&target)
            };
            io_ok_if_missing(removed, "removing", &target)?;
        }
        let id = v.id.clone();
        let after = d
            .update(|s| {
                let v = s
                    .volumes
                    .get_mut(&id)
                    .ok_or_else(|| Error::volume_not_found(&id))?;
                v.published.remove(&target);
                Ok(v.clone())
            })
            .await?;
        self.release_loop(&after).await?;
        if after.ephemeral && !after.in_use() {
            backing::remove(&d.volume_path(&after), after.kind)?;
            d.update(|s| Ok(s.volumes.remove(&id))).await?;
            tracing::info!("deleted ephemeral volume");
        }
        tracing::info!("unpublished");
        Ok(())
    }

    #[tracing::instrument(skip_all, fields(volume_id = %req.volume_id, path = %req.volume_path))]
    async fn stats(&self, req: NodeGetVolumeStatsRequest) -> Result<NodeGetVolumeStatsResponse> {
        let d = &self.driver;
        non_empty("volume_id", &req.volume_id)?;
        let path = path_field("volume_path", &req.volume_path)?;
        let v = d.existing_volume(&req.volume_id).await?;
        if !path.exists() {
            return Err(Error::NotFound {
                kind: "volume_path",
                id: path.display().to_string(),
            });
        }
        let not_here = || Error::NotFound {
            kind: "volume",
            id: format!("{} at volume_path {}", v.id, path.display()),
        };
        let backing = d.volume_path(&v);
        let stats = match v.kind {
            Kind::Mount => {
                if !mounts::is_dir_mount(&path, &backing).await? {
                    return Err(not_here());
                }
                mount_utils::stats::filesystem(&path)?
            }
            Kind::Block => {
                let dev = mounts::loop_mount(self.sys(), &backing, &path)
                    .await?
                    .ok_or_else(not_here)?;
                VolumeStats::Block {
                    size_bytes: mount_utils::stats::block_device_size(self.sys(), dev.number)?,
                }
            }
        };
        let usage = match stats {
            VolumeStats::Filesystem { bytes, inodes } => {
                vec![usage(bytes, Unit::Bytes), usage(inodes, Unit::Inodes)]
            }
            VolumeStats::Block { size_bytes } => vec![VolumeUsage {
                total: i64::try_from(size_bytes).unwrap_or(i64::MAX),
                unit: Unit::Bytes.into(),
                ..Default::default()
            }],
        };
        let condition = if backing.exists() {
            VolumeCondition {
                abnormal: false,
                message: "volume is healthy".into(),
            }
        } else {
            VolumeCondition {
                abnormal: true,
                message: format!("the volume's content {} is gone", backing.display()),
            }
        };
        Ok(NodeGetVolumeStatsResponse {
            usage,
            volume_condition: Some(condition),
        })
    }
}

fn usage(u: Usage, unit: Unit) -> VolumeUsage {
    let i = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    VolumeUsage {
        available: i(u.available),
        total: i(u.total),
        used: i(u.used),
        unit: unit.into(),
    }
}

#[tonic::async_trait]
impl Node for NodeSvc {
    async fn node_stage_volume(
        &self,
        request: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        self.stage(request.into_inner()).await?;
        Ok(Response::new(NodeStageVolumeResponse {}))
    }

    async fn node_unstage_volume(
        &self,
        request: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        self.unstage(request.into_inner()).await?;
        Ok(Response::new(NodeUnstageVolumeResponse {}))
    }

    async fn node_publish_volume(
        &self,
        request: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        self.publish(request.into_inner()).await?;
        Ok(Response::new(NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        self.unpublish(request.into_inner()).await?;
        Ok(Response::new(NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        Ok(Response::new(self.stats(request.into_inner()).await?))
    }

    async fn node_expand_volume(
        &self,
        request: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        let size = expand::node(&self.driver, &request.into_inner()).await?;
        Ok(Response::new(NodeExpandVolumeResponse {
            capacity_bytes: i64::try_from(size).unwrap_or(i64::MAX),
        }))
    }

    async fn node_get_capabilities(
        &self,
        _request: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        let mut rpcs = Vec::new();
        if self.driver.config.stage_unstage {
            rpcs.push(Rpc::StageUnstageVolume);
        }
        rpcs.extend([
            Rpc::GetVolumeStats,
            Rpc::ExpandVolume,
            Rpc::VolumeCondition,
            Rpc::SingleNodeMultiWriter,
        ]);
        Ok(Response::new(NodeGetCapabilitiesResponse {
            capabilities: rpcs.into_iter().map(NodeServiceCapability::rpc).collect(),
        }))
    }

    async fn node_get_info(
        &self,
        _request: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        let c = &self.driver.config;
        Ok(Response::new(NodeGetInfoResponse {
            node_id: c.node_id.clone(),
            max_volumes_per_node: c.max_volumes_per_node,
            accessible_topology: Some(self.driver.topology()),
        }))
    }
}

/// Unmounts what this call just mounted at `path` because recording it failed; a failure to
/// unmount is logged (the caller's error is the one returned).
async fn undo_mount(path: &Path) {
    match mount::unmount(path).await {
        Ok(_) => {
            tracing::warn!(path = %path.display(), "recording the mount failed: unmounted again")
        }
        Err(e) => {
            tracing::error!(path = %path.display(), error = %e, "recording the mount failed and unmounting it failed too")
        }
    }
}
