//! csi-node-agent: the kubelet's volume part for one node, as Kubernetes' kubelet does it, with
//! the skip-attach decision (docs/design/skip-attach.md) and the migration decision
//! (docs/design/migration.md) shared with the attach/detach controller through `volume-plugins`.
//!
//! The layout follows the kubelet's, so a Kubernetes engineer finds the same pieces:
//!
//! - `nodestatus`: the Node object (created or adopted, labels, the
//!   `controller-managed-attach-detach` annotation), its `Ready` condition, which stays False
//!   until the CSINode's `migrated-plugins` annotation matches this agent's feature gates, the
//!   Lease heartbeat in `kube-node-lease`, and `status.volumesInUse`;
//! - `pluginmanager` (the kubelet's `pluginmanager`): watches `<root-dir>/plugins_registry/`
//!   for registration sockets and registers drivers over `pluginregistration.v1`;
//! - `nodeinfomanager` (the kubelet's CSI `nodeinfomanager`): the CSINode object and the
//!   node's topology labels;
//! - [`drivers`]: the registered drivers the volume manager calls;
//! - `volumemanager` (the kubelet's `volumemanager`): desired state (pods bound to this node),
//!   actual state (what is staged and published), the populator, the reconciler that mounts
//!   and unmounts, and reconstruction from the mount table after a restart;
//! - `podstatus`: pods whose volumes are all published become Running/Ready (no containers
//!   run), pods being deleted are confirmed deleted once their volumes are gone;
//! - [`metrics`]: Prometheus metrics with the kubelet's names.
//!
//! [`run`] is the whole binary; docs/node-agent.md lists paths, annotations, conditions and
//! what differs from the kubelet.

pub mod config;
pub mod drivers;
pub mod metrics;
pub mod nodeinfomanager;
pub mod nodestatus;
pub mod pluginmanager;
mod podstatus;
mod startup;
pub mod volumemanager;

pub use config::{Config, Flags, Options};
pub use drivers::{DriverRegistry, RegisteredDriver};
pub use startup::run;

/// The component name on Events and in the User-Agent (the kubelet's).
pub const COMPONENT: &str = "kubelet";

/// Errors of the node agent. Messages name the object or path and say what was expected.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Invalid flags or configuration.
    #[error("invalid configuration: {0}")]
    Config(String),

    /// A Kubernetes API call failed.
    #[error("{action}: {source}")]
    Kube {
        action: String,
        #[source]
        source: kube::Error,
    },

    /// A driver cannot be registered on this node, or the Node/CSINode holds something the
    /// registration cannot work with (a clashing topology label, an unreadable annotation).
    #[error("{0}")]
    Registration(String),

    /// A watch cache never filled.
    #[error(transparent)]
    CacheNotReady(#[from] component_runtime::CacheNotReady),

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
