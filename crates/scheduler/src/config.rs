//! Flags ([`Flags`], Go `flag` syntax through `component_runtime::normalize_go_args`, kube-scheduler's
//! names) and what the scheduler runs with ([`Config`]; `Config::default()` is the in-process
//! one csi-cluster and the tests use: no HTTP server, no leader election).

use std::time::Duration;

use clap::Parser;
use component_runtime::parse_go_duration;

use crate::{DEFAULT_SCHEDULER_NAME, Error};

/// csi-scheduler: binds pending pods to nodes where their volumes can be used (node affinity
/// and selector, taints, PV node affinity, WaitForFirstConsumer, CSINode attach limits).
#[derive(Parser, Debug, Clone)]
#[command(name = "csi-scheduler", version, about, long_about = None)]
#[command(mut_arg("leader_elect_resource_name", |a| a.default_value("kube-scheduler")))]
#[command(mut_arg("leader_elect", |a| a.default_value("false")))]
#[command(mut_arg("kube_api_qps", |a| a.default_value("50")))]
#[command(mut_arg("kube_api_burst", |a| a.default_value("100")))]
pub struct Flags {
    /// The `spec.schedulerName` this scheduler serves (pods without one are served too when
    /// this is default-scheduler).
    #[arg(long, default_value = DEFAULT_SCHEDULER_NAME, value_name = "NAME")]
    pub scheduler_name: String,

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

    /// `--kubeconfig`, `--kube-api-*`, `--leader-elect*`, `--http-endpoint`, `-v`.
    #[command(flatten)]
    pub controller: component_runtime::ControllerFlags,
}

/// Everything [`crate::run`] needs besides the client.
#[derive(Debug, Clone)]
pub struct Config {
    /// `spec.schedulerName` served (and the Events' reporting component).
    pub scheduler_name: String,
    /// The metrics and health endpoint, and the Lease to work under.
    pub serving: component_runtime::Serving,
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    pub bind_timeout: Duration,
    /// A pass runs at least this often even without a change (backoffs that expire).
    pub resync_period: Duration,
    /// How long the start waits for the watch caches' first lists.
    pub cache_sync_timeout: Duration,
    /// Watch caches shared with the other components of the process (`csi-cluster`);
    /// `None`: caches of its own.
    pub shared_caches: Option<component_runtime::SharedCaches>,
}

impl Default for Config {
    /// In-process: kube-scheduler's backoffs (1 s .. 10 s) and bind timeout (10 min), no HTTP
    /// server, no leader election.
    fn default() -> Self {
        Self {
            scheduler_name: DEFAULT_SCHEDULER_NAME.into(),
            serving: component_runtime::Serving::default(),
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
        Ok(Config {
            scheduler_name: self.scheduler_name.clone(),
            serving: self.controller.serving(),
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
        Flags::try_parse_from(component_runtime::normalize_go_args(argv)).expect("parses")
    }

    #[test]
    fn defaults_and_go_flags() {
        let c = parse(&[]).config().unwrap();
        assert_eq!(c.scheduler_name, "default-scheduler");
        assert!(c.serving.leader_election.is_none() && c.serving.http_endpoint.is_none());
        assert_eq!(c.initial_backoff, Duration::from_secs(1));
        assert_eq!(c.max_backoff, Duration::from_secs(10));
        let c = parse(&[
            "-leader-elect",
            "-http-endpoint=:10259",
            "-scheduler-name=x",
        ])
        .config()
        .unwrap();
        let lease = c.serving.leader_election.unwrap();
        assert_eq!(
            (lease.lease_name.as_str(), lease.namespace.as_str()),
            ("kube-scheduler", "kube-system")
        );
        assert_eq!(c.serving.http_endpoint.as_deref(), Some(":10259"));
        assert_eq!(c.scheduler_name, "x");
        let e = parse(&["--pod-initial-backoff=20s"]).config().unwrap_err();
        assert!(e.to_string().contains("--pod-initial-backoff"), "{e}");
    }
}
