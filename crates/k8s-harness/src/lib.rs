//! Real Kubernetes for tests, envtest-style: etcd, kube-apiserver, optionally
//! kube-controller-manager (a chosen `--controllers` list), kube-scheduler, and containerd +
//! a kubelet, all on 127.0.0.1 and ephemeral ports under one temp dir, with a PKI made per
//! run and `--authorization-mode=Node,RBAC`, so RBAC is checked for real.
//!
//! The Kubernetes binaries come from the directory `CSI_RS_K8S_ASSETS` names (the `bin/` of
//! a `kubernetes-server-linux-amd64` v1.26+ release plus `csi-sanity`; `scripts/setup` finds
//! or fetches one), the pause image from `CSI_RS_PAUSE_IMAGE` (default
//! `$CSI_RS_K8S_ASSETS/../images/pause-3.9.tar`), etcd, containerd, runc and the CNI plugins
//! from the host (Debian packages). A missing one is [`Error::Missing`];
//! [`Cluster::start_or_skip`] turns that into `test_support::skip_or_fail`.
//!
//! ```no_run
//! # async fn t() {
//! use k8s_harness::{Cluster, ClusterOptions};
//! let Some(cluster) = Cluster::start_or_skip(ClusterOptions::control_plane()).await else { return };
//! let admin = cluster.admin_client().await.unwrap();
//! let sa = cluster.service_account_kubeconfig("kube-system", "csi-attacher").await.unwrap();
//! let as_attacher = cluster.client(&sa).await.unwrap();
//! # let _ = (admin, as_attacher);
//! # }
//! ```
//!
//! Every process runs in its own process group with `PR_SET_PDEATHSIG(SIGKILL)`; dropping the
//! [`Cluster`] (also while a test panics) stops them (SIGTERM, then SIGKILL), removes the
//! node's containers, unmounts everything under the temp dir, deletes the kubelet's pod logs
//! in /var/log/pods and removes the temp dir. nextest runs each test in its own process, so
//! each test starts its own cluster: ~10 s for the control plane, ~25–40 s with a node, on 2
//! cores (the start prints its steps' times).
//!
//! [`support`] has what those tests need around the cluster: our own binaries as host
//! processes killed on drop, waiting with their logs' ends in the failure.
//!
//! Why a crate of its own and not a module of `test-support`: `test-support` is a dev-
//! dependency of nearly every crate and stays light (no kube, no TLS); this one pulls kube,
//! k8s-openapi and rustls, which only the real-Kubernetes tests need.

mod assets;
mod cluster;
mod components;
mod kubeconfig;
mod pki;
mod process;
pub mod support;
mod teardown;

pub use assets::{ASSETS_ENV, Assets, CNI_BIN_DIR, PAUSE_IMAGE_ENV};
pub use cluster::{Cluster, ClusterOptions, LOGS_ENV};
pub use components::{PAUSE_IMAGE, SERVICE_ACCOUNT_ISSUER, SERVICE_CLUSTER_IP_RANGE};
pub use pki::CertFiles;

/// What can go wrong starting or using a cluster.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A binary, image or tool is not installed: the test cannot run here.
    #[error("missing: {0}")]
    Missing(String),
    /// A component did not come up; the message carries the end of its log.
    #[error("{0}")]
    Start(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("{command} failed ({status}): {stderr}")]
    Command {
        command: String,
        status: String,
        stderr: String,
    },
    #[error("{what}: {source}")]
    Kube { what: String, source: kube::Error },
    #[error("{0}")]
    Invalid(String),
}

impl Error {
    pub(crate) fn io(what: String, source: std::io::Error) -> Error {
        Error::Io { what, source }
    }

    pub(crate) fn kube(what: String, source: kube::Error) -> Error {
        Error::Kube { what, source }
    }
}
