//! pv-controller: kube-controller-manager's persistentvolume controller (the "binder"), its
//! pvc-protection and pv-protection controllers, and the in-tree `kubernetes.io/aws-ebs`
//! provisioner and deleter it runs while that plugin is not migrated to CSI (the migration design,
//! docs/design/migration.md).
//!
//! The layout follows `pkg/controller/volume/persistentvolume` and `pkg/controller/volume/
//! {pvcprotection,pvprotection}`, so a Kubernetes engineer finds the same pieces:
//!
//! - `controller`: the watch caches and the sync loop; `controller::sync_claim` and
//!   `controller::sync_volume` (syncClaim / syncVolume), `controller::index` (the
//!   volume index and `find_best_match_for_claim`), `controller::bind` (the writes of a bind,
//!   in kcm's order), `controller::provision` (storage-provisioner annotations, in-tree
//!   provisioning), `controller::reclaim` (Released volumes: Retain, Delete, Recycle);
//! - [`migration`]: which provisioner serves a class, and the `pv.kubernetes.io/migrated-to`
//!   annotation on claims and volumes;
//! - `protection`: the `kubernetes.io/pvc-protection` and `kubernetes.io/pv-protection`
//!   finalizers;
//! - `events`, [`metrics`]: Events with kcm's reasons, Prometheus metrics with kcm's names.
//!
//! [`run`] is the whole controller process on a given client (metrics server, leader election
//! included); docs/pv-controller.md says what it writes and where it differs from kcm.

pub mod config;
mod controller;
mod events;
pub mod metrics;
pub mod migration;
mod protection;
mod startup;

pub use config::{Config, Flags, Options};
pub use startup::{run, user_agent};

/// The component name on Events (kcm's persistentvolume controller's).
pub const COMPONENT: &str = "persistentvolume-controller";

/// Annotations and finalizers the controller reads and writes (Kubernetes' names).
pub mod names {
    /// PVC: the controller finished binding it (`"yes"`).
    pub const ANN_BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";
    /// PV and PVC: the controller (not a user) set `claimRef` / `volumeName`.
    pub const ANN_BOUND_BY_CONTROLLER: &str = "pv.kubernetes.io/bound-by-controller";
    /// PVC: who is to provision it.
    pub const ANN_STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
    /// PVC: the deprecated twin of [`ANN_STORAGE_PROVISIONER`], still written by kcm.
    pub const ANN_BETA_STORAGE_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";
    /// PVC: the node the scheduler picked (WaitForFirstConsumer).
    pub const ANN_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
    /// PVC: the deprecated class annotation, which wins over `spec.storageClassName`.
    pub const ANN_BETA_STORAGE_CLASS: &str = "volume.beta.kubernetes.io/storage-class";
    /// PV: who provisioned it.
    pub const ANN_PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
    /// PV and PVC: the CSI driver an in-tree plugin's volume is migrated to.
    pub const ANN_MIGRATED_TO: &str = "pv.kubernetes.io/migrated-to";
    /// StorageClass: the default class.
    pub const ANN_DEFAULT_CLASS: &str = "storageclass.kubernetes.io/is-default-class";
    /// The pvc-protection finalizer.
    pub const PVC_PROTECTION_FINALIZER: &str = "kubernetes.io/pvc-protection";
    /// The pv-protection finalizer.
    pub const PV_PROTECTION_FINALIZER: &str = "kubernetes.io/pv-protection";
}

/// Errors of the controller. Messages name the object and field and say what was expected.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Invalid flags or configuration.
    #[error("invalid configuration: {0}")]
    Config(String),

    /// A watch cache never filled.
    #[error(transparent)]
    CacheNotReady(#[from] component_runtime::CacheNotReady),

    /// A Kubernetes API call failed.
    #[error("{action}: {source}")]
    Kube {
        action: String,
        #[source]
        source: kube::Error,
    },

    /// The in-tree aws-ebs plugin failed (parameters, EC2).
    #[error(transparent)]
    Plugin(#[from] volume_plugins::Error),

    /// An object the controller cannot work with (it gets an Event saying so).
    #[error("{0}")]
    Invalid(String),

    /// Start-up and plumbing errors of component-runtime.
    #[error(transparent)]
    Runtime(#[from] component_runtime::Error),
}

impl Error {
    pub(crate) fn kube(action: impl Into<String>, source: kube::Error) -> Self {
        Error::Kube {
            action: action.into(),
            source,
        }
    }

    /// A 409 Conflict: someone else wrote the object first; the next pass looks again.
    pub(crate) fn is_conflict(&self) -> bool {
        matches!(self, Error::Kube { source: kube::Error::Api(s), .. } if s.code == 409)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_what_failed() {
        let e = Error::CacheNotReady(component_runtime::CacheNotReady {
            kind: "PersistentVolume".into(),
            waited: std::time::Duration::from_secs(60),
        });
        assert!(
            e.to_string().contains("list and watch PersistentVolume"),
            "{e}"
        );
        let e = Error::Config("--cloud-provider=gce: want \"\" or \"aws\"".into());
        assert!(
            e.to_string()
                .starts_with("invalid configuration: --cloud-provider"),
            "{e}"
        );
    }
}
