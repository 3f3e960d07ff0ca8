//! What Kubernetes' attach/detach controller and the kubelet's volume manager share about
//! volumes: whether a CSI volume is attached at all (the skip-attach design,
//! docs/design/skip-attach.md), which backend serves an in-tree volume on a node (the decision of
//! the migration design, docs/design/migration.md), the feature gates that say which plugins a
//! component has migrated, and the names Kubernetes gives volumes and VolumeAttachments.
//! `attach-detach` and `node-agent` both decide through this crate, so the two can never disagree.
//!
//! The plugins themselves: [`csi_plugin`] (VolumeAttachments for an external attacher) and
//! [`aws_ebs`] (the in-tree `kubernetes.io/aws-ebs` plugin, straight to EC2 through the
//! `ebs-cloud` trait, so this crate never compiles an AWS SDK). Both read the cluster through
//! `component_runtime::ObjectCache`, the watch-fed cache, instead of asking the API server per call.

use std::time::Duration;

pub mod aws_ebs;
pub mod claims;
pub mod csi_plugin;
pub mod feature_gates;
pub mod migration;
pub mod names;
pub mod skip_attach;

pub use aws_ebs::AwsEbsPlugin;
pub use csi_plugin::{AttachSource, Attached, CsiPlugin, CsiVolume};
pub use feature_gates::{MigratedPlugins, feature_gate_warnings};
pub use migration::{Backend, NodeMigrationInfo, decide};
pub use skip_attach::{AttachPath, DriverAttach, SkipAttachMode, attach_path};

/// Errors of this crate. Messages name the object and say what was expected: they end up in
/// pod Events (`FailedAttachVolume`, `FailedMount`).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A `--feature-gates` value that Kubernetes would refuse too.
    #[error("--feature-gates: {0}")]
    FeatureGates(String),

    /// The attacher recorded `status.attachError` on the VolumeAttachment. Shown as the
    /// attacher wrote it, as Kubernetes' CSI plugin does: `FailedAttachVolume` Events then
    /// read `... : rpc error: code = ... desc = ...` exactly as with kube-controller-manager.
    #[error("{message}")]
    AttachFailed {
        volume_attachment: String,
        message: String,
    },

    /// The attacher recorded `status.detachError` on the VolumeAttachment (shown as written).
    #[error("{message}")]
    DetachFailed {
        volume_attachment: String,
        message: String,
    },

    /// An attach found the VolumeAttachment being deleted (a detach is still running).
    #[error(
        "VolumeAttachment {volume_attachment} is being deleted (a detach is in progress); the attach is retried after it is gone"
    )]
    BeingDeleted { volume_attachment: String },

    /// A wait ran out.
    #[error("timed out after {waited:?} waiting for {what}")]
    Timeout { what: String, waited: Duration },

    /// The API server refused or could not be reached.
    #[error("{action}: {source}")]
    Api {
        action: String,
        #[source]
        source: kube::Error,
    },

    /// An in-tree aws-ebs operation with no cloud configured.
    #[error(
        "the in-tree kubernetes.io/aws-ebs plugin has no cloud configured (start with --cloud-provider=aws, or turn on CSIMigrationAWS so the EBS CSI driver serves the volume): cannot {operation} volume {volume_id}"
    )]
    NoCloud {
        operation: &'static str,
        volume_id: String,
    },

    /// EC2 refused or failed (in-tree aws-ebs plugin).
    #[error("{operation} of volume {volume_id}: {source}")]
    Cloud {
        operation: &'static str,
        volume_id: String,
        #[source]
        source: ebs_cloud::CloudError,
    },

    /// The node side of the in-tree aws-ebs plugin (find, format, check, mount).
    #[error(transparent)]
    Mount(#[from] mount_utils::Error),

    /// The in-tree aws-ebs plugin will not mount a device at its staging path: something else
    /// is mounted there, the device holds another filesystem than the spec asks for, a blank
    /// device is to be mounted read-only (never formatted then), the path is no block device.
    #[error("cannot mount {} at {}: {reason}", device.display(), staging_dir.display())]
    MountDevice {
        device: std::path::PathBuf,
        staging_dir: std::path::PathBuf,
        reason: String,
    },

    /// A volume spec this plugin cannot serve (no volume ID, a node without an instance).
    #[error("{0}")]
    InvalidSpec(String),
}

/// This crate's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
