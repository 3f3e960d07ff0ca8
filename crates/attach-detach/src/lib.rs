//! attach-detach-controller: Kubernetes' attach/detach controller (ADC), with skip attach
//! (the skip-attach design, docs/design/skip-attach.md; both modes,
//! [`volume_plugins::SkipAttachMode`]) and the in-tree/CSI migration decision (the migration
//! design, docs/design/migration.md; [`volume_plugins::decide`]).
//!
//! The layout follows kube-controller-manager's `pkg/controller/volume/attachdetach`, so a
//! Kubernetes engineer finds the same pieces:
//!
//! - [`cache`]: the desired state of the world (which volume should be attached to which node,
//!   for which pods) and the actual state of the world (what is attached, what the node reports
//!   in `status.volumesAttached`, what is mounted per `status.volumesInUse`);
//! - `populator`: the desired state, recomputed from the watch caches (pods, nodes, PVs, PVCs,
//!   CSINodes), and the actual state rebuilt after a restart from node status and
//!   VolumeAttachments;
//! - `volume_spec`: one pod volume → what to attach, by which plugin (CSI, the in-tree
//!   `kubernetes.io/aws-ebs` plugin, or CSI after migration);
//! - `reconciler`: detach first, then attach; operations per volume never overlap, failed ones
//!   back off exponentially. It reads the caches and the state in the `context` leaf and acts
//!   only through its `Effects` trait (start an operation, write node status, record an
//!   Event), as Kubernetes passes its reconciler an operation executor and a node status
//!   updater; its unit tests run whole passes against a fake that records and can refuse;
//! - `statusupdater`: `node.status.volumesAttached` on the status subresource;
//! - `events`, [`metrics`]: pod Events and Prometheus metrics with Kubernetes' names.
//!
//! [`run`] is the whole binary (clients, metrics server, leader election); [`Controller`] is the
//! controller alone on a given client, for tests and for embedding. README.md in the crate lists
//! what differs from kube-controller-manager's ADC.

pub mod cache;
pub mod config;
mod context;
mod controller;
mod events;
mod in_tree;
pub mod metrics;
mod operations;
mod pending_operations;
mod populator;
mod reconciler;
mod startup;
mod statusupdater;
mod volume_spec;

pub use config::{Config, Flags, Options};
pub use controller::Controller;
pub use startup::run;

/// The node annotation that hands a node's attach/detach to this controller.
pub const CONTROLLER_MANAGED_ANNOTATION: &str =
    "volumes.kubernetes.io/controller-managed-attach-detach";

/// The component name on Events and in the User-Agent.
pub const COMPONENT: &str = "attachdetach-controller";

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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_what_failed() {
        let e = Error::CacheNotReady(component_runtime::CacheNotReady {
            kind: "Node".into(),
            waited: std::time::Duration::from_secs(60),
        });
        assert!(e.to_string().contains("list and watch Node"), "{e}");
        let e = Error::Config("--cloud-provider=gce: want \"\" or \"aws\"".into());
        assert!(
            e.to_string()
                .starts_with("invalid configuration: --cloud-provider"),
            "{e}"
        );
    }
}
