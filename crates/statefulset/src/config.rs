//! Flags ([`Flags`], Go `flag` syntax, kube-controller-manager's names where they exist) and
//! what the controller runs with ([`Config`]; `Config::default()` is the in-process one).

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use sidecar::{LeaderElectionConfig, parse_go_bool, parse_go_duration};

use crate::Error;

fn any_string(s: &str) -> Result<String, String> {
    Ok(s.to_owned())
}

/// statefulset-controller: creates and deletes the pods and claims of apps/v1 StatefulSets.
#[derive(Parser, Debug, Clone)]
#[command(name = "statefulset-controller", version, about, long_about = None)]
pub struct Flags {
    /// Path to a kubeconfig file. Empty: in-cluster configuration, then $KUBECONFIG or
    /// ~/.kube/config.
    #[arg(long, value_name = "PATH", value_parser = any_string)]
    pub kubeconfig: Option<String>,

    /// Queries per second to the API server (negative: unlimited).
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

    /// Elect a leader on a Lease; only the leader works (default false: csi-cluster runs one).
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

    /// Namespace of the leader election Lease.
    #[arg(long, default_value = "kube-system", value_name = "NAMESPACE")]
    pub leader_elect_resource_namespace: String,

    /// Name of the leader election Lease.
    #[arg(long, default_value = "statefulset-controller", value_name = "NAME")]
    pub leader_elect_resource_name: String,

    /// How often every set is looked at again even without a change.
    #[arg(long, default_value = "10s", value_parser = parse_go_duration, value_name = "DURATION")]
    pub resync_period: Duration,

    /// host:port for /metrics, /healthz and /readyz. Empty: none.
    #[arg(long, value_name = "ADDRESS", value_parser = any_string)]
    pub http_endpoint: Option<String>,

    /// Log verbosity (klog levels). RUST_LOG overrides.
    #[arg(short = 'v', long = "v", default_value_t = 0, value_name = "LEVEL")]
    pub v: u8,
}

/// Everything [`crate::run`] needs besides the client.
#[derive(Debug, Clone)]
pub struct Config {
    pub leader_election: Option<LeaderElectionConfig>,
    pub http_endpoint: Option<String>,
    pub resync_period: Duration,
    /// How long the start waits for the watch caches' first lists.
    pub cache_sync_timeout: Duration,
    /// Watch caches shared with the other controllers of the process (`csi-cluster`, as
    /// kube-controller-manager's informer factory); `None`: caches of its own.
    pub shared_caches: Option<volume_plugins::SharedCaches>,
}

impl Default for Config {
    /// In-process: no leader election, no HTTP server.
    fn default() -> Self {
        Self {
            leader_election: None,
            http_endpoint: None,
            resync_period: Duration::from_secs(10),
            cache_sync_timeout: Duration::from_secs(120),
            shared_caches: None,
        }
    }
}

impl Flags {
    pub fn kubeconfig_path(&self) -> Option<PathBuf> {
        self.kubeconfig
            .clone()
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
    }

    pub fn config(&self) -> Result<Config, Error> {
        if self.resync_period.is_zero() {
            return Err(Error::Config(
                "--resync-period must be longer than 0".into(),
            ));
        }
        Ok(Config {
            leader_election: self.leader_elect.then(|| LeaderElectionConfig {
                lease_name: self.leader_elect_resource_name.clone(),
                namespace: self.leader_elect_resource_namespace.clone(),
                identity: sidecar::default_identity(),
                lease_duration: Duration::from_secs(15),
                renew_deadline: Duration::from_secs(10),
                retry_period: Duration::from_secs(2),
            }),
            http_endpoint: self.http_endpoint.clone().filter(|s| !s.is_empty()),
            resync_period: self.resync_period,
            ..Config::default()
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn go_flags_parse() {
        let argv = [
            "statefulset-controller",
            "-leader-elect",
            "-resync-period=1m",
        ]
        .into_iter()
        .map(std::ffi::OsString::from);
        let f = Flags::try_parse_from(sidecar::normalize_go_args(argv)).unwrap();
        let c = f.config().unwrap();
        assert_eq!(c.resync_period, Duration::from_secs(60));
        assert_eq!(
            c.leader_election.unwrap().lease_name,
            "statefulset-controller"
        );
        assert!(Config::default().leader_election.is_none());
    }
}
