//! How the server runs: the options of `apiserver-lite` and of [`crate::ApiServer::start`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// How the server runs.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where to listen; port 0 picks a free one.
    pub listen: SocketAddr,
    /// Keep objects across restarts in this directory (snapshot + write log).
    pub data_dir: Option<PathBuf>,
    /// Also write the (admin's) kubeconfig here, mode 0600, once listening.
    pub kubeconfig_out: Option<PathBuf>,
    /// More bearer tokens, as kube-apiserver's `--token-auth-file`: lines
    /// `token,user,uid[,"group1,group2"]`.
    pub token_auth_file: Option<PathBuf>,
    /// Events kept for watch resume; a watch from an older resourceVersion gets 410 Gone.
    pub event_window: usize,
    /// Events buffered per watcher; a watcher that falls this far behind is closed.
    pub watcher_buffer: usize,
    /// How often watches that asked for bookmarks get one.
    pub bookmark_interval: Duration,
    /// Delete pods bound to a node gracefully (deletionTimestamp, then removal by a delete with
    /// grace period 0 from the kubelet's stand-in), as the real server does.
    pub graceful_pod_deletion: bool,
    /// Record every API request for [`RunningApiServer::audit`] (the last 1,000,000).
    pub audit: bool,
    /// The StorageObjectInUseProtection admission plugin (on in kube-apiserver by default):
    /// new claims and PVs get their protection finalizer, which only kcm's pvc-protection and
    /// pv-protection controllers (here: the pv-controller) remove. Off in `Default`, as a
    /// kube-apiserver started with `--disable-admission-plugins=StorageObjectInUseProtection`:
    /// tests that run one component against the server alone would see every claim and PV
    /// deletion hang. `csi-cluster` and the `apiserver` binary turn it on.
    pub storage_object_in_use_protection: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            data_dir: None,
            kubeconfig_out: None,
            token_auth_file: None,
            event_window: 10_000,
            watcher_buffer: 10_000,
            bookmark_interval: Duration::from_secs(30),
            graceful_pod_deletion: true,
            audit: true,
            storage_object_in_use_protection: false,
        }
    }
}
