//! The Identity and Controller services. Each RPC: record the call, play a scripted step if one
//! is queued, then the default behaviour, which follows the CSI spec's validation and codes.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

use csi_spec::v1::controller_server::Controller;
use csi_spec::v1::controller_service_capability::rpc::Type as RpcType;
use csi_spec::v1::identity_server::Identity;
use csi_spec::v1::list_volumes_response::{Entry, VolumeStatus};
use csi_spec::v1::plugin_capability::service::Type as ServiceType;
use csi_spec::v1::volume_capability::access_mode::Mode;
use csi_spec::v1::{
    ControllerGetCapabilitiesRequest, ControllerGetCapabilitiesResponse,
    ControllerPublishVolumeRequest, ControllerPublishVolumeResponse, ControllerServiceCapability,
    ControllerUnpublishVolumeRequest, ControllerUnpublishVolumeResponse, CreateVolumeRequest,
    CreateVolumeResponse, DeleteVolumeRequest, DeleteVolumeResponse, GetPluginCapabilitiesRequest,
    GetPluginCapabilitiesResponse, GetPluginInfoRequest, GetPluginInfoResponse, ListVolumesRequest,
    ListVolumesResponse, PluginCapability, ProbeRequest, ProbeResponse, Volume, VolumeCapability,
};
use tonic::{Request, Response, Status};

use crate::state::{Call, CreatedVolume, Method, Publication, Shared};

/// The capacity of a created volume whose request names none: 1 GiB.
const DEFAULT_VOLUME_BYTES: i64 = 1 << 30;

/// The key of the publish context the mock answers, as the EBS driver names it.
pub const DEVICE_PATH_KEY: &str = "devicePath";

#[derive(Clone)]
pub(crate) struct MockService {
    pub(crate) shared: Arc<Shared>,
}

fn to_btree(map: &std::collections::HashMap<String, String>) -> BTreeMap<String, String> {
    map.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

fn invalid(field: &str, what: &str) -> Status {
    Status::invalid_argument(format!("{field}: {what}"))
}

impl MockService {
    /// Identity RPCs: record, script, answer.
    async fn simple<T>(
        &self,
        method: Method,
        answer: impl FnOnce(&Shared) -> Result<T, Status>,
    ) -> Result<Response<T>, Status> {
        let guard = self.shared.record(Call::new(method));
        let result = async {
            self.shared.play_script(method, "").await?;
            answer(&self.shared).map(Response::new)
        }
        .await;
        guard.finish(result)
    }

    fn controller_enabled(&self, cap: bool, what: &str) -> Result<(), Status> {
        if self.shared.config.controller_service && cap {
            Ok(())
        } else {
            Err(Status::unimplemented(format!(
                "{what} is not supported: the capability is turned off in this mock"
            )))
        }
    }

    fn publish(
        &self,
        req: &ControllerPublishVolumeRequest,
    ) -> Result<ControllerPublishVolumeResponse, Status> {
        self.controller_enabled(
            self.shared.config.publish_unpublish,
            "ControllerPublishVolume",
        )?;
        if req.volume_id.is_empty() {
            return Err(invalid("volume_id", "required, got an empty string"));
        }
        if req.node_id.is_empty() {
            return Err(invalid("node_id", "required, got an empty string"));
        }
        let cap = validate_capability(req.volume_capability.as_ref())?;
        if req.readonly && !self.shared.config.publish_readonly {
            return Err(invalid(
                "readonly",
                "must be false: the plugin does not advertise PUBLISH_READONLY",
            ));
        }
        let single_node = matches!(
            cap.mode(),
            Some(
                Mode::SingleNodeWriter
                    | Mode::SingleNodeReaderOnly
                    | Mode::SingleNodeSingleWriter
                    | Mode::SingleNodeMultiWriter
            )
        );
        let mut inner = self.shared.lock();
        let nodes = inner.volumes.entry(req.volume_id.clone()).or_default();
        match nodes.get(&req.node_id) {
            Some(existing) => {
                let same_cap = existing.capability.as_ref().is_none_or(|c| c == cap);
                if existing.readonly != req.readonly || !same_cap {
                    return Err(Status::already_exists(format!(
                        "volume {} is already published on node {} with a different capability \
                         or readonly flag",
                        req.volume_id, req.node_id
                    )));
                }
            }
            None if single_node && !nodes.is_empty() => {
                let others: Vec<&str> = nodes.keys().map(String::as_str).collect();
                return Err(Status::failed_precondition(format!(
                    "volume {} is published on node(s) {} and its access mode is single-node",
                    req.volume_id,
                    others.join(", ")
                )));
            }
            None => {
                nodes.insert(
                    req.node_id.clone(),
                    Publication {
                        readonly: req.readonly,
                        capability: Some(cap.clone()),
                    },
                );
                tracing::info!(volume_id = %req.volume_id, node_id = %req.node_id, "published");
            }
        }
        Ok(ControllerPublishVolumeResponse {
            publish_context: [(
                DEVICE_PATH_KEY.to_owned(),
                format!("/dev/mock/{}", req.volume_id),
            )]
            .into(),
        })
    }

    fn unpublish(&self, req: &ControllerUnpublishVolumeRequest) -> Result<(), Status> {
        self.controller_enabled(
            self.shared.config.publish_unpublish,
            "ControllerUnpublishVolume",
        )?;
        if req.volume_id.is_empty() {
            return Err(invalid("volume_id", "required, got an empty string"));
        }
        let mut inner = self.shared.lock();
        // Unknown volume or not published there: already done (idempotent, per spec).
        if let Some(nodes) = inner.volumes.get_mut(&req.volume_id) {
            if req.node_id.is_empty() {
                // The spec: an empty node_id unpublishes the volume from every node.
                nodes.clear();
            } else {
                nodes.remove(&req.node_id);
            }
            tracing::info!(volume_id = %req.volume_id, node_id = %req.node_id, "unpublished");
        }
        Ok(())
    }

    fn list(&self, req: &ListVolumesRequest) -> Result<ListVolumesResponse, Status> {
        self.controller_enabled(self.shared.config.list_published_nodes, "ListVolumes")?;
        let max = usize::try_from(req.max_entries)
            .map_err(|_| invalid("max_entries", "must not be negative"))?;
        let inner = self.shared.lock();
        // The token is the ID of the next volume to return; volumes are never forgotten, so a
        // token handed out stays valid.
        let start = if req.starting_token.is_empty() {
            None
        } else if inner.volumes.contains_key(&req.starting_token) {
            Some(req.starting_token.as_str())
        } else {
            return Err(Status::aborted(format!(
                "starting_token {:?} does not match any page this plugin handed out",
                req.starting_token
            )));
        };
        let lower = start.map_or(Bound::Unbounded, Bound::Included);
        let mut iter = inner
            .volumes
            .range::<str, _>((lower, Bound::Unbounded))
            .peekable();
        let limit = if max == 0 { usize::MAX } else { max };
        let mut entries = Vec::new();
        while entries.len() < limit {
            let Some((id, nodes)) = iter.next() else {
                break;
            };
            entries.push(Entry {
                volume: Some(Volume {
                    volume_id: id.clone(),
                    ..Default::default()
                }),
                status: Some(VolumeStatus {
                    published_node_ids: nodes.keys().cloned().collect(),
                    volume_condition: None,
                }),
            });
        }
        let next_token = iter.peek().map(|(id, _)| (*id).clone()).unwrap_or_default();
        Ok(ListVolumesResponse {
            entries,
            next_token,
        })
    }
}

impl MockService {
    fn create(&self, req: &CreateVolumeRequest) -> Result<CreateVolumeResponse, Status> {
        self.controller_enabled(self.shared.config.create_delete_volume, "CreateVolume")?;
        if req.name.is_empty() {
            return Err(invalid("name", "required, got an empty string"));
        }
        if req.volume_capabilities.is_empty() {
            return Err(invalid("volume_capabilities", "required, got none"));
        }
        for cap in &req.volume_capabilities {
            validate_capability(Some(cap))?;
        }
        if req.volume_content_source.is_some() && !self.shared.config.clone_volume {
            return Err(invalid(
                "volume_content_source",
                "this mock has no CLONE_VOLUME capability",
            ));
        }
        let range = req.capacity_range.unwrap_or_default();
        let mut inner = self.shared.lock();
        if let Some(existing) = inner.created.get(&req.name) {
            let fits = existing.capacity_bytes >= range.required_bytes
                && (range.limit_bytes == 0 || existing.capacity_bytes <= range.limit_bytes);
            if !fits {
                return Err(Status::already_exists(format!(
                    "volume {} exists with {} bytes, outside the requested range",
                    req.name, existing.capacity_bytes
                )));
            }
            return Ok(created_response(existing));
        }
        let capacity_bytes = if range.required_bytes > 0 {
            range.required_bytes
        } else if range.limit_bytes > 0 {
            range.limit_bytes
        } else {
            DEFAULT_VOLUME_BYTES
        };
        let accessible_topology = if self.shared.config.accessibility_constraints {
            req.accessibility_requirements
                .as_ref()
                .and_then(|t| t.preferred.first().or(t.requisite.first()))
                .map(|t| vec![to_btree(&t.segments)])
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        let volume = CreatedVolume {
            volume_id: format!("{}{}", self.shared.config.volume_id_prefix, req.name),
            capacity_bytes,
            accessible_topology,
        };
        tracing::info!(name = %req.name, volume_id = %volume.volume_id, "created");
        inner.created.insert(req.name.clone(), volume.clone());
        Ok(created_response(&volume))
    }

    fn delete(&self, req: &DeleteVolumeRequest) -> Result<(), Status> {
        self.controller_enabled(self.shared.config.create_delete_volume, "DeleteVolume")?;
        if req.volume_id.is_empty() {
            return Err(invalid("volume_id", "required, got an empty string"));
        }
        let mut inner = self.shared.lock();
        inner.created.retain(|_, v| v.volume_id != req.volume_id);
        Ok(())
    }
}

fn created_response(v: &CreatedVolume) -> CreateVolumeResponse {
    CreateVolumeResponse {
        volume: Some(Volume {
            volume_id: v.volume_id.clone(),
            capacity_bytes: v.capacity_bytes,
            accessible_topology: v
                .accessible_topology
                .iter()
                .map(|s| csi_spec::v1::Topology {
                    segments: s.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
                })
                .collect(),
            ..Default::default()
        }),
    }
}

/// The spec: volume_capability is required, with an access mode and exactly one access type.
fn validate_capability(cap: Option<&VolumeCapability>) -> Result<&VolumeCapability, Status> {
    let cap = cap.ok_or_else(|| invalid("volume_capability", "required, got none"))?;
    if cap.access_type.is_none() {
        return Err(invalid(
            "volume_capability.access_type",
            "required: one of block or mount",
        ));
    }
    match cap.mode() {
        None | Some(Mode::Unknown) => Err(invalid(
            "volume_capability.access_mode",
            "required: a known mode other than UNKNOWN",
        )),
        Some(_) => Ok(cap),
    }
}

#[tonic::async_trait]
impl Identity for MockService {
    async fn get_plugin_info(
        &self,
        _request: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        self.simple(Method::GetPluginInfo, |s| {
            Ok(GetPluginInfoResponse {
                name: s.config.name.clone(),
                vendor_version: env!("CARGO_PKG_VERSION").to_owned(),
                manifest: Default::default(),
            })
        })
        .await
    }

    async fn get_plugin_capabilities(
        &self,
        _request: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        self.simple(Method::GetPluginCapabilities, |s| {
            let mut capabilities = Vec::new();
            if s.config.controller_service {
                capabilities.push(PluginCapability::service(ServiceType::ControllerService));
            }
            if s.config.accessibility_constraints {
                capabilities.push(PluginCapability::service(
                    ServiceType::VolumeAccessibilityConstraints,
                ));
            }
            Ok(GetPluginCapabilitiesResponse { capabilities })
        })
        .await
    }

    async fn probe(
        &self,
        _request: Request<ProbeRequest>,
    ) -> Result<Response<ProbeResponse>, Status> {
        self.simple(Method::Probe, |_| Ok(ProbeResponse { ready: Some(true) }))
            .await
    }
}

#[tonic::async_trait]
impl Controller for MockService {
    async fn controller_get_capabilities(
        &self,
        _request: Request<ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<ControllerGetCapabilitiesResponse>, Status> {
        let guard = self
            .shared
            .record(Call::new(Method::ControllerGetCapabilities));
        let result = async {
            self.shared
                .play_script(Method::ControllerGetCapabilities, "")
                .await?;
            self.controller_enabled(true, "ControllerGetCapabilities")?;
            let c = &self.shared.config;
            let mut caps = Vec::new();
            if c.publish_unpublish {
                caps.push(RpcType::PublishUnpublishVolume);
            }
            if c.publish_readonly {
                caps.push(RpcType::PublishReadonly);
            }
            if c.list_published_nodes {
                caps.push(RpcType::ListVolumes);
                caps.push(RpcType::ListVolumesPublishedNodes);
            }
            if c.create_delete_volume {
                caps.push(RpcType::CreateDeleteVolume);
            }
            if c.clone_volume {
                caps.push(RpcType::CloneVolume);
            }
            Ok(Response::new(ControllerGetCapabilitiesResponse {
                capabilities: caps
                    .into_iter()
                    .map(ControllerServiceCapability::rpc)
                    .collect(),
            }))
        }
        .await;
        guard.finish(result)
    }

    async fn controller_publish_volume(
        &self,
        request: Request<ControllerPublishVolumeRequest>,
    ) -> Result<Response<ControllerPublishVolumeResponse>, Status> {
        let req = request.into_inner();
        let call = Call {
            volume_id: req.volume_id.clone(),
            node_id: req.node_id.clone(),
            readonly: req.readonly,
            capability: req.volume_capability.clone(),
            secrets: to_btree(&req.secrets),
            volume_context: to_btree(&req.volume_context),
            ..Call::new(Method::ControllerPublishVolume)
        };
        let guard = self.shared.record(call);
        let result = async {
            self.shared
                .play_script(Method::ControllerPublishVolume, &req.volume_id)
                .await?;
            self.shared.sleep(self.shared.config.delay).await?;
            self.publish(&req).map(Response::new)
        }
        .await;
        guard.finish(result)
    }

    async fn controller_unpublish_volume(
        &self,
        request: Request<ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<ControllerUnpublishVolumeResponse>, Status> {
        let req = request.into_inner();
        let call = Call {
            volume_id: req.volume_id.clone(),
            node_id: req.node_id.clone(),
            secrets: to_btree(&req.secrets),
            ..Call::new(Method::ControllerUnpublishVolume)
        };
        let guard = self.shared.record(call);
        let result = async {
            self.shared
                .play_script(Method::ControllerUnpublishVolume, &req.volume_id)
                .await?;
            self.shared.sleep(self.shared.config.delay).await?;
            self.unpublish(&req)
                .map(|()| Response::new(ControllerUnpublishVolumeResponse {}))
        }
        .await;
        guard.finish(result)
    }

    async fn list_volumes(
        &self,
        request: Request<ListVolumesRequest>,
    ) -> Result<Response<ListVolumesResponse>, Status> {
        let req = request.into_inner();
        let guard = self.shared.record(Call::new(Method::ListVolumes));
        let result = async {
            self.shared.play_script(Method::ListVolumes, "").await?;
            self.list(&req).map(Response::new)
        }
        .await;
        guard.finish(result)
    }

    async fn create_volume(
        &self,
        request: Request<CreateVolumeRequest>,
    ) -> Result<Response<CreateVolumeResponse>, Status> {
        let req = request.into_inner();
        let call = Call {
            volume_id: req.name.clone(),
            secrets: to_btree(&req.secrets),
            create_request: Some(req.clone()),
            ..Call::new(Method::CreateVolume)
        };
        let guard = self.shared.record(call);
        let result = async {
            self.shared
                .play_script(Method::CreateVolume, &req.name)
                .await?;
            self.shared.sleep(self.shared.config.delay).await?;
            self.create(&req).map(Response::new)
        }
        .await;
        guard.finish(result)
    }

    async fn delete_volume(
        &self,
        request: Request<DeleteVolumeRequest>,
    ) -> Result<Response<DeleteVolumeResponse>, Status> {
        let req = request.into_inner();
        let call = Call {
            volume_id: req.volume_id.clone(),
            secrets: to_btree(&req.secrets),
            ..Call::new(Method::DeleteVolume)
        };
        let guard = self.shared.record(call);
        let result = async {
            self.shared
                .play_script(Method::DeleteVolume, &req.volume_id)
                .await?;
            self.shared.sleep(self.shared.config.delay).await?;
            self.delete(&req)
                .map(|()| Response::new(DeleteVolumeResponse {}))
        }
        .await;
        guard.finish(result)
    }
}
