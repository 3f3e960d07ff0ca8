//! ephemeral-volume: kube-controller-manager's `ephemeral-volume` controller
//! (`pkg/controller/volume/ephemeral`). A pod volume whose source is `ephemeral` (a generic
//! ephemeral volume) is the claim `<pod name>-<volume name>` in the pod's namespace; this
//! controller creates that claim from the volume's `volumeClaimTemplate` (its labels,
//! annotations and spec) with the pod as its controlling owner, so the scheduler, the PV
//! controller and the provisioner treat it as any other claim and the garbage collector
//! removes it with the pod.
//!
//! A claim of that name that the pod does not control is never adopted: the pod gets a
//! Warning `FailedBinding` Event, as from kcm, and is tried again with backoff (and at once
//! when the pod or the claim changes).
//!
//! kcm leaves the claims of deleted pods to the garbage collector. apiserver-lite (csi-cluster)
//! has none, so [`Options::delete_orphaned_claims`] (`--delete-orphaned-claims`) makes this
//! controller do that part for claims: a claim whose ownerReferences all name Pods that are
//! gone is deleted. docs/ephemeral-volume.md has the details.
//!
//! - `controller`: the pod and claim caches and the passes over them;
//! - `orphans`: the garbage collector's part;
//! - [`metrics`]: `ephemeral_volume_controller_create_total` and
//!   `ephemeral_volume_controller_create_failures_total`, kcm's names.

pub mod config;
mod context;
mod controller;
pub mod metrics;
mod orphans;
mod startup;

pub use config::{Config, Flags, Options};
pub use startup::{run, user_agent};

/// The component name on Events (kcm's ephemeral volume controller's).
pub const COMPONENT: &str = "ephemeral_volume";

/// The reason of the Warning Event on a pod whose claim could not be made or is not its own
/// (kcm's, from `pkg/controller/volume/events`).
pub const FAILED_BINDING: &str = "FailedBinding";

/// The name of the claim of a pod's generic ephemeral volume: `<pod>-<volume>`.
pub fn claim_name(pod: &str, volume: &str) -> String {
    format!("{pod}-{volume}")
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

    /// A claim of the name a pod's ephemeral volume needs exists and the pod does not
    /// control it.
    #[error("{0}")]
    NotOwner(String),

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
    fn claim_names_and_errors() {
        assert_eq!(claim_name("web-0", "scratch"), "web-0-scratch");
        let e = Error::CacheNotReady(component_runtime::CacheNotReady {
            kind: "Pod".into(),
            waited: std::time::Duration::from_secs(60),
        });
        assert!(e.to_string().contains("list and watch Pod"), "{e}");
    }
}
