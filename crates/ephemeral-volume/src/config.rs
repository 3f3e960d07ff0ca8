//! Flags ([`Flags`], Go `flag` syntax through `component_runtime::normalize_go_args`) and what the
//! controller runs with ([`Config`], [`Options`]); tests and csi-cluster build those directly.
//!
//! Names follow pv-controller's: kube-controller-manager's for `--leader-elect*` and
//! `--kube-api-qps`/`--kube-api-burst` (defaults 20/30), the CSI sidecars' for
//! `--http-endpoint` and `-v`.

use std::time::Duration;

use clap::Parser;
use component_runtime::parse_go_bool;

/// csi-ephemeral-volume-controller: creates the PersistentVolumeClaim `<pod>-<volume>` of every
/// generic ephemeral volume (a pod volume with an `ephemeral.volumeClaimTemplate`), owned by
/// the pod (kube-controller-manager's ephemeral-volume controller).
#[derive(Parser, Debug, Clone)]
#[command(name = "csi-ephemeral-volume-controller", version, about, long_about = None)]
#[command(mut_args = component_runtime::go_bools)]
#[command(mut_arg("leader_elect_resource_name", |a| a.default_value("csi-ephemeral-volume-controller")))]
pub struct Flags {
    /// Also delete claims whose ownerReferences all name Pods that no longer exist (the
    /// garbage collector's part, for clusters without one, such as apiserver-lite). Leave it
    /// off next to a real kube-controller-manager: its garbage collector does this.
    #[arg(long, default_value_t = false, value_parser = parse_go_bool, value_name = "BOOL")]
    pub delete_orphaned_claims: bool,

    /// `--kubeconfig`, `--kube-api-*`, `--leader-elect*`, `--http-endpoint`, `-v`.
    #[command(flatten)]
    pub controller: component_runtime::ControllerFlags,
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
    /// The metrics and health endpoint, and the Lease to work under.
    pub serving: component_runtime::Serving,
    pub options: Options,
    /// Watch caches shared with the other controllers of the process (`csi-cluster`, as
    /// kube-controller-manager's informer factory); `None`: caches of its own.
    pub shared_caches: Option<component_runtime::SharedCaches>,
}

impl Config {
    /// A config for an in-process controller: no leader election, no HTTP server.
    pub fn new(options: Options) -> Self {
        Self {
            serving: component_runtime::Serving::default(),
            options,
            shared_caches: None,
        }
    }
}

impl Flags {
    /// The [`Config`] the flags ask for.
    pub fn config(&self) -> Config {
        Config {
            serving: self.controller.serving(),
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
        Flags::try_parse_from(component_runtime::normalize_go_args(argv)).expect("parses")
    }

    #[test]
    fn defaults() {
        let f = parse(&[]);
        let c = f.config();
        assert!(!c.options.delete_orphaned_claims);
        assert_eq!(
            (
                f.controller.client.kube_api_qps,
                f.controller.client.kube_api_burst
            ),
            (20.0, 30)
        );
        let lease = c
            .serving
            .leader_election
            .expect("a leader is elected by default");
        assert_eq!(lease.lease_name, "csi-ephemeral-volume-controller");
        assert_eq!(lease.namespace, "kube-system");
        assert!(c.serving.http_endpoint.is_none());
        assert!(f.controller.client.kubeconfig_path().is_none());
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
        assert_eq!(
            f.controller.client.kubeconfig_path(),
            Some(std::path::PathBuf::from("/etc/kubeconfig"))
        );
        let c = f.config();
        assert!(c.serving.leader_election.is_none());
        assert!(c.options.delete_orphaned_claims);
        assert_eq!(c.serving.http_endpoint.as_deref(), Some(":8080"));
        assert_eq!(f.controller.telemetry.v, 4);
        assert!(
            parse(&["--kubeconfig="])
                .controller
                .client
                .kubeconfig_path()
                .is_none()
        );
    }
}
