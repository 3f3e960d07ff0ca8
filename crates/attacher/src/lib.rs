//! csi-attacher: the external attacher of the external-attacher design
//! (docs/design/external-attacher.md).
//!
//! Watches VolumeAttachments for one CSI driver and attaches/detaches their volumes with
//! `ControllerPublishVolume` / `ControllerUnpublishVolume`, guarding both the VolumeAttachment and
//! its PersistentVolume with the finalizer `external-attacher/<driver>`; removes that finalizer
//! from PVs once they are being deleted and no VolumeAttachment uses them.
//!
//! - [`run`] is the whole binary: connect to the driver, pick the handler from its capabilities,
//!   serve metrics, win the leader lease and run the [`Controller`] until shutdown.
//! - [`Controller`] is the controller alone, on a given `kube::Client` and [`Driver`]; tests
//!   build it in-process against the embedded API server and a CSI mock.
//!
//! `docs/attacher.md` describes flags, behaviour and metrics.

mod capability;
pub mod config;
mod context;
mod controller;
mod csi;
mod handler;
pub mod metrics;
mod migration;
pub mod names;
mod reconciler;
mod slim_objects;
mod startup;
mod tick;

pub use config::{Config, Options};
pub use context::Capabilities;
pub use controller::{Controller, Driver};
pub use startup::run;

/// Everything that can go wrong: per-object problems (recorded on the VolumeAttachment as
/// `attachError`/`detachError` and retried with backoff) and start-up failures.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The VolumeAttachment itself is malformed (sources).
    #[error("VolumeAttachment {name}: {reason}")]
    InvalidVolumeAttachment { name: String, reason: String },
    /// `spec.source.persistentVolumeName` names a PV that does not exist.
    #[error("PersistentVolume {name} not found")]
    PersistentVolumeNotFound { name: String },
    /// The PV is being deleted: it is never attached again (the external-attacher design,
    /// "Concurrency").
    #[error("PersistentVolume {name} is marked for deletion; refusing to attach it")]
    PersistentVolumeDeleting { name: String },
    /// The PV (or inline spec) cannot be attached by this driver.
    #[error("{what}: {reason}")]
    InvalidVolume { what: String, reason: String },
    /// The PV's access modes have no CSI equivalent.
    #[error("{what}: spec.accessModes {modes:?}: {reason}")]
    AccessModes {
        what: String,
        modes: Vec<String>,
        reason: String,
    },
    /// The node has no CSINode object.
    #[error(
        "CSINode {node} not found: the CSI node plugin of {driver} has not registered on node {node}"
    )]
    CsiNodeNotFound { node: String, driver: String },
    /// The node's CSINode does not list the driver.
    #[error("CSINode {node} has no entry for driver {driver} in spec.drivers")]
    DriverNotOnNode { node: String, driver: String },
    /// `controllerPublishSecretRef` is incomplete or the Secret cannot be read.
    #[error("Secret {namespace}/{name} (spec.csi.controllerPublishSecretRef): {reason}")]
    Secret {
        namespace: String,
        name: String,
        reason: String,
    },
    /// An in-tree volume could not be translated to CSI.
    #[error("translating in-tree {what} to CSI: {source}")]
    Translation {
        what: String,
        #[source]
        source: csi_translation::Error,
    },
    /// A CSI call failed. Written as Go's gRPC errors print (`rpc error: code = X desc = ...`),
    /// which is what the Go external-attacher puts into `status.attachError.message`, so the
    /// attach/detach controller's `FailedAttachVolume` Events read the same as with it.
    #[error("rpc error: code = {} desc = {message}", csi_spec::go_code_name(*.code))]
    Csi {
        method: &'static str,
        code: tonic::Code,
        message: String,
    },
    /// A Kubernetes API call failed.
    #[error("{action}: {source}")]
    Kube {
        action: String,
        #[source]
        source: kube::Error,
    },
    /// Optimistic-concurrency conflicts kept coming back.
    #[error("{action}: the object kept changing ({attempts} conflicts in a row); will retry")]
    Conflict { action: String, attempts: u32 },
    /// Start-up and plumbing errors of component-runtime.
    #[error(transparent)]
    Runtime(#[from] component_runtime::Error),
    /// A watch could not be kept up or the caches never filled.
    #[error("{0}")]
    Watch(String),
    /// Invalid flags or configuration.
    #[error("invalid configuration: {0}")]
    Config(String),
}

impl Error {
    /// The gRPC code of a failed CSI call (`status.attachError.errorCode`).
    /// A failure that ends when another object appears (the PV, the node's CSINode or its
    /// driver entry): the watch of that object retries the attach at once.
    pub(crate) fn waits_for_another_object(&self) -> bool {
        matches!(
            self,
            Error::PersistentVolumeNotFound { .. }
                | Error::CsiNodeNotFound { .. }
                | Error::DriverNotOnNode { .. }
        )
    }

    pub fn grpc_code(&self) -> Option<tonic::Code> {
        match self {
            Error::Csi { code, .. } => Some(*code),
            _ => None,
        }
    }

    pub(crate) fn kube(action: impl Into<String>, source: kube::Error) -> Self {
        Error::Kube {
            action: action.into(),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csi_errors_read_as_go_grpc_errors() {
        let e = Error::Csi {
            method: "ControllerPublishVolume",
            code: tonic::Code::DeadlineExceeded,
            message: "no answer within 15s".into(),
        };
        assert_eq!(
            e.to_string(),
            "rpc error: code = DeadlineExceeded desc = no answer within 15s"
        );
        assert_eq!(e.grpc_code(), Some(tonic::Code::DeadlineExceeded));
    }

    #[test]
    fn object_errors_name_the_object_and_field() {
        let e = Error::DriverNotOnNode {
            node: "node-1".into(),
            driver: "ebs.csi.aws.com".into(),
        };
        assert_eq!(
            e.to_string(),
            "CSINode node-1 has no entry for driver ebs.csi.aws.com in spec.drivers"
        );
        assert_eq!(e.grpc_code(), None);
        let e = Error::PersistentVolumeDeleting {
            name: "pv-1".into(),
        };
        assert!(e.to_string().contains("pv-1"), "{e}");
    }
}
