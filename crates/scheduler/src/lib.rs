//! csi-scheduler: the part of kube-scheduler a storage stack needs, for clusters (csi-cluster)
//! that have no kube-scheduler. It binds pending pods to nodes through the `pods/binding`
//! subresource, as kube-scheduler does, after the filters that decide where a pod's volumes can
//! be used:
//!
//! - `filters::node`: the node is Ready and schedulable, its taints are tolerated, the pod's
//!   `nodeSelector` and required node affinity match (NodeUnschedulable, TaintToleration,
//!   NodeAffinity);
//! - `filters::volumes`: the pod's claims exist, immediate claims are bound, bound volumes'
//!   `nodeAffinity` admits the node, WaitForFirstConsumer claims can be provisioned there
//!   (`allowedTopologies`), ReadWriteOncePod claims are not in use (VolumeBinding,
//!   VolumeRestrictions);
//! - `filters::limits`: the node's CSINode `allocatable.count` per driver (NodeVolumeLimits).
//!
//! Failures become `FailedScheduling` Events worded as kube-scheduler words them
//! (`message`); the scheduling loop, scoring (fewest pods, then name) and the
//! WaitForFirstConsumer hand-off (`volume.kubernetes.io/selected-node`, then bind once the
//! claims are Bound) are in `scheduling`. docs/scheduler.md says what differs from
//! kube-scheduler.

pub mod config;
mod filters;
mod message;
pub mod metrics;
mod scheduling;
mod startup;

pub use config::{Config, Flags};
pub use startup::{run, user_agent};

/// The scheduler name pods ask for (`spec.schedulerName`) and the Events' component.
pub const DEFAULT_SCHEDULER_NAME: &str = "default-scheduler";

/// The PVC annotation that hands a WaitForFirstConsumer claim's node to the provisioner.
pub const ANN_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";

/// Errors of the scheduler. Messages name the object and field and say what was expected.
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
