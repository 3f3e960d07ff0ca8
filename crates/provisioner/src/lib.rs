//! csi-provisioner: the external provisioner (the migration design, docs/design/migration.md,
//! "Dynamically Provisioned Volumes").
//!
//! Watches PersistentVolumeClaims whose `volume.kubernetes.io/storage-provisioner` names our CSI
//! driver, calls `CreateVolume` and creates the bound PersistentVolume; watches Released PVs
//! with reclaim policy `Delete` that we provisioned, calls `DeleteVolume` and deletes them.
//! StorageClasses of an in-tree plugin our driver replaces (`kubernetes.io/aws-ebs` for
//! `ebs.csi.aws.com`) are provisioned for claims the PV controller annotated with our driver's
//! name (kube-controller-manager v1.26 does so for a migrated class, without
//! `pv.kubernetes.io/migrated-to`) or marked `migrated-to: <driver>`, and their PVs are stored
//! in the in-tree form.
//!
//! - [`run`] is the whole binary: connect to the driver, serve metrics, win the leader lease
//!   and run the [`Controller`] until shutdown; [`run_with_client`] does the same on a given
//!   `kube::Client` (csi-cluster runs it in-process).
//! - [`Controller`] is the controller alone, on a given client and [`Driver`].
//!
//! Domain code (no I/O) lives in [`claim`], [`create_request`], [`secrets`], [`topology`],
//! [`pv`], [`migration`], [`delete`]; `docs/provisioner.md` describes flags and behaviour.

pub mod claim;
pub mod config;
mod controller;
pub mod create_request;
mod csi;
pub mod delete;
pub mod events;
pub mod metrics;
pub mod migration;
pub mod pv;
pub mod quantity;
pub mod secrets;
mod startup;
pub mod topology;

pub use config::{Config, FeatureGates, Options};
pub use controller::{Controller, Informers};
pub use csi::{Capabilities, Driver};
pub use startup::{connect_driver, run, run_with_client, run_with_informers};

/// Annotation naming the provisioner that should provision a claim (set by the PV controller).
pub const STORAGE_PROVISIONER_ANNOTATION: &str = "volume.kubernetes.io/storage-provisioner";
/// The beta twin of [`STORAGE_PROVISIONER_ANNOTATION`], still set by the PV controller.
pub const BETA_STORAGE_PROVISIONER_ANNOTATION: &str =
    "volume.beta.kubernetes.io/storage-provisioner";
/// The node the scheduler picked for a `WaitForFirstConsumer` claim.
pub const SELECTED_NODE_ANNOTATION: &str = "volume.kubernetes.io/selected-node";
/// The CSI driver a migrated in-tree claim or PV is handled by.
pub const MIGRATED_TO_ANNOTATION: &str = "pv.kubernetes.io/migrated-to";
/// Who provisioned a PV.
pub const PROVISIONED_BY_ANNOTATION: &str = "pv.kubernetes.io/provisioned-by";
/// The provisioner secret DeleteVolume needs, remembered on the PV.
pub const DELETION_SECRET_NAME_ANNOTATION: &str =
    "volume.kubernetes.io/provisioner-deletion-secret-name";
/// Namespace of [`DELETION_SECRET_NAME_ANNOTATION`].
pub const DELETION_SECRET_NAMESPACE_ANNOTATION: &str =
    "volume.kubernetes.io/provisioner-deletion-secret-namespace";
/// Volume attribute naming the provisioner instance that created a volume
/// (`<start-up time in ms>-<random 0..9999>-<driver>`, as the Go sidecar writes it). It is
/// informational: neither Go nor we read it back on delete.
pub const PROVISIONER_IDENTITY_ATTRIBUTE: &str = "storage.kubernetes.io/csiProvisionerIdentity";
/// The finalizer on every PV we provision: it goes only after DeleteVolume succeeded.
pub const PV_FINALIZER: &str = "external-provisioner.volume.kubernetes.io/finalizer";

/// Everything that can go wrong. Per-claim errors become `ProvisioningFailed` Events (their
/// text is the Event's) and are retried with backoff; start-up errors end [`run`].
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The claim or its class asks for something we cannot build a request for (a bad
    /// quantity, an access mode without CSI equivalent, a secret template, a data source).
    #[error("{0}")]
    InvalidClaim(String),
    /// A secret template uses a placeholder that does not exist or is not allowed there.
    #[error("{0}")]
    Secret(String),
    /// Topology requirements could not be built (a node without the label of a key, ...).
    #[error("{0}")]
    Topology(String),
    /// The selected node or its CSINode does not exist: the scheduler must pick another node.
    #[error("{0}")]
    SelectedNodeNotFound(String),
    /// A CSI call failed. Written as Go's gRPC errors print, as the Go sidecar's Events do.
    #[error("rpc error: code = {} desc = {message}", csi_spec::go_code_name(*.code))]
    Csi {
        method: &'static str,
        code: tonic::Code,
        message: String,
    },
    /// The driver answered something the spec does not allow (no volume, empty ID).
    #[error("CSI {method}: {reason}")]
    CsiResponse {
        method: &'static str,
        reason: String,
    },
    /// In-tree ↔ CSI translation failed.
    #[error("translating {what}: {source}")]
    Translation {
        what: String,
        #[source]
        source: csi_translation::Error,
    },
    /// A Kubernetes API call failed.
    #[error("{action}: {source}")]
    Kube {
        action: String,
        #[source]
        source: kube::Error,
    },
    /// Start-up and plumbing errors of component-runtime.
    #[error(transparent)]
    Runtime(#[from] component_runtime::Error),
    /// The driver cannot provision (no CREATE_DELETE_VOLUME).
    #[error("CSI driver {driver}: {reason}")]
    Driver { driver: String, reason: String },
    /// A watch failed for good.
    #[error("{0}")]
    Watch(String),
    /// Invalid flags or configuration.
    #[error("invalid configuration: {0}")]
    Config(String),
}

impl Error {
    pub(crate) fn kube(action: impl Into<String>, source: kube::Error) -> Self {
        Error::Kube {
            action: action.into(),
            source,
        }
    }

    /// A write refused with 409 because the object changed since it was read: retried from
    /// the fresh copy, not reported as a failure.
    pub fn is_conflict(&self) -> bool {
        matches!(self, Error::Kube { source: kube::Error::Api(s), .. } if s.code == 409)
    }

    /// The gRPC code of a failed CSI call.
    pub fn grpc_code(&self) -> Option<tonic::Code> {
        match self {
            Error::Csi { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// A failure of a claim with a selected node after which the scheduler should pick another
    /// node (the Go sidecar's ProvisioningReschedule): the node or its CSINode is gone, or the
    /// driver answered RESOURCE_EXHAUSTED (no room in that node's topology).
    pub fn asks_for_reschedule(&self) -> bool {
        matches!(self, Error::SelectedNodeNotFound(_))
            || self.grpc_code() == Some(tonic::Code::ResourceExhausted)
    }

    /// A CSI failure after which the driver may still be working on the call (the Go
    /// sidecar's "final error" test, inverted): the same request must be repeated until it
    /// gives a final answer, or a volume may leak.
    pub fn maybe_in_progress(&self) -> bool {
        matches!(
            self.grpc_code(),
            Some(
                tonic::Code::Cancelled
                    | tonic::Code::DeadlineExceeded
                    | tonic::Code::Unavailable
                    | tonic::Code::ResourceExhausted
                    | tonic::Code::Aborted
            )
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csi_errors_read_as_go_grpc_errors_and_say_whether_final() {
        let e = Error::Csi {
            method: "CreateVolume",
            code: tonic::Code::InvalidArgument,
            message: "bad type".into(),
        };
        assert_eq!(
            e.to_string(),
            "rpc error: code = InvalidArgument desc = bad type"
        );
        assert!(!e.maybe_in_progress());
        let e = Error::Csi {
            method: "CreateVolume",
            code: tonic::Code::DeadlineExceeded,
            message: "slow".into(),
        };
        assert!(e.maybe_in_progress());
        assert!(!Error::Config("x".into()).maybe_in_progress());
    }
}
