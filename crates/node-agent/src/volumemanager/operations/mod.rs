//! The operations the reconciler starts (the kubelet's operation executor): mount (wait for
//! attach, stage, publish) and unmount (unpublish, unstage), for CSI volumes and for the
//! in-tree aws-ebs plugin. Each runs as its own task and hands a result back to the reconciler,
//! the only writer of the actual state of the world.

mod aws_ebs;
mod csi;
pub mod sa_tokens;
pub mod vol_data;

pub use csi::not_registered as csi_not_registered;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use component_runtime::ObjectCache;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::storage::v1::CSIDriver;
use kube::{Api, Client};
use volume_plugins::CsiPlugin;

use super::cache::{MountedVolume, StagedVolume};
use super::paths::Paths;
use super::volume_spec::{MountKind, SecretRef, VolumeToMount};
use crate::drivers::DriverRegistry;

/// What every operation needs.
#[derive(Clone)]
pub struct OpContext {
    pub client: Client,
    pub node_name: String,
    pub paths: Paths,
    pub csi: CsiPlugin,
    pub csidrivers: ObjectCache<CSIDriver>,
    pub drivers: DriverRegistry,
    /// One CSI node call's deadline.
    pub csi_timeout: Duration,
    /// How long a mount waits for its VolumeAttachment or its device.
    pub attach_timeout: Duration,
    /// Where the in-tree aws-ebs plugin looks for devices (`/dev`).
    pub dev_root: PathBuf,
    /// Operations that may run at once; the others wait their turn. A burst of 200 pods
    /// otherwise runs 200 stages and publishes side by side, which buys no speed on a few
    /// cores but costs memory for all of them at once.
    pub running: Arc<tokio::sync::Semaphore>,
    /// The pods' service account tokens handed to drivers with `tokenRequests`.
    pub tokens: sa_tokens::TokenCache,
}

/// How many operations run at once by default.
pub const DEFAULT_MAX_CONCURRENT_OPERATIONS: usize = 16;

/// The pod a volume is mounted for (what NodePublish's pod info and Events need).
#[derive(Debug, Clone)]
pub struct PodInfo {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub service_account: String,
}

/// Which step failed, in the kubelet's words (`MountVolume.MountDevice failed for volume
/// "pv-1" : ...`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    WaitForAttach,
    MountDevice,
    SetUp,
    TearDown,
    UnmountDevice,
}

impl Step {
    pub fn as_str(self) -> &'static str {
        match self {
            Step::WaitForAttach => "MountVolume.WaitForAttach",
            Step::MountDevice => "MountVolume.MountDevice",
            Step::SetUp => "MountVolume.SetUp",
            Step::TearDown => "UnmountVolume.TearDown",
            Step::UnmountDevice => "UnmountDevice",
        }
    }
}

/// A failed operation: the step and the cause, as the Event shows them.
#[derive(Debug, Clone)]
pub struct OpError {
    pub step: Step,
    pub message: String,
}

impl OpError {
    pub fn new(step: Step, message: impl Into<String>) -> Self {
        Self {
            step,
            message: message.into(),
        }
    }
}

/// What a mount needs besides the volume.
#[derive(Debug, Clone)]
pub struct MountRequest {
    pub pod: PodInfo,
    pub volume: VolumeToMount,
    /// Staged by an earlier operation (skip NodeStage).
    pub already_staged: Option<StagedVolume>,
    /// In-tree aws-ebs: `devicePath` from `node.status.volumesAttached`.
    pub device_path: Option<String>,
    /// Whether the attach/detach controller manages the volume (it is in volumesInUse).
    pub reported_in_use: bool,
}

/// A finished mount: the staged volume (new or as it was) and the published one.
#[derive(Debug, Clone)]
pub struct Mounted {
    pub staged: StagedVolume,
    pub mounted: MountedVolume,
}

/// A failed mount and what it left on the node, for the actual state (the kubelet's
/// `markDeviceErrorState` / `markVolumeErrorState`): a stage that succeeded before a later
/// step failed, or a stage or publish that failed with a code that does not say nothing
/// happened ([`is_final`]), recorded as uncertain. The reconciler keeps them: the volume stays
/// in `volumesInUse` (the attach/detach controller must not detach it) and is unpublished and
/// unstaged once no pod wants it, instead of staying mounted for good.
#[derive(Debug, Clone)]
pub struct MountFailure {
    pub error: OpError,
    pub staged: Option<StagedVolume>,
    pub published: Option<MountedVolume>,
}

/// What a mount has done so far; the failure carries it.
#[derive(Debug, Default)]
struct Progress {
    staged: Option<StagedVolume>,
    published: Option<MountedVolume>,
}

impl Progress {
    /// Runs a mount's steps; a failure carries what they did before it.
    async fn track<F>(steps: F) -> Result<Mounted, MountFailure>
    where
        F: AsyncFnOnce(&mut Progress) -> Result<Mounted, OpError>,
    {
        let mut progress = Progress::default();
        match steps(&mut progress).await {
            Ok(m) => Ok(m),
            Err(error) => Err(MountFailure {
                error,
                staged: progress.staged,
                published: progress.published,
            }),
        }
    }
}

/// Whether a CSI error says the call did nothing. Canceled, DeadlineExceeded, Unavailable,
/// ResourceExhausted and Aborted do not (the driver may still be staging or publishing, or
/// did it and the answer was lost), so the volume is then uncertain, not absent (the
/// kubelet's `isFinalError`).
pub(crate) fn is_final(status: &tonic::Status) -> bool {
    use tonic::Code;
    !matches!(
        status.code(),
        Code::Cancelled
            | Code::DeadlineExceeded
            | Code::Unavailable
            | Code::ResourceExhausted
            | Code::Aborted
    )
}

pub async fn mount(ctx: Arc<OpContext>, req: MountRequest) -> Result<Mounted, MountFailure> {
    let _turn = ctx.running.clone().acquire_owned().await;
    match &req.volume.kind {
        MountKind::Csi(_) => csi::mount(&ctx, &req).await,
        MountKind::AwsEbs { .. } => aws_ebs::mount(&ctx, &req).await,
    }
}

pub async fn unpublish(ctx: Arc<OpContext>, volume: MountedVolume) -> Result<(), OpError> {
    let _turn = ctx.running.clone().acquire_owned().await;
    match &volume.handle {
        super::cache::VolumeHandle::Csi { .. } => csi::unpublish(&ctx, &volume).await,
        super::cache::VolumeHandle::AwsEbs { .. } => aws_ebs::unpublish(&volume).await,
    }
}

pub async fn unstage(ctx: Arc<OpContext>, volume: StagedVolume) -> Result<(), OpError> {
    let _turn = ctx.running.clone().acquire_owned().await;
    match &volume.handle {
        super::cache::VolumeHandle::Csi { .. } => csi::unstage(&ctx, &volume).await,
        super::cache::VolumeHandle::AwsEbs { .. } => aws_ebs::unstage(&ctx, &volume).await,
    }
}

/// A secret's data as CSI wants it (string values).
async fn read_secret(
    client: &Client,
    r: &SecretRef,
    step: Step,
) -> Result<std::collections::HashMap<String, String>, OpError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), &r.namespace);
    let secret = api.get(&r.name).await.map_err(|e| {
        OpError::new(
            step,
            format!("fetching secret {}/{}: {e}", r.namespace, r.name),
        )
    })?;
    let mut out = std::collections::HashMap::new();
    for (k, v) in secret.data.unwrap_or_default() {
        out.insert(k, String::from_utf8_lossy(&v.0).into_owned());
    }
    for (k, v) in secret.string_data.unwrap_or_default() {
        out.insert(k, v);
    }
    Ok(out)
}

/// Creates `dir` and its parents.
async fn make_dir(dir: &std::path::Path, step: Step) -> Result<(), OpError> {
    tokio::fs::create_dir_all(dir)
        .await
        .map_err(|e| OpError::new(step, format!("creating {}: {e}", dir.display())))
}

/// Removes an empty directory and its empty parents up to (not including) `stop`.
async fn remove_empty_dirs(dir: PathBuf, stop: &std::path::Path) {
    let mut current = Some(dir);
    while let Some(d) = current {
        if d == stop || !d.starts_with(stop) {
            break;
        }
        if tokio::fs::remove_dir(&d).await.is_err() {
            break;
        }
        current = d.parent().map(std::path::Path::to_path_buf);
    }
}
