//! The controller side's domain code: volumes, attachments and snapshots through the
//! [`ebs_cloud::Cloud`] trait. No gRPC types here except the CSI messages' plain data handed in
//! by `crate::controller_svc`; errors are [`crate::Error`]s, mapped to codes in one place.

pub(crate) mod modify;
pub(crate) mod params;
pub(crate) mod publish;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ebs_cloud::{Cloud, CloudError, Disk, Snapshot, SnapshotPage};

use publish::Attacher;
pub use publish::PublishConfig;

use crate::{Error, Result};
use params::{CreateParams, GIB};

/// Controller settings.
#[derive(Debug, Clone, Default)]
pub struct ControllerConfig {
    /// Zone for volumes whose request names none; `None` = the region's first zone.
    pub default_zone: Option<String>,
    /// Tags put on every volume (`--extra-tags`).
    pub extra_tags: BTreeMap<String, String>,
    /// `--k8s-tag-cluster-id`: volumes get `kubernetes.io/cluster/<id>: owned`,
    /// `KubernetesCluster: <id>` and `Name: <id>-dynamic-<volume name>`, as the in-tree plugin
    /// and the Go driver tag them.
    pub cluster_id: Option<String>,
    /// Bound on ControllerModifyVolume's wait for `optimizing` (the RPC deadline, when shorter,
    /// wins); `None` = 5 minutes.
    pub modify_timeout: Option<Duration>,
    /// `--warn-on-invalid-tag`: an invalid `tagSpecification_N` / `tagDeletion_N` is skipped
    /// with a warning instead of failing the call.
    pub warn_on_invalid_tag: bool,
    pub publish: PublishConfig,
}

/// What CreateVolume asks for, without gRPC types.
#[derive(Debug, Clone, Default)]
pub struct CreateVolume {
    pub name: String,
    pub required_bytes: i64,
    pub limit_bytes: i64,
    pub parameters: HashMap<String, String>,
    /// CSI `mutable_parameters` (a VolumeAttributesClass's): they take precedence over
    /// `parameters`.
    pub mutable_parameters: HashMap<String, String>,
    /// Zones in order of preference (preferred first, then the other requisite ones).
    pub zones: Vec<String>,
    /// Zones allowed at all (empty: any).
    pub allowed_zones: Vec<String>,
    pub snapshot_id: Option<String>,
}

/// A created volume.
#[derive(Debug, Clone)]
pub struct CreatedVolume {
    pub volume_id: String,
    pub capacity_bytes: i64,
    pub zone: String,
    pub fs_type: Option<String>,
    pub snapshot_id: Option<String>,
}

/// The controller domain service. Cheap to clone.
#[derive(Clone)]
pub struct ControllerService {
    cloud: Arc<dyn Cloud>,
    config: ControllerConfig,
    attacher: Attacher,
    /// CSI names with a CreateVolume / CreateSnapshot running (a repeat gets Aborted).
    creating: Arc<Mutex<HashSet<String>>>,
}

impl std::fmt::Debug for ControllerService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControllerService")
            .field("config", &self.config)
            .finish()
    }
}

/// Removes a name from the in-flight set when the call ends, also on error or cancellation.
struct NameGuard {
    set: Arc<Mutex<HashSet<String>>>,
    name: String,
}

impl Drop for NameGuard {
    fn drop(&mut self) {
        self.set
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.name);
    }
}

impl ControllerService {
    pub fn new(cloud: Arc<dyn Cloud>, config: ControllerConfig) -> Self {
        let attacher = Attacher::new(cloud.clone(), config.publish.clone());
        Self {
            cloud,
            config,
            attacher,
            creating: Arc::new(Mutex::new(HashSet::new())),
        }
    }

    pub fn cloud(&self) -> &Arc<dyn Cloud> {
        &self.cloud
    }

    fn claim(&self, key: String) -> Result<NameGuard> {
        let mut set = self.creating.lock().unwrap_or_else(|p| p.into_inner());
        if !set.insert(key.clone()) {
            return Err(Error::OperationInFlight(key));
        }
        Ok(NameGuard {
            set: self.creating.clone(),
            name: key,
        })
    }

    /// Probe: one cheap EC2 call.
    pub async fn probe(&self) -> Result<()> {
        self.cloud.availability_zones().await?;
        Ok(())
    }

    /// CreateVolume, idempotent by name; see `docs/ebs-driver.md` ("Idempotency").
    ///
    /// The live volume carrying the name tag is the name's volume: it must match the request
    /// (else AlreadyExists) and is returned once available. Without one, `create_disk` walks
    /// the name's client-token generations (`ebs-cloud-aws`, `cloud/create.rs`), so a name
    /// whose volume was deleted gets a new volume while a retry, a restarted driver or a
    /// second caller still lands on the one volume a token made. A second call for a name
    /// already in flight in this process is Aborted.
    pub async fn create_volume(&self, req: CreateVolume) -> Result<CreatedVolume> {
        let (parameters, mutable_parameters) = if self.config.warn_on_invalid_tag {
            (
                modify::drop_invalid_tags("parameters", &req.parameters),
                modify::drop_invalid_tags("mutable_parameters", &req.mutable_parameters),
            )
        } else {
            (req.parameters.clone(), req.mutable_parameters.clone())
        };
        let mut params = params::parse(&parameters)?;
        let mutable = modify::parse_mutable("mutable_parameters", &mutable_parameters)?;
        if !mutable.remove_tags.is_empty() {
            return Err(Error::invalid(
                "mutable_parameters",
                "tagDeletion_N has nothing to delete on a new volume",
            ));
        }
        if let Some(t) = mutable.change.volume_type {
            params.volume_type = t;
        }
        if let Some(i) = mutable.change.iops {
            params.iops = Some(i);
            params.iops_per_gb = None;
        }
        if let Some(t) = mutable.change.throughput {
            params.throughput = Some(t);
        }
        params.tags.extend(mutable.add_tags);
        let size_gib = params::size_gib(req.required_bytes, req.limit_bytes)?;
        let _guard = self.claim(format!("volume name {}", req.name))?;
        if let Some(snap) = &req.snapshot_id {
            match self.cloud.get_snapshot_by_id(snap).await {
                Ok(s) if !s.ready() => {
                    return Err(Error::FailedPrecondition(format!(
                        "snapshot {snap} is {}, not completed yet",
                        s.state
                    )));
                }
                Ok(_) => {}
                Err(CloudError::NotFound { .. }) => {
                    return Err(Error::NotFound {
                        kind: "snapshot",
                        id: snap.clone(),
                    });
                }
                Err(e) => return Err(e.into()),
            }
        }
        let existing = self.cloud.get_disk_by_name(&req.name).await?;
        let zone = match &existing {
            Some(d) => d.zone.clone(),
            None => self.pick_zone(&req).await?,
        };
        let options = params.disk_options(
            size_gib,
            zone,
            req.snapshot_id.clone(),
            &self.default_tags(&req.name),
        );
        if let Some(d) = &existing {
            check_same(&req, &params, &options, d)?;
            if d.state == "available" || d.state == "in-use" {
                return Ok(created(d, &params));
            }
        }
        let disk = self
            .cloud
            .create_disk(&req.name, &options)
            .await
            .map_err(|e| match e {
                CloudError::IdempotentParameterMismatch { .. } => Error::AlreadyExists {
                    what: "volume",
                    name: req.name.clone(),
                    reason: "a volume of this name appeared meanwhile with other parameters".into(),
                },
                CloudError::KmsKeyUnavailable { .. } => {
                    Error::invalid("parameters", format!("kmsKeyId: {e}"))
                }
                other => other.into(),
            })?;
        Ok(created(&disk, &params))
    }

    /// The tags every volume gets before the StorageClass's: the cluster's (when
    /// `--k8s-tag-cluster-id` is set), then `--extra-tags`.
    fn default_tags(&self, name: &str) -> BTreeMap<String, String> {
        let mut tags = BTreeMap::new();
        if let Some(id) = self.config.cluster_id.as_deref().filter(|i| !i.is_empty()) {
            tags.insert(format!("kubernetes.io/cluster/{id}"), "owned".to_string());
            tags.insert("KubernetesCluster".to_string(), id.to_string());
            tags.insert("Name".to_string(), format!("{id}-dynamic-{name}"));
        }
        tags.extend(self.config.extra_tags.clone());
        tags
    }

    async fn pick_zone(&self, req: &CreateVolume) -> Result<String> {
        if let Some(z) = req.zones.first() {
            return Ok(z.clone());
        }
        if let Some(z) = &self.config.default_zone {
            return Ok(z.clone());
        }
        self.cloud
            .availability_zones()
            .await?
            .into_iter()
            .next()
            .ok_or_else(|| Error::Internal("the region has no availability zones".into()))
    }

    /// DeleteVolume: absent is success; attached is FailedPrecondition.
    pub async fn delete_volume(&self, volume_id: &str) -> Result<()> {
        let _guard = self.claim(format!("volume {volume_id}"))?;
        match self.cloud.delete_disk(volume_id).await {
            Ok(true) => {
                tracing::info!(volume_id, "volume deleted");
                Ok(())
            }
            Ok(false) => {
                tracing::info!(volume_id, "volume already gone; nothing to delete");
                Ok(())
            }
            Err(CloudError::VolumeInUse { message, .. }) => Err(Error::FailedPrecondition(
                format!("volume {volume_id} is attached; unpublish it first ({message})"),
            )),
            Err(e) => Err(e.into()),
        }
    }

    /// The volume, or NotFound.
    pub async fn volume(&self, volume_id: &str) -> Result<Disk> {
        match self.cloud.get_disk_by_id(volume_id).await {
            Ok(d) => Ok(d),
            Err(CloudError::NotFound { .. }) => Err(Error::NotFound {
                kind: "volume",
                id: volume_id.to_string(),
            }),
            Err(e) => Err(e.into()),
        }
    }

    /// ControllerPublishVolume: the device name for the publish context.
    pub async fn publish(&self, volume_id: &str, node_id: &str) -> Result<String> {
        self.attacher.publish(volume_id, node_id).await
    }

    /// ControllerUnpublishVolume.
    pub async fn unpublish(&self, volume_id: &str, node_id: &str) -> Result<()> {
        self.attacher.unpublish(volume_id, node_id).await
    }

    /// ControllerExpandVolume: returns the new size in bytes.
    pub async fn expand(&self, volume_id: &str, required: i64, limit: i64) -> Result<i64> {
        let gib = params::size_gib(required, limit)?;
        self.volume(volume_id).await?;
        let _guard = self.claim(format!("volume {volume_id}"))?;
        let size = self.cloud.resize_disk(volume_id, gib).await?;
        Ok(size * GIB)
    }

    /// CreateSnapshot, idempotent by name.
    pub async fn create_snapshot(&self, name: &str, volume_id: &str) -> Result<Snapshot> {
        let _guard = self.claim(format!("snapshot name {name}"))?;
        self.volume(volume_id).await?;
        self.cloud
            .create_snapshot(name, volume_id, &[])
            .await
            .map_err(|e| match e {
                CloudError::IdempotentParameterMismatch { .. } => Error::AlreadyExists {
                    what: "snapshot",
                    name: name.to_string(),
                    reason: format!("it was taken of another volume, not {volume_id}"),
                },
                other => other.into(),
            })
    }

    /// DeleteSnapshot: absent is success.
    pub async fn delete_snapshot(&self, snapshot_id: &str) -> Result<()> {
        self.cloud.delete_snapshot(snapshot_id).await?;
        Ok(())
    }

    /// ListSnapshots by ID, by source volume, or all; an unknown ID gives an empty list.
    pub async fn list_snapshots(
        &self,
        snapshot_id: Option<&str>,
        source_volume_id: Option<&str>,
        max_entries: i32,
        starting_token: Option<&str>,
    ) -> Result<SnapshotPage> {
        if let Some(id) = snapshot_id {
            return match self.cloud.get_snapshot_by_id(id).await {
                Ok(s) if source_volume_id.is_none_or(|v| v == s.source_volume_id) => {
                    Ok(SnapshotPage {
                        snapshots: vec![s],
                        next_token: None,
                    })
                }
                Ok(_) | Err(CloudError::NotFound { .. }) => Ok(SnapshotPage::default()),
                Err(e) => Err(e.into()),
            };
        }
        let max = (max_entries > 0).then_some(max_entries);
        match self
            .cloud
            .list_snapshots(source_volume_id, max, starting_token)
            .await
        {
            Ok(p) => Ok(p),
            Err(CloudError::Other { code, .. } | CloudError::InvalidArgument { code, .. })
                if code == "InvalidPaginationToken" || code == "InvalidParameterValue" =>
            {
                Err(Error::BadToken(
                    starting_token.unwrap_or_default().to_string(),
                ))
            }
            Err(e) => Err(e.into()),
        }
    }
}

fn created(d: &Disk, params: &CreateParams) -> CreatedVolume {
    CreatedVolume {
        volume_id: d.volume_id.clone(),
        capacity_bytes: d.size_gib * GIB,
        zone: d.zone.clone(),
        fs_type: params.fs_type.clone(),
        snapshot_id: d.snapshot_id.clone(),
    }
}

/// The volume already made for this name must match the request, else AlreadyExists.
fn check_same(
    req: &CreateVolume,
    params: &CreateParams,
    want: &ebs_cloud::DiskOptions,
    have: &Disk,
) -> Result<()> {
    let mismatch = |reason: String| {
        Err(Error::AlreadyExists {
            what: "volume",
            name: req.name.clone(),
            reason,
        })
    };
    if have.size_gib < want.size_gib
        || (req.limit_bytes > 0 && have.size_gib * GIB > req.limit_bytes)
    {
        return mismatch(format!(
            "it has {} GiB, the request asks for {} GiB",
            have.size_gib, want.size_gib
        ));
    }
    if have.volume_type != params.volume_type {
        return mismatch(format!(
            "it is {}, the request asks for {}",
            have.volume_type, params.volume_type
        ));
    }
    if have.encrypted != params.encrypted {
        return mismatch(format!("encrypted is {}", have.encrypted));
    }
    if have.snapshot_id != req.snapshot_id {
        return mismatch(format!(
            "its source snapshot is {:?}, the request asks for {:?}",
            have.snapshot_id, req.snapshot_id
        ));
    }
    if !req.allowed_zones.is_empty() && !req.allowed_zones.contains(&have.zone) {
        return mismatch(format!(
            "it is in zone {}, which the accessibility requirements do not allow",
            have.zone
        ));
    }
    Ok(())
}
