//! Flags ([`Flags`], Go `flag` syntax, kube-controller-manager's names where they exist) and
//! what the controller runs with ([`Config`]; `Config::default()` is the in-process one).

use std::time::Duration;

use clap::Parser;
use component_runtime::parse_go_duration;

use crate::Error;

/// statefulset-controller: creates and deletes the pods and claims of apps/v1 StatefulSets.
#[derive(Parser, Debug, Clone)]
#[command(name = "statefulset-controller", version, about, long_about = None)]
#[command(mut_arg("leader_elect_resource_name", |a| a.default_value("statefulset-controller")))]
#[command(mut_arg("leader_elect", |a| a.default_value("false")))]
pub struct Flags {
    /// How often every set is looked at again even without a change.
    #[arg(long, default_value = "10s", value_parser = parse_go_duration, value_name = "DURATION")]
    pub resync_period: Duration,

    /// `--kubeconfig`, `--kube-api-*`, `--leader-elect*`, `--http-endpoint`, `-v`.
    #[command(flatten)]
    pub controller: component_runtime::ControllerFlags,
}

/// Everything [`crate::run`] needs besides the client.
#[derive(Debug, Clone)]
pub struct Config {
    /// The metrics and health endpoint, and the Lease to work under.
    pub serving: component_runtime::Serving,
    pub resync_period: Duration,
    /// How long the start waits for the watch caches' first lists.
    pub cache_sync_timeout: Duration,
    /// Watch caches shared with the other controllers of the process (`csi-cluster`, as
    /// kube-controller-manager's informer factory); `None`: caches of its own.
    pub shared_caches: Option<component_runtime::SharedCaches>,
}

impl Default for Config {
    /// In-process: no leader election, no HTTP server.
    fn default() -> Self {
        Self {
            serving: component_runtime::Serving::default(),
            resync_period: Duration::from_secs(10),
            cache_sync_timeout: Duration::from_secs(120),
            shared_caches: None,
        }
    }
}

impl Flags {
    pub fn config(&self) -> Result<Config, Error> {
        if self.resync_period.is_zero() {
            return Err(Error::Config(
                "--resync-period must be longer than 0".into(),
            ));
        }
        Ok(Config {
            serving: self.controller.serving(),
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
        let f = Flags::try_parse_from(component_runtime::normalize_go_args(argv)).unwrap();
        let c = f.config().unwrap();
        assert_eq!(c.resync_period, Duration::from_secs(60));
        assert_eq!(
            c.serving.leader_election.unwrap().lease_name,
            "statefulset-controller"
        );
        assert!(Config::default().serving.leader_election.is_none());
    }
}
