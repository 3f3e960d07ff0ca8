//! csi.v1.Controller: volumes and snapshots as directories and sparse images under the state
//! directory. ControllerPublish only with `--enable-attach` (see `publish`): by default a
//! hostpath volume needs no attach (the skip-attach case).

use std::collections::HashMap;
use std::sync::Arc;

use csi_spec::v1::controller_server::Controller;
use csi_spec::v1::controller_service_capability::rpc::Type as Rpc;
use csi_spec::v1::validate_volume_capabilities_response::Confirmed;
use csi_spec::v1::volume_content_source::{SnapshotSource, Type as SourceType, VolumeSource};
use csi_spec::v1::{
    ControllerExpandVolumeRequest, ControllerExpandVolumeResponse,
    ControllerGetCapabilitiesRequest, ControllerGetCapabilitiesResponse,
    ControllerPublishVolumeRequest, ControllerPublishVolumeResponse, ControllerServiceCapability,
    ControllerUnpublishVolumeRequest, ControllerUnpublishVolumeResponse, CreateSnapshotRequest,
    CreateSnapshotResponse, CreateVolumeRequest, CreateVolumeResponse, DeleteSnapshotRequest,
    DeleteSnapshotResponse, DeleteVolumeRequest, DeleteVolumeResponse, GetCapacityRequest,
    GetCapacityResponse, ListSnapshotsRequest, ListSnapshotsResponse, ListVolumesRequest,
    ListVolumesResponse, ValidateVolumeCapabilitiesRequest, ValidateVolumeCapabilitiesResponse,
    VolumeContentSource, list_snapshots_response, list_volumes_response,
};
use tonic::{Request, Response, Status};

use crate::backing;
use crate::config::{DEFAULT_VOLUME_SIZE, TOPOLOGY_KEY};
use crate::driver::Driver;
use crate::state::{Kind, Snapshot, Source, Volume};
use crate::validate::{self, non_empty};
use crate::{Error, Result, expand, loopdev, publish, snapshots};

#[derive(Debug)]
pub(crate) struct ControllerSvc {
    driver: Arc<Driver>,
}

impl ControllerSvc {
    pub(crate) fn new(driver: Arc<Driver>) -> Self {
        Self { driver }
    }
}

/// The volume as CSI describes it.
pub(crate) fn csi_volume(d: &Driver, v: &Volume) -> csi_spec::v1::Volume {
    csi_spec::v1::Volume {
        capacity_bytes: i64::try_from(v.capacity_bytes).unwrap_or(i64::MAX),
        volume_id: v.id.clone(),
        volume_context: HashMap::new(),
        content_source: v.source.as_ref().map(|s| VolumeContentSource {
            r#type: Some(match s {
                Source::Snapshot(id) => SourceType::Snapshot(SnapshotSource {
                    snapshot_id: id.clone(),
                }),
                Source::Volume(id) => SourceType::Volume(VolumeSource {
                    volume_id: id.clone(),
                }),
            }),
        }),
        accessible_topology: vec![d.topology()],
    }
}

/// The content source a request names, with its required ID checked.
fn content_source(src: Option<&VolumeContentSource>) -> Result<Option<Source>> {
    let Some(src) = src else { return Ok(None) };
    match &src.r#type {
        None => Err(Error::invalid(
            "volume_content_source.type",
            "is required (snapshot or volume) when volume_content_source is set",
        )),
        Some(SourceType::Snapshot(s)) => {
            non_empty("volume_content_source.snapshot.snapshot_id", &s.snapshot_id)?;
            Ok(Some(Source::Snapshot(s.snapshot_id.clone())))
        }
        Some(SourceType::Volume(v)) => {
            non_empty("volume_content_source.volume.volume_id", &v.volume_id)?;
            Ok(Some(Source::Volume(v.volume_id.clone())))
        }
    }
}

/// One page of `items` from the offset `token` (empty = start), at most `max_entries` (0 = all).
/// The next token is the offset of the next page, empty after the last.
pub(crate) fn page<T>(items: Vec<T>, max_entries: i32, token: &str) -> Result<(Vec<T>, String)> {
    if max_entries < 0 {
        return Err(Error::invalid(
            "max_entries",
            format!("must not be negative (got {max_entries})"),
        ));
    }
    let start = if token.is_empty() {
        0
    } else {
        match token.parse::<usize>() {
            Ok(n) if n <= items.len() => n,
            _ => return Err(Error::BadToken(token.to_string())),
        }
    };
    let max = usize::try_from(max_entries).unwrap_or(0);
    let end = if max == 0 {
        items.len()
    } else {
        (start + max).min(items.len())
    };
    let next = if end < items.len() {
        end.to_string()
    } else {
        String::new()
    };
    Ok((
        items.into_iter().skip(start).take(end - start).collect(),
        next,
    ))
}

impl ControllerSvc {
    #[tracing::instrument(skip_all, fields(name = %req.name))]
    async fn create_volume_inner(&self, req: CreateVolumeRequest) -> Result<Volume> {
        let d = &self.driver;
        non_empty("name", &req.name)?;
        let kind = validate::capabilities("volume_capabilities", &req.volume_capabilities)?;
        let size = validate::size(req.capacity_range.as_ref(), kind, DEFAULT_VOLUME_SIZE)?;
        let source = content_source(req.volume_content_source.as_ref())?;
        if !validate::topology_allows(req.accessibility_requirements.as_ref(), &d.config.node_id) {
            return Err(Error::ResourceExhausted(format!(
                "accessibility_requirements: no requisite topology has {TOPOLOGY_KEY}={}; a hostpath volume can only be created on the node whose driver is asked",
                d.config.node_id
            )));
        }
        let _name = d.locks.lock(&format!("volume-name/{}", req.name)).await;
        if let Some(existing) = d.snapshot().await.volume_by_name(&req.name).cloned() {
            check_same(&existing, &req, kind, source.as_ref())?;
            // Check the world: a crash may have come between the record and the content.
            self.fill(&existing).await?;
            tracing::info!(volume_id = %existing.id, "volume exists already");
            return Ok(existing);
        }
        // After the name: a name taken with another size is ALREADY_EXISTS whatever the size
        // (csi-sanity asks for twice its volume size under a name it used).
        let total = d.config.capacity_bytes;
        if size > total {
            return Err(Error::OutOfRange(format!(
                "{size} bytes is more than this driver's whole capacity of {total} bytes"
            )));
        }
        // Hold the source while it is copied, so it is not deleted under the copy.
        let _source_lock = match &source {
            Some(Source::Snapshot(id)) => Some(d.locks.lock(&format!("snapshot/{id}")).await),
            Some(Source::Volume(id)) => Some(d.locks.lock(id).await),
            None => None,
        };
        self.check_source(source.as_ref(), kind, size).await?;
        let volume = Volume {
            id: publish::new_volume_id(&d.config.node_id),
            name: req.name.clone(),
            kind,
            capacity_bytes: size,
            ephemeral: false,
            source,
            staged: None,
            published: Default::default(),
        };
        reserve(d, &volume).await?;
        if let Err(e) = self.fill(&volume).await {
            let _ = backing::remove(&d.volume_path(&volume), kind);
            let id = volume.id.clone();
            d.update(|s| Ok(s.volumes.remove(&id))).await?;
            return Err(e);
        }
        tracing::info!(volume_id = %volume.id, kind = kind.as_str(), size, "created volume");
        Ok(volume)
    }

    /// The source exists, has the same access type and fits in `size`.
    async fn check_source(&self, source: Option<&Source>, kind: Kind, size: u64) -> Result<()> {
        let state = self.driver.snapshot().await;
        let (what, id, src_kind, src_size) = match source {
            None => return Ok(()),
            Some(Source::Snapshot(id)) => {
                let s = state.snapshots.get(id).ok_or_else(|| Error::NotFound {
                    kind: "snapshot",
                    id: id.clone(),
                })?;
                ("snapshot", id, s.kind, s.size_bytes)
            }
            Some(Source::Volume(id)) => {
                let v = state
                    .volumes
                    .get(id)
                    .ok_or_else(|| Error::volume_not_found(id))?;
                ("volume", id, v.kind, v.capacity_bytes)
            }
        };
        if src_kind != kind {
            return Err(Error::invalid(
                "volume_content_source",
                format!(
                    "{what} {id} holds a {} volume, but a {} volume was requested",
                    src_kind.as_str(),
                    kind.as_str()
                ),
            ));
        }
        // A directory's size is its files'; an image's is its length, which must fit.
        if src_size > size {
            return Err(Error::OutOfRange(format!(
                "{what} {id} has {src_size} bytes, more than the {size} bytes requested"
            )));
        }
        Ok(())
    }

    /// Creates the volume's content (empty or copied) unless it is there.
    async fn fill(&self, v: &Volume) -> Result<()> {
        let d = &self.driver;
        let path = d.volume_path(v);
        let dir = &d.config.state_dir;
        match &v.source {
            None => backing::create_empty(&path, v.kind, v.capacity_bytes),
            Some(Source::Snapshot(id)) => {
                let src = backing::snapshot_path(dir, id, v.kind);
                backing::copy(&src, &path, v.kind, v.capacity_bytes).await
            }
            Some(Source::Volume(id)) => {
                let src = backing::volume_path(dir, id, v.kind);
                backing::copy(&src, &path, v.kind, v.capacity_bytes).await
            }
        }
    }

    #[tracing::instrument(skip_all, fields(volume_id = %volume_id))]
    async fn delete_volume_inner(&self, volume_id: &str) -> Result<()> {
        let d = &self.driver;
        non_empty("volume_id", volume_id)?;
        let _lock = d.locks.lock(volume_id).await;
        let Some(v) = d.volume(volume_id).await else {
            tracing::info!("volume does not exist: nothing to delete");
            return Ok(());
        };
        if v.in_use() {
            let mut at: Vec<String> = v
                .published
                .keys()
                .map(|p| format!("published at {}", p.display()))
                .collect();
            if let Some(s) = &v.staged {
                at.push(format!("staged at {}", s.path.display()));
            }
            return Err(Error::FailedPrecondition(format!(
                "volume {volume_id} is still in use ({}); unpublish and unstage it first",
                at.join(", ")
            )));
        }
        let path = d.volume_path(&v);
        if v.kind == Kind::Block {
            loopdev::detach(&d.config.sys_root, &path, None).await?;
        }
        backing::remove(&path, v.kind)?;
        d.update(|s| Ok(s.volumes.remove(volume_id))).await?;
        tracing::info!("deleted volume");
        Ok(())
    }
}

/// A CreateVolume repeated by name must ask for what the volume is.
fn check_same(
    v: &Volume,
    req: &CreateVolumeRequest,
    kind: Kind,
    source: Option<&Source>,
) -> Result<()> {
    let differs = |what: String| {
        Err(Error::AlreadyExists(format!(
            "volume name {} is already used by volume {} with other parameters: {what}",
            v.name, v.id
        )))
    };
    if v.kind != kind {
        return differs(format!(
            "it is a {} volume, {} was requested",
            v.kind.as_str(),
            kind.as_str()
        ));
    }
    if let Some(r) = &req.capacity_range {
        let required = r.required_bytes.unsigned_abs();
        let limit = r.limit_bytes.unsigned_abs();
        if v.capacity_bytes < required || (limit > 0 && v.capacity_bytes > limit) {
            return differs(format!(
                "its capacity is {} bytes, outside the requested range (required {required}, limit {limit})",
                v.capacity_bytes
            ));
        }
    }
    if v.source.as_ref() != source {
        return differs(format!(
            "its content source is {:?}, {:?} was requested",
            v.source, source
        ));
    }
    Ok(())
}

/// Records the volume if its capacity fits what is left (checked and taken under the state
/// lock, so two creates cannot both take the last bytes).
pub(crate) async fn reserve(d: &Driver, volume: &Volume) -> Result<()> {
    let total = d.config.capacity_bytes;
    let v = volume.clone();
    d.update(move |s| {
        let used = s.used_bytes();
        if used.saturating_add(v.capacity_bytes) > total {
            return Err(Error::ResourceExhausted(format!(
                "not enough capacity for {} bytes: {used} of {total} bytes are taken by {} volumes",
                v.capacity_bytes,
                s.volumes.len()
            )));
        }
        s.volumes.insert(v.id.clone(), v);
        Ok(())
    })
    .await
}

#[tonic::async_trait]
impl Controller for ControllerSvc {
    async fn create_volume(
        &self,
        request: Request<CreateVolumeRequest>,
    ) -> Result<Response<CreateVolumeResponse>, Status> {
        let v = self.create_volume_inner(request.into_inner()).await?;
        Ok(Response::new(CreateVolumeResponse {
            volume: Some(csi_volume(&self.driver, &v)),
        }))
    }

    async fn delete_volume(
        &self,
        request: Request<DeleteVolumeRequest>,
    ) -> Result<Response<DeleteVolumeResponse>, Status> {
        self.delete_volume_inner(&request.into_inner().volume_id)
            .await?;
        Ok(Response::new(DeleteVolumeResponse {}))
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<ValidateVolumeCapabilitiesResponse>, Status> {
        let req = request.into_inner();
        non_empty("volume_id", &req.volume_id)?;
        if req.volume_capabilities.is_empty() {
            return Err(Error::required("volume_capabilities").into());
        }
        let mut problems = Vec::new();
        let mut accesses = Vec::new();
        for (i, cap) in req.volume_capabilities.iter().enumerate() {
            accesses.push(validate::shape(
                &format!("volume_capabilities[{i}]"),
                Some(cap),
            )?);
        }
        let v = self.driver.existing_volume(&req.volume_id).await?;
        for (i, a) in accesses.into_iter().enumerate() {
            if a.kind != v.kind {
                problems.push(format!(
                    "volume_capabilities[{i}]: volume {} is a {} volume, not {}",
                    v.id,
                    v.kind.as_str(),
                    a.kind.as_str()
                ));
            }
            if let Some(reason) = validate::unsupported(a) {
                problems.push(format!("volume_capabilities[{i}]: {reason}"));
            }
        }
        let response = if problems.is_empty() {
            ValidateVolumeCapabilitiesResponse {
                confirmed: Some(Confirmed {
                    volume_context: req.volume_context,
                    volume_capabilities: req.volume_capabilities,
                    parameters: req.parameters,
                    mutable_parameters: req.mutable_parameters,
                }),
                message: String::new(),
            }
        } else {
            ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message: problems.join("; "),
            }
        };
        Ok(Response::new(response))
    }

    async fn list_volumes(
        &self,
        request: Request<ListVolumesRequest>,
    ) -> Result<Response<ListVolumesResponse>, Status> {
        let req = request.into_inner();
        let state = self.driver.snapshot().await;
        let all: Vec<&Volume> = state.volumes.values().collect();
        let (items, next_token) = page(all, req.max_entries, &req.starting_token)?;
        let entries = items
            .into_iter()
            .map(|v| list_volumes_response::Entry {
                volume: Some(csi_volume(&self.driver, v)),
                status: None,
            })
            .collect();
        Ok(Response::new(ListVolumesResponse {
            entries,
            next_token,
        }))
    }

    async fn get_capacity(
        &self,
        request: Request<GetCapacityRequest>,
    ) -> Result<Response<GetCapacityResponse>, Status> {
        let req = request.into_inner();
        for (i, cap) in req.volume_capabilities.iter().enumerate() {
            validate::shape(&format!("volume_capabilities[{i}]"), Some(cap))?;
        }
        let here = req.accessible_topology.as_ref().is_none_or(|t| {
            t.segments
                .get(TOPOLOGY_KEY)
                .is_some_and(|n| *n == self.driver.config.node_id)
        });
        let available = if here {
            let used = self.driver.snapshot().await.used_bytes();
            self.driver.config.capacity_bytes.saturating_sub(used)
        } else {
            0
        };
        let available = i64::try_from(available).unwrap_or(i64::MAX);
        Ok(Response::new(GetCapacityResponse {
            available_capacity: available,
            maximum_volume_size: Some(available),
            minimum_volume_size: None,
        }))
    }

    async fn controller_get_capabilities(
        &self,
        _request: Request<ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<ControllerGetCapabilitiesResponse>, Status> {
        let attach = self
            .driver
            .config
            .enable_attach
            .then_some(Rpc::PublishUnpublishVolume);
        let capabilities = [
            Rpc::CreateDeleteVolume,
            Rpc::ListVolumes,
            Rpc::GetCapacity,
            Rpc::CreateDeleteSnapshot,
            Rpc::ListSnapshots,
            Rpc::CloneVolume,
            Rpc::ExpandVolume,
            Rpc::SingleNodeMultiWriter,
        ]
        .into_iter()
        .chain(attach)
        .map(ControllerServiceCapability::rpc)
        .collect();
        Ok(Response::new(ControllerGetCapabilitiesResponse {
            capabilities,
        }))
    }

    async fn controller_publish_volume(
        &self,
        request: Request<ControllerPublishVolumeRequest>,
    ) -> Result<Response<ControllerPublishVolumeResponse>, Status> {
        if !self.driver.config.enable_attach {
            return Err(Status::unimplemented(
                "ControllerPublishVolume: this driver runs without --enable-attach (nothing to attach)",
            ));
        }
        publish::publish(&self.driver, &request.into_inner()).await?;
        Ok(Response::new(ControllerPublishVolumeResponse {
            publish_context: HashMap::new(),
        }))
    }

    async fn controller_unpublish_volume(
        &self,
        request: Request<ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<ControllerUnpublishVolumeResponse>, Status> {
        if !self.driver.config.enable_attach {
            return Err(Status::unimplemented(
                "ControllerUnpublishVolume: this driver runs without --enable-attach (nothing to attach)",
            ));
        }
        publish::unpublish(&request.into_inner())?;
        Ok(Response::new(ControllerUnpublishVolumeResponse {}))
    }

    async fn controller_expand_volume(
        &self,
        request: Request<ControllerExpandVolumeRequest>,
    ) -> Result<Response<ControllerExpandVolumeResponse>, Status> {
        let (size, node_expansion_required) =
            expand::controller(&self.driver, &request.into_inner()).await?;
        Ok(Response::new(ControllerExpandVolumeResponse {
            capacity_bytes: i64::try_from(size).unwrap_or(i64::MAX),
            node_expansion_required,
        }))
    }

    async fn create_snapshot(
        &self,
        request: Request<CreateSnapshotRequest>,
    ) -> Result<Response<CreateSnapshotResponse>, Status> {
        let s = snapshots::create(&self.driver, request.into_inner()).await?;
        Ok(Response::new(CreateSnapshotResponse {
            snapshot: Some(snapshots::csi_snapshot(&s)),
        }))
    }

    async fn delete_snapshot(
        &self,
        request: Request<DeleteSnapshotRequest>,
    ) -> Result<Response<DeleteSnapshotResponse>, Status> {
        snapshots::delete(&self.driver, &request.into_inner().snapshot_id).await?;
        Ok(Response::new(DeleteSnapshotResponse {}))
    }

    async fn list_snapshots(
        &self,
        request: Request<ListSnapshotsRequest>,
    ) -> Result<Response<ListSnapshotsResponse>, Status> {
        let req = request.into_inner();
        let state = self.driver.snapshot().await;
        let all: Vec<&Snapshot> = state
            .snapshots
            .values()
            .filter(|s| req.snapshot_id.is_empty() || s.id == req.snapshot_id)
            .filter(|s| {
                req.source_volume_id.is_empty() || s.source_volume_id == req.source_volume_id
            })
            .collect();
        let (items, next_token) = page(all, req.max_entries, &req.starting_token)?;
        Ok(Response::new(ListSnapshotsResponse {
            entries: items
                .into_iter()
                .map(|s| list_snapshots_response::Entry {
                    snapshot: Some(snapshots::csi_snapshot(s)),
                })
                .collect(),
            next_token,
        }))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use tonic::Code;

    #[test]
    fn pages_and_tokens() {
        let items: Vec<u32> = (0..5).collect();
        let (p, next) = page(items.clone(), 2, "").unwrap();
        assert_eq!((p, next.as_str()), (vec![0, 1], "2"));
        let (p, next) = page(items.clone(), 2, "4").unwrap();
        assert_eq!((p, next.as_str()), (vec![4], ""));
        let (p, next) = page(items.clone(), 0, "").unwrap();
        assert_eq!((p.len(), next.as_str()), (5, ""));
        let (p, _) = page(items.clone(), 3, "5").unwrap();
        assert!(p.is_empty());
        for bad in ["6", "x", "-1"] {
            assert_eq!(
                page(items.clone(), 1, bad).unwrap_err().code(),
                Code::Aborted,
                "{bad}"
            );
        }
        let e = page(items, -1, "").unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(e.to_string().starts_with("max_entries"), "{e}");
    }

    #[test]
    fn content_sources_need_their_ids() {
        assert_eq!(content_source(None).unwrap(), None);
        let e = content_source(Some(&VolumeContentSource { r#type: None })).unwrap_err();
        assert!(
            e.to_string().starts_with("volume_content_source.type"),
            "{e}"
        );
        let e = content_source(Some(&VolumeContentSource {
            r#type: Some(SourceType::Snapshot(SnapshotSource {
                snapshot_id: String::new(),
            })),
        }))
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "volume_content_source.snapshot.snapshot_id is required"
        );
        let ok = content_source(Some(&VolumeContentSource {
            r#type: Some(SourceType::Volume(VolumeSource {
                volume_id: "v".into(),
            })),
        }))
        .unwrap();
        assert_eq!(ok, Some(Source::Volume("v".into())));
    }
}
