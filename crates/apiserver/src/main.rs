//! `apiserver-lite`: the embedded Kubernetes API server as a process.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

/// A small Kubernetes API server on loopback HTTPS (its own CA; bearer tokens required) for tests and local runs: core/v1 namespaces,
/// nodes, pods, PVs, PVCs, secrets, events, serviceaccounts, configmaps; apps/v1 deployments,
/// daemonsets, statefulsets; rbac.authorization.k8s.io/v1 roles, rolebindings, clusterroles,
/// clusterrolebindings; storage.k8s.io/v1 volumeattachments, csidrivers, csinodes,
/// storageclasses; coordination.k8s.io/v1 leases; events.k8s.io/v1 events.
#[derive(Debug, Parser)]
#[command(name = "apiserver-lite", version)]
struct Args {
    /// Address to listen on (port 0 picks a free port; see --kubeconfig-out for the result).
    #[arg(long, default_value = "127.0.0.1:6443", env = "APISERVER_LISTEN")]
    listen: SocketAddr,
    /// Write the admin's kubeconfig (CA and token inline, mode 0600) to FILE once listening.
    #[arg(long, value_name = "FILE")]
    kubeconfig_out: Option<PathBuf>,
    /// Also accept the bearer tokens in FILE (lines `token,user,uid[,"group1,group2"]`).
    #[arg(long, value_name = "FILE")]
    token_auth_file: Option<PathBuf>,
    /// Keep objects (and the CA, serving certificate and minted tokens) across restarts in DIR (snapshot plus write log). In memory when absent.
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Events kept for watch resume; watches from older resourceVersions get 410 Gone.
    #[arg(long, default_value_t = 10_000)]
    event_window: usize,
    /// Events buffered per watcher before a slow watcher is closed.
    #[arg(long, default_value_t = 10_000)]
    watcher_buffer: usize,
    /// Seconds between watch bookmarks (for watches that allow them).
    #[arg(long, default_value_t = 30)]
    bookmark_seconds: u64,
    /// Delete pods bound to a node at once instead of gracefully (no kubelet to confirm).
    #[arg(long)]
    no_graceful_pod_deletion: bool,
    /// Admission plugins to turn off, as kube-apiserver's flag; the one this server can turn
    /// off is StorageObjectInUseProtection (without kcm's protection controllers, claims and
    /// PVs would keep their finalizer forever).
    #[arg(long, value_name = "PLUGIN,...", value_delimiter = ',')]
    disable_admission_plugins: Vec<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(other) = args
        .disable_admission_plugins
        .iter()
        .find(|p| p.as_str() != "StorageObjectInUseProtection")
    {
        anyhow::bail!(
            "--disable-admission-plugins: {other:?} cannot be turned off here (only StorageObjectInUseProtection)"
        );
    }
    // Info unless RUST_LOG says otherwise; on stderr.
    telemetry::init_logging(0);
    let config = apiserver::Config {
        listen: args.listen,
        data_dir: args.data_dir,
        kubeconfig_out: args.kubeconfig_out,
        token_auth_file: args.token_auth_file,
        event_window: args.event_window,
        watcher_buffer: args.watcher_buffer,
        bookmark_interval: Duration::from_secs(args.bookmark_seconds.max(1)),
        graceful_pod_deletion: !args.no_graceful_pod_deletion,
        // The audit trail is read in-process (RunningApiServer::audit); a standalone server
        // has no reader, so it does not keep one.
        audit: false,
        // Checked above: the only plugin the list can name.
        storage_object_in_use_protection: args.disable_admission_plugins.is_empty(),
    };
    // SIGTERM or SIGINT (Ctrl-C).
    let shutdown = telemetry::shutdown_on_signals();
    apiserver::run(config, shutdown.cancelled_owned()).await?;
    Ok(())
}
