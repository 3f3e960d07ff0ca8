//! statefulset-controller: the part of kube-controller-manager's StatefulSet controller that
//! storage workloads need, for clusters (csi-cluster) without kube-controller-manager.
//!
//! - `set_members`: a set's pods (`<set>-<ordinal>`, with the `statefulset.kubernetes.io/pod-name`
//!   and `apps.kubernetes.io/pod-index` labels and a controller ownerReference) and their
//!   claims from `volumeClaimTemplates` (`<template>-<set>-<ordinal>`);
//! - `plan`: what one pass does to one set (OrderedReady: one pod at a time, each after the
//!   previous is Running and Ready; scale down from the highest ordinal, one at a time;
//!   Parallel: all at once);
//! - `controller`: the watch caches, the passes, the writes, Events and `/status`.
//!
//! Scaling down keeps the claims (`persistentVolumeClaimRetentionPolicy` Retain, the default;
//! `whenScaled: Delete` and `whenDeleted: Delete` are honoured). Without a garbage collector
//! (apiserver-lite has none), pods and Delete-policy claims whose owning set is gone are
//! deleted here. docs/statefulset.md says what differs from Kubernetes.

pub mod config;
mod controller;
mod plan;
mod set_members;
mod startup;

pub use config::{Config, Flags};
pub use startup::{run, user_agent};

/// The Events' component (kube-controller-manager's controller name).
pub const COMPONENT: &str = "statefulset-controller";

/// Labels the controller puts on its pods.
pub mod labels {
    /// The pod's own name.
    pub const POD_NAME: &str = "statefulset.kubernetes.io/pod-name";
    /// The pod's ordinal.
    pub const POD_INDEX: &str = "apps.kubernetes.io/pod-index";
}

/// Errors of the controller.
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

    /// An object could not be built from the set (a template that is not a pod template).
    #[error("StatefulSet {set}: {reason}")]
    Invalid { set: String, reason: String },

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
