//! Flags ([`Flags`], Go `flag` syntax through `sidecar::normalize_go_args`, kube-scheduler's
//! names) and what the scheduler runs with ([`Config`]; `Config::default()` is the in-process
//! one csi-cluster and the tests use: no HTTP server, no leader election).

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use sidecar::{LeaderElectionConfig, parse_go_bool, parse_go_duration};

use crate::{DEFAULT_SCHEDULER_NAME, Error};

/// Accepts any string, including the empty one Go manifests pass for "unset".
fn any_string(s: &str) -> Result<String, String> {
    Ok(s.to_owned())
}

/// csi-scheduler: binds pending pods to nodes where their volumes can be used (node affinity
/// and selector, taints, PV node affinity, WaitForFirstConsumer, CSINode attach limits).
#[derive(Parser, Debug, Clone)]
#[command(name = "csi-scheduler", version, about, long_about = None)]
pub struct Flags {
    /// Path to a kubeconfig file. Empty: in-cluster configuration, then $KUBECONFIG or
    /// ~/.kube/config.
    #[arg(long, value_name = "PATH", value_parser = any_string)]
    pub kubeconfig: Option<String>,

    /// The `spec.schedulerName` this scheduler serves (pods without one are served too when
    /// this is default-scheduler).
    #[arg(long, default_value = DEFAULT_SCHEDULER_NAME, value_name = "NAME")]
    pub scheduler_name: String,

    /// Queries per second to the API server (kube-scheduler's default 50; negative: unlimited).
    #[arg(
        long,
        default_value_t = 50.0,
        allow_negative_numbers = true,
        value_name = "QPS"
    )]
    pub kube_api_qps: f32,

    /// Burst of queries to the API server above --kube-api-qps.
    #[arg(long, default_value_t = 100, value_name = "N")]
    pub kube_api_burst: u32,

    /// Elect a leader on a Lease; only the leader schedules. kube-scheduler defaults to true;
    /// here false, since csi-cluster runs one scheduler in-process.
    #[arg(
        long,
        default_value_t = false,
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

    /// Name of the leader election Lease (kube-scheduler's).
    #[arg(long, default_value = "kube-scheduler", value_name = "NAME")]
    pub leader_elect_resource_name: String,

    /// First retry delay of an unschedulable pod (kube-scheduler's
    /// podInitialBackoffSeconds); it doubles up to --pod-max-backoff.
    #[arg(long, default_value = "1s", value_parser = parse_go_duration, value_name = "DURATION")]
    pub pod_initial_backoff: Duration,

    /// Longest retry delay of an unschedulable pod (podMaxBackoffSeconds).
    #[arg(long, default_value = "10s", value_parser = parse_go_duration, value_name = "DURATION")]
    pub pod_max_backoff: Duration,

    /// How long a pod waits for its WaitForFirstConsumer claims to be bound after its node
    /// was chosen (the VolumeBinding plugin's bindTimeoutSeconds).
    #[arg(long, default_value = "10m", value_parser = parse_go_duration, value_name = "DURATION")]
    pub bind_timeout: Duration,

    /// host:port (":10259": all interfaces) for /metrics, /healthz and /readyz. Empty: none.
    #[arg(long, value_name = "ADDRESS", value_parser = any_string)]
    pub http_endpoint: Option<String>,

    /// Path the Prometheus metrics are served at on --http-endpoint.
    #[arg(long, default_value = "/metrics", value_name = "PATH")]
    pub metrics_path: String,

    /// Log verbosity (klog levels): 0-3 info, 4 debug, 5 and above trace. RUST_LOG overrides.
    #[arg(short = 'v', long = "v", default_value_t = 0, value_name = "LEVEL")]
    pub v: u8,
}

/// Everything [`crate::run`] needs besides the client.
#[derive(Debug, Clone)]
pub struct Config {
    /// `spec.schedulerName` served (and the Events' reporting component).
    pub scheduler_name: String,
    /// `None`: no leader election.
    pub leader_election: Option<LeaderElectionConfig>,
    /// `None`: no HTTP server.
    pub http_endpoint: Option<String>,
    pub metrics_path: String,
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    pub bind_timeout: Duration,
    /// A pass runs at least this often even without a change (backoffs that expire).
    pub resync_period: Duration,
    /// How long the start waits for the watch caches' first lists.
    pub cache_sync_timeout: Duration,
    /// Watch caches shared with the other components of the process (`csi-cluster`);
    /// `None`: caches of its own.
    pub shared_caches: Option<volume_plugins::SharedCaches>,
}

impl Default for Config {
    /// In-process: kube-scheduler's backoffs (1 s .. 10 s) and bind timeout (10 min), no HTTP
    /// server, no leader election.
    fn default() -> Self {
        Self {
            scheduler_name: DEFAULT_SCHEDULER_NAME.into(),
            leader_election: None,
            http_endpoint: None,
            metrics_path: "/metrics".into(),
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(10),
            bind_timeout: Duration::from_secs(600),
            resync_period: Duration::from_secs(5),
            cache_sync_timeout: Duration::from_secs(120),
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

    /// The checked [`Config`].
    pub fn config(&self) -> Result<Config, Error> {
        if self.scheduler_name.is_empty() {
            return Err(Error::Config("--scheduler-name must not be empty".into()));
        }
        if self.pod_initial_backoff.is_zero() || self.pod_max_backoff < self.pod_initial_backoff {
            return Err(Error::Config(format!(
                "--pod-initial-backoff={:?} must be longer than 0 and at most --pod-max-backoff={:?}",
                self.pod_initial_backoff, self.pod_max_backoff
            )));
        }
        let leader_election = self.leader_elect.then(|| LeaderElectionConfig {
            lease_name: self.leader_elect_resource_name.clone(),
            namespace: self.leader_elect_resource_namespace.clone(),
            identity: sidecar::default_identity(),
            lease_duration: self.leader_elect_lease_duration,
            renew_deadline: self.leader_elect_renew_deadline,
            retry_period: self.leader_elect_retry_period,
        });
        Ok(Config {
            scheduler_name: self.scheduler_name.clone(),
            leader_election,
            http_endpoint: self.http_endpoint.clone().filter(|s| !s.is_empty()),
            metrics_path: self.metrics_path.clone(),
            initial_backoff: self.pod_initial_backoff,
            max_backoff: self.pod_max_backoff,
            bind_timeout: self.bind_timeout,
            ..Config::default()
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn parse(args: &[&str]) -> Flags {
        let argv = std::iter::once("csi-scheduler")
            .chain(args.iter().copied())
            .map(std::ffi::OsString::from);
        Flags::try_parse_from(sidecar::normalize_go_args(argv)).expect("parses")
    }

    #[test]
    fn defaults_and_go_flags() {
        let c = parse(&[]).config().unwrap();
        assert_eq!(c.scheduler_name, "default-scheduler");
        assert!(c.leader_election.is_none() && c.http_endpoint.is_none());
        assert_eq!(c.initial_backoff, Duration::from_secs(1));
        assert_eq!(c.max_backoff, Duration::from_secs(10));
        let c = parse(&[
            "-leader-elect",
            "-http-endpoint=:10259",
            "-scheduler-name=x",
        ])
        .config()
        .unwrap();
        let lease = c.leader_election.unwrap();
        assert_eq!(
            (lease.lease_name.as_str(), lease.namespace.as_str()),
            ("kube-scheduler", "kube-system")
        );
        assert_eq!(c.http_endpoint.as_deref(), Some(":10259"));
        assert_eq!(c.scheduler_name, "x");
        let e = parse(&["--pod-initial-backoff=20s"]).config().unwrap_err();
        assert!(e.to_string().contains("--pod-initial-backoff"), "{e}");
    }
}
