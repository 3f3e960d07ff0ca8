//! ebs-csi-driver: the AWS EBS CSI driver (the EBS driver design, docs/design/ebs-driver.md).
//!
//! - [`ControllerService`] (`controller/`): volumes, attachments and snapshots through the
//!   `ebs_cloud::Cloud` trait (implemented over aws-sdk-ec2 by `ebs-cloud-aws`); idempotent,
//!   attach/detach reconciled per (volume, node); [`CsiControllerSvc`] is its thin
//!   csi.v1.Controller adapter;
//! - [`NodeService`] (`node/`): finding and verifying the attached block device, blkid, mkfs
//!   only on blank devices, fsck, mount and bind mounts, stats, online resize; [`CsiNodeSvc`] is
//!   its csi.v1.Node adapter; [`CsiIdentitySvc`] answers csi.v1.Identity;
//! - [`run`] / [`serve`]: the services of a [`Mode`] (controller, node, all) on a unix socket,
//!   `--embedded-ec2` (only with the `embedded-ec2` feature, on by default; the images are
//!   built without it, so a shipped driver links no simulator), the metrics and health
//!   endpoint (`metrics`).
//!
//! `csictl`, a CSI client for any driver socket, is its own crate (`crates/csictl`).
//!
//! Adapters validate requests and map [`Error`] to a status in one place (`error.rs`). See
//! `docs/ebs-driver.md` and `docs/ebs-driver-node.md`.

use std::path::PathBuf;

mod capability;
pub mod controller;
mod controller_svc;
mod driver;
#[cfg(feature = "embedded-ec2")]
mod embedded;
mod error;
pub mod flags;
pub mod go_args;
pub mod identity;
pub mod metrics;
pub mod node;

pub use controller::{ControllerConfig, ControllerService, CreateVolume, PublishConfig};
pub use controller_svc::CsiControllerSvc;
pub use driver::{DriverConfig, DriverMetrics, Mode, run, serve};
pub use ebs_cloud::BatchConfig;
pub use ebs_cloud_aws::AwsConfig;
#[cfg(feature = "embedded-ec2")]
pub use ec2_sim::Timing as EmbeddedTiming;
#[cfg(feature = "embedded-ec2")]
pub use embedded::loop_devices_available;
pub use identity::{CsiIdentitySvc, IdentityConfig};
pub use mount_utils::{Usage, VolumeStats};
pub use node::requests::{
    AccessType, ExpandRequest, NodeConfig, PublishRequest, StageRequest, UnpublishRequest,
    UnstageRequest,
};
pub use node::service::NodeService;
pub use node::{CsiNodeSvc, NodeInfo};

/// Everything that can go wrong in the driver's domain code. The gRPC adapter maps each variant
/// to a CSI status code; the messages name the field or object and say what was expected.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request field is missing or malformed.
    #[error("invalid {field}: {reason}")]
    InvalidArgument { field: &'static str, reason: String },

    /// Another operation on the same volume is still running (the CO should retry later).
    #[error("an operation on volume {0} is already in flight; retry later")]
    OperationInFlight(String),

    /// No candidate path for the volume's device appeared within the wait.
    #[error(
        "no block device for volume {volume_id} appeared within {waited_ms} ms (looked at {})",
        candidates.join(", ")
    )]
    DeviceNotFound {
        volume_id: String,
        candidates: Vec<String>,
        waited_ms: u128,
    },

    /// A candidate path exists but its device belongs to another volume (a stale link).
    #[error(
        "device path {path} resolves to {device}, which belongs to volume {actual}, not {expected}; refusing to use it"
    )]
    WrongVolume {
        path: PathBuf,
        device: PathBuf,
        expected: String,
        actual: String,
    },

    /// A candidate path exists but is not a block device we can identify.
    #[error("{path} is not a usable block device for volume {volume_id}: {reason}")]
    BadDevice {
        path: PathBuf,
        volume_id: String,
        reason: String,
    },

    /// The staging path already holds another device's filesystem.
    #[error(
        "staging path {path} already has device {mounted} mounted, not {device} of volume {volume_id}"
    )]
    StagedWithOtherDevice {
        path: PathBuf,
        mounted: String,
        device: PathBuf,
        volume_id: String,
    },

    /// The target is already published, but differently from what this request asks.
    #[error("target path {path} is already published incompatibly: {reason}")]
    PublishedIncompatible { path: PathBuf, reason: String },

    /// Publish before stage (or the staging mount vanished).
    #[error("staging path {0} is not mounted; stage the volume first")]
    NotStaged(PathBuf),

    /// Nothing is mounted at a path where a published or staged volume was expected.
    #[error("no volume is mounted at {0}")]
    NotMounted(PathBuf),

    /// The device is still smaller than the size the expansion asks for.
    #[error(
        "device {device} has {actual} bytes, less than the {required} requested; the volume's resize has not reached this node yet"
    )]
    DeviceTooSmall {
        device: PathBuf,
        actual: u64,
        required: u64,
    },

    /// The path holds a volume, but not the one the request names (CSI: the volume does not
    /// exist on that path, NOT_FOUND).
    #[error("volume {volume_id} is not at {path}: the device there belongs to {actual}")]
    OtherVolumeAtPath {
        volume_id: String,
        path: PathBuf,
        actual: String,
    },

    /// A path the request names does not exist.
    #[error("{what} {path} does not exist")]
    PathNotFound { what: &'static str, path: PathBuf },

    /// The device holds a filesystem other than the one the request asks for.
    #[error("device {device} already contains a {found} filesystem, but {requested} was requested")]
    FsTypeMismatch {
        device: PathBuf,
        found: String,
        requested: String,
    },

    /// blkid, mkfs, fsck, mount, mountinfo, stats or resize failed, or found what it must not
    /// touch (see [`mount_utils::Error`]).
    #[error(transparent)]
    Mount(#[from] mount_utils::Error),

    /// The volume ID cannot name an EBS volume at all, so the volume does not exist (CSI:
    /// NOT_FOUND, like any other missing volume; the request itself is well-formed).
    #[error(
        "volume_id {0:?} is not an EBS volume ID (vol- and 8 or 17 hex digits): no such volume"
    )]
    NoSuchVolumeId(String),

    /// A filesystem operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The CSI endpoint could not be bound or served.
    #[error(transparent)]
    Endpoint(csi_spec::Error),

    /// The `--http-endpoint` (metrics and health) could not be bound.
    #[error(transparent)]
    Http(#[from] telemetry::Error),

    /// A CSI name is already used for a volume or snapshot with other parameters.
    #[error("{what} name {name} is already used with other parameters: {reason}")]
    AlreadyExists {
        what: &'static str,
        name: String,
        reason: String,
    },

    /// The volume, node or snapshot a request names does not exist.
    #[error("{kind} {id} does not exist")]
    NotFound { kind: &'static str, id: String },

    /// The volume is attached to another node and is not Multi-Attach.
    #[error(
        "volume {volume_id} is attached to node {other}; an EBS volume attaches to one node, so it cannot be published to {node_id} until it is unpublished there"
    )]
    AttachedElsewhere {
        volume_id: String,
        node_id: String,
        other: String,
    },

    /// The world is not in the state the call needs (attached volume on delete...).
    #[error("{0}")]
    FailedPrecondition(String),

    /// The node has no room for another volume.
    #[error("node {node_id} cannot take another volume: {reason}")]
    AttachLimit { node_id: String, reason: String },

    /// The capacity range cannot be satisfied in whole GiB.
    #[error("capacity_range: {0}")]
    OutOfRange(String),

    /// A later call for the same volume and node changed the goal of this one.
    #[error("{call} of volume {volume_id} on node {node_id} was superseded by a later {by}")]
    Superseded {
        call: &'static str,
        volume_id: String,
        node_id: String,
        by: &'static str,
    },

    /// An attachment stayed `attaching` too long; it was detached again (never forced) and its
    /// device name put aside.
    #[error(
        "volume {volume_id} stayed 'attaching' to {node_id} at {device} for {waited:?}; {} and the device name will be tried last; retry",
        if *undone { "it was detached again" } else { "a detach was requested" }
    )]
    StuckAttaching {
        volume_id: String,
        node_id: String,
        device: String,
        waited: std::time::Duration,
        undone: bool,
    },

    /// The work goes on, but not within this call's time.
    #[error("{0}")]
    DeadlineExceeded(String),

    /// ListSnapshots' starting_token is not one this driver handed out.
    #[error("starting_token {0:?} is not valid (it must come from an earlier ListSnapshots)")]
    BadToken(String),

    /// The cloud layer failed.
    #[error(transparent)]
    Cloud(#[from] ebs_cloud::CloudError),

    /// A bug or an unexpected runtime condition (a worker task panicked...).
    #[error("internal error: {0}")]
    Internal(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why `--embedded-ec2` (`DriverConfig::embedded_ec2`) fails in a build without the
/// `embedded-ec2` feature, such as the images' (scripts/images checks a shipped binary holds
/// this text, i.e. was built without the simulator).
pub const NO_EMBEDDED_EC2: &str =
    "this build has no embedded EC2 (built without the embedded-ec2 feature)";

impl Error {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            op,
            path: path.into(),
            source,
        }
    }

    pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        Self::InvalidArgument {
            field,
            reason: reason.into(),
        }
    }
}
