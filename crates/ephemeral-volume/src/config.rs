//! Flags ([`Flags`], Go `flag` syntax through `sidecar::normalize_go_args`) and what the
//! controller runs with ([`Config`], [`Options`]); tests and csi-cluster build those directly.
//!
//! Names follow pv-controller's: kube-controller-manager's for `--leader-elect*` and
//! `--kube-api-qps`/`--kube-api-burst` (defaults 20/30), the CSI sidecars' for
//! `--http-endpoint` and `-v`.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use sidecar::{LeaderElectionConfig, parse_go_bool, parse_go_duration};

/// Accepts any string, including the empty one Go manifests pass for "unset".
fn any_string(s: &str) -> Result<String, String> {
    Ok(s.to_owned())
}

/// csi-ephemeral-volume-controller: creates the PersistentVolumeClaim `<pod>-<volume>` of every
/// generic ephemeral volume (a pod volume with an `ephemeral.volumeClaimTemplate`), owned by
/// the pod (kube-controller-manager's ephemeral-volume controller).
#[derive(Parser, Debug, Clone)]
#[command(name = "csi-ephemeral-volume-controller", version, about, long_about = None)]
pub struct Flags {
    /// Path to a kubeconfig file. Empty: in-cluster configuration, then $KUBECONFIG or
    /// ~/.kube/config.
    #[arg(long, value_name = "PATH", value_parser = any_string)]
    pub kubeconfig: Option<String>,

    /// Also delete claims whose ownerReferences all name Pods that no longer exist (the
    /// garbage collector's part, for clusters without one, such as apiserver-lite). Leave it
    /// off next to a real kube-controller-manager: its garbage collector does this.
    #[arg(
        long,
        default_value_t = false,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        value_parser = parse_go_bool,
        value_name = "BOOL"
    )]
    pub delete_orphaned_claims: bool,

    /// Queries per second to the API server (a negative value means unlimited).
    #[arg(
        long,
        default_value_t = 20.0,
        allow_negative_numbers = true,
        value_name = "QPS"
    )]
    pub kube_api_qps: f32,

    /// Burst of queries to the API server above --kube-api-qps.
    #[arg(long, default_value_t = 30, value_name = "N")]
    pub kube_api_burst: u32,

    /// Elect a leader on a Lease (--leader-elect-resource-name in
    /// --leader-elect-resource-namespace); only the leader works.
    #[arg(
        long,
        default_value_t = true,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        value_parser = parse_go_bool,
        value_name = "BOOL"
    )]
    pub leader_elect: bool,

    /// How long non-leaders wait after the last renewal before they may take the lease.
    #[arg(long, default_value = "15s", value_parser = parse_go_duration, value_name = "DURATION")]
    pub leader_elect_lease_duration: Duration,

    /// How long the leader keeps trying to renew before it gives up leadership.
    #[arg(long, default_value = "10s", value_parser = parse_go_duration, value_name = "DURATION")]
    pub leader_elect_renew_deadline: Duration,

    /// How often the leader renews and candidates retry.
    #[arg(long, default_value = "2s", value_parser = parse_go_duration, value_name = "DURATION")]
    pub leader_elect_retry_period: Duration,

    /// Namespace of the leader election Lease.
    #[arg(long, default_value = "kube-system", value_name = "NAMESPACE")]
    pub leader_elect_resource_namespace: String,

    /// Name of the leader election Lease (not kube-controller-manager's own, so this
    /// controller can run next to a kcm that has its ephemeral-volume controller turned off).
    #[arg(
        long,
        default_value = "csi-ephemeral-volume-controller",
        value_name = "NAME"
    )]
    pub leader_elect_resource_name: String,

    /// host:port (":8080": all interfaces) for /metrics, /healthz and /readyz. Empty: none.
    #[arg(long, value_name = "ADDRESS", value_parser = any_string)]
    pub http_endpoint: Option<String>,

    /// Path the Prometheus metrics are served at on --http-endpoint.
    #[arg(long, default_value = "/metrics", value_name = "PATH")]
    pub metrics_path: String,

    /// Log verbosity (klog levels): 0-3 info, 4 debug, 5 and above trace. RUST_LOG overrides.
    #[arg(short = 'v', long = "v", default_value_t = 0, value_name = "LEVEL")]
    pub v: u8,
}

/// The controller's settings.
#[derive(Debug, Clone)]
pub struct Options {
    /// `--delete-orphaned-claims`: delete claims whose owner pods are all gone.
    pub delete_orphaned_claims: bool,
    /// First retry delay of a failed pod; it doubles up to `backoff_max` (a change of the pod
    /// or of one of its claims retries at once).
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// Longest wait between two passes when nothing changes.
    pub resync_period: Duration,
    /// How long the start waits for the watch caches' first lists.
    pub cache_sync_timeout: Duration,
}

impl Default for Options {
    /// kcm's workqueue backoff starts at 5 ms and ends at 1000 s; a pass-based controller
    /// starts at 100 ms so a failing pod does not run a pass per few milliseconds.
    fn default() -> Self {
        Self {
            delete_orphaned_claims: false,
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(1000),
            resync_period: Duration::from_secs(60),
            cache_sync_timeout: Duration::from_secs(120),
        }
    }
}

/// Everything [`crate::run`] needs besides the client.
#[derive(Debug, Clone)]
pub struct Config {
    /// `None`: no leader election.
    pub leader_election: Option<LeaderElectionConfig>,
    pub http_endpoint: Option<String>,
    pub metrics_path: String,
    pub options: Options,
    /// Watch caches shared with the other controllers of the process (`csi-cluster`, as
    /// kube-controller-manager's informer factory); `None`: caches of its own.
    pub shared_caches: Option<volume_plugins::SharedCaches>,
}

impl Config {
    /// A config for an in-process controller: no leader election, no HTTP server.
    pub fn new(options: Options) -> Self {
        Self {
            leader_election: None,
            http_endpoint: None,
            metrics_path: "/metrics".into(),
            options,
            shared_caches: None,
        }
    }
}

impl Flags {
    /// `--kubeconfig`, with an empty value as unset.
    pub fn kubeconfig_path(&self) -> Option<PathBuf> {
        self.kubeconfig
            .clone()
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
    }

    /// The [`Config`] the flags ask for.
    pub fn config(&self) -> Config {
        let leader_election = self.leader_elect.then(|| LeaderElectionConfig {
            lease_name: self.leader_elect_resource_name.clone(),
            namespace: self.leader_elect_resource_namespace.clone(),
            identity: sidecar::default_identity(),
            lease_duration: self.leader_elect_lease_duration,
            renew_deadline: self.leader_elect_renew_deadline,
            retry_period: self.leader_elect_retry_period,
        });
        Config {
            leader_election,
            http_endpoint: self.http_endpoint.clone().filter(|s| !s.is_empty()),
            metrics_path: self.metrics_path.clone(),
            options: Options {
                delete_orphaned_claims: self.delete_orphaned_claims,
                ..Options::default()
            },
            shared_caches: None,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn parse(args: &[&str]) -> Flags {
        let argv = std::iter::once("csi-ephemeral-volume-controller")
            .chain(args.iter().copied())
            .map(std::ffi::OsString::from);
        Flags::try_parse_from(sidecar::normalize_go_args(argv)).expect("parses")
    }

    #[test]
    fn defaults() {
        let f = parse(&[]);
        let c = f.config();
        assert!(!c.options.delete_orphaned_claims);
        assert_eq!((f.kube_api_qps, f.kube_api_burst), (20.0, 30));
        let lease = c.leader_election.expect("a leader is elected by default");
        assert_eq!(lease.lease_name, "csi-ephemeral-volume-controller");
        assert_eq!(lease.namespace, "kube-system");
        assert!(c.http_endpoint.is_none());
        assert!(f.kubeconfig_path().is_none());
    }

    #[test]
    fn go_style_flags_parse() {
        let f = parse(&[
            "-kubeconfig=/etc/kubeconfig",
            "-leader-elect=false",
            "-http-endpoint=:8080",
            "--delete-orphaned-claims",
            "-v=4",
        ]);
        assert_eq!(f.kubeconfig_path(), Some(PathBuf::from("/etc/kubeconfig")));
        let c = f.config();
        assert!(c.leader_election.is_none());
        assert!(c.options.delete_orphaned_claims);
        assert_eq!(c.http_endpoint.as_deref(), Some(":8080"));
        assert_eq!(f.v, 4);
        assert!(parse(&["--kubeconfig="]).kubeconfig_path().is_none());
    }
}
