//! The EBS CSI driver's cloud layer, without any AWS SDK: the object-safe [`Cloud`] trait the
//! controller talks to, its domain types and errors, the per-instance device-name allocator
//! ([`devices`]) and the describe batcher ([`batcher`]). `ebs-cloud-aws` implements the trait
//! with `aws-sdk-ec2`; keeping the trait here lets the driver's domain code and its unit tests
//! compile without the SDK.

pub mod batcher;
pub mod devices;
pub mod metrics;
mod types;

use std::time::Duration;

pub use batcher::{BatchConfig, Batcher};
pub use devices::DeviceAllocator;
pub use metrics::CloudMetrics;
pub use types::{
    AttachmentState, BlockDevice, Disk, DiskModification, DiskOptions, Instance, Snapshot,
    SnapshotPage, VolumeAttachment, client_token, volume_client_token,
};

/// The tag that records which CSI volume name an EBS volume was created for.
pub const VOLUME_NAME_TAG: &str = "CSIVolumeName";
/// The tag that records which CSI snapshot name an EBS snapshot was created for.
pub const SNAPSHOT_NAME_TAG: &str = "CSIVolumeSnapshotName";

/// `--cloud-provider=aws` given to a binary built without EC2 (its `aws` feature off).
#[derive(Debug, thiserror::Error)]
#[error(
    "this {binary} was built without the `aws` feature (no EC2 client); rebuild it with default features, or leave CSIMigrationAWS on (the default) so the EBS CSI driver serves kubernetes.io/aws-ebs volumes and classes"
)]
pub struct NoEc2 {
    pub binary: String,
}

/// Where a binary built without EC2 would call `ebs_cloud_aws::in_tree_cloud` (the same
/// signature, so the binary picks one by its feature): no cloud unless one is `wanted`, which
/// is [`NoEc2`].
pub async fn in_tree_cloud_without_ec2(
    wanted: bool,
    binary: &str,
    _region: Option<&str>,
    _endpoint: Option<&str>,
) -> Result<Option<std::sync::Arc<dyn Cloud>>, NoEc2> {
    if wanted {
        return Err(NoEc2 {
            binary: binary.to_owned(),
        });
    }
    Ok(None)
}

/// What can go wrong talking to the cloud. The controller maps each variant to one CSI code;
/// `Clone` because the batcher hands one failed batch's error to every caller in it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CloudError {
    /// The volume, instance, snapshot or attachment does not exist.
    #[error("{kind} {id} not found")]
    NotFound { kind: &'static str, id: String },

    /// The name (its client token) was used before with other parameters.
    #[error(
        "{what} {name} was already created with other parameters (EC2 IdempotentParameterMismatch)"
    )]
    IdempotentParameterMismatch { what: &'static str, name: String },

    /// The volume is attached (delete) or otherwise busy.
    #[error("volume {volume_id} is in use: {message}")]
    VolumeInUse { volume_id: String, message: String },

    /// The instance has no free attachment slot (or no free device name).
    #[error("instance {instance_id} cannot take another volume: {message}")]
    AttachmentLimit {
        instance_id: String,
        message: String,
    },

    /// EC2 rejected a parameter (size, type, iops, zone...).
    #[error("EC2 {action} rejected the request ({code}): {message}")]
    InvalidArgument {
        action: &'static str,
        code: String,
        message: String,
    },

    /// EC2 throttled the call and the retries ran out.
    #[error("EC2 {action} is throttled (retries exhausted): {message}")]
    Throttled {
        action: &'static str,
        message: String,
    },

    /// The volume vanished while `creating`: what EC2 does with an encrypted volume whose KMS
    /// key does not exist or cannot be used. Nothing is left behind.
    #[error(
        "volume {volume_id} for {name} disappeared while being created: the KMS key {kms_key} does not exist or cannot be used"
    )]
    KmsKeyUnavailable {
        volume_id: String,
        name: String,
        kms_key: String,
    },

    /// A state did not arrive in time.
    #[error("timed out after {waited:?} waiting for {what}")]
    Timeout { what: String, waited: Duration },

    /// Anything else EC2 (or the connection to it) reported.
    #[error("EC2 {action} failed ({code}): {message}")]
    Other {
        action: &'static str,
        code: String,
        message: String,
    },
}

impl CloudError {
    pub fn not_found(kind: &'static str, id: impl Into<String>) -> Self {
        CloudError::NotFound {
            kind,
            id: id.into(),
        }
    }

    pub fn other(action: &'static str, code: impl Into<String>, msg: impl Into<String>) -> Self {
        CloudError::Other {
            action,
            code: code.into(),
            message: msg.into(),
        }
    }

    pub fn is_not_found(&self) -> bool {
        matches!(self, CloudError::NotFound { .. })
    }
}

pub type Result<T, E = CloudError> = std::result::Result<T, E>;

/// The cloud operations the controller needs. Every method is one step that can be repeated;
/// the idempotency rules of each are stated on the method.
#[async_trait::async_trait]
pub trait Cloud: Send + Sync + std::fmt::Debug {
    /// Creates a volume for the CSI name, or returns the live one already made for it (found by
    /// the [`VOLUME_NAME_TAG`] tag, or by the client token of the name's current generation,
    /// [`volume_client_token`]), and waits until it is `available`. A name whose earlier volume
    /// was deleted gets a new volume. A live volume of the name that is smaller than asked, or
    /// of another type, encryption, snapshot or zone is [`CloudError::IdempotentParameterMismatch`].
    /// The vanished-KMS case is [`CloudError::KmsKeyUnavailable`].
    async fn create_disk(&self, name: &str, options: &DiskOptions) -> Result<Disk>;

    /// Deletes a volume. `Ok(false)` when it did not exist.
    async fn delete_disk(&self, volume_id: &str) -> Result<bool>;

    /// Picks a free device name on the instance (from DescribeInstances every time) and calls
    /// AttachVolume. Returns the device name; the attachment is usually still `attaching`.
    async fn attach_disk(&self, volume_id: &str, instance_id: &str) -> Result<String>;

    /// Calls DetachVolume (never with Force). `Ok(false)` when it was not attached there.
    async fn detach_disk(&self, volume_id: &str, instance_id: &str) -> Result<bool>;

    /// Polls (through the batcher) until the volume's attachment to the instance is in
    /// `state` (`Detached` = no attachment), with backoff, up to `timeout`. Returns the
    /// attachment seen last (`None` when detached).
    async fn wait_for_attachment_state(
        &self,
        volume_id: &str,
        instance_id: &str,
        state: AttachmentState,
        timeout: Duration,
    ) -> Result<Option<VolumeAttachment>>;

    /// Marks a device name as failed (an attach that got stuck), so it is tried last.
    fn device_failed(&self, instance_id: &str, device: &str);

    /// The volume created for a CSI name (by tag), if any.
    async fn get_disk_by_name(&self, name: &str) -> Result<Option<Disk>>;

    /// A volume by ID (batched); [`CloudError::NotFound`] when absent.
    async fn get_disk_by_id(&self, volume_id: &str) -> Result<Disk>;

    /// An instance by ID (batched); [`CloudError::NotFound`] when absent.
    async fn get_instance(&self, instance_id: &str) -> Result<Instance>;

    /// ModifyVolume to at least `size_gib`; returns the size the volume will have. Waits until
    /// the modification is `optimizing` or `completed` (the size is usable then).
    async fn resize_disk(&self, volume_id: &str, size_gib: i64) -> Result<i64>;

    /// ModifyVolume of type, IOPS and/or throughput, idempotent: a modification to the same
    /// target that is already running is waited for instead of asked again, and a volume that
    /// already has what is asked for needs no call at all. Waits (polling
    /// DescribeVolumesModifications with backoff, at most `timeout`) until the modification is
    /// `optimizing` or `completed`, when the new type and performance are in effect. Returns
    /// whether a ModifyVolume was sent. [`CloudError::NotFound`] when the volume is absent.
    async fn modify_disk(
        &self,
        volume_id: &str,
        change: &DiskModification,
        timeout: Duration,
    ) -> Result<bool>;

    /// Adds (or overwrites) and removes tags of a volume: CreateTags and DeleteTags, both
    /// idempotent. [`CloudError::NotFound`] when the volume is absent.
    async fn tag_disk(
        &self,
        volume_id: &str,
        add: &std::collections::BTreeMap<String, String>,
        remove: &[String],
    ) -> Result<()>;

    /// Creates a snapshot for a CSI snapshot name, or returns the one already made for it.
    async fn create_snapshot(
        &self,
        name: &str,
        volume_id: &str,
        tags: &[(String, String)],
    ) -> Result<Snapshot>;

    /// Deletes a snapshot. `Ok(false)` when it did not exist.
    async fn delete_snapshot(&self, snapshot_id: &str) -> Result<bool>;

    /// The snapshot created for a CSI snapshot name (by tag), if any.
    async fn get_snapshot_by_name(&self, name: &str) -> Result<Option<Snapshot>>;

    /// A snapshot by ID; [`CloudError::NotFound`] when absent.
    async fn get_snapshot_by_id(&self, snapshot_id: &str) -> Result<Snapshot>;

    /// Snapshots owned by this account, optionally of one volume, a page at a time.
    async fn list_snapshots(
        &self,
        source_volume_id: Option<&str>,
        max_entries: Option<i32>,
        next_token: Option<&str>,
    ) -> Result<SnapshotPage>;

    /// The region's availability zones (Probe's cheap call, and CreateVolume's default zone).
    async fn availability_zones(&self) -> Result<Vec<String>>;
}
