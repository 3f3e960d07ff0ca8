//! Go `flag` syntax on top of clap, and the flags every CSI sidecar shares.
//!
//! Existing manifests start the Go sidecars with `-csi-address=/csi/csi.sock`, `--v=5`,
//! `-leader-election`, `--timeout 15s`. Go's `flag` package accepts one or two dashes for any
//! flag, `=value` or a separate value, and durations such as `1m30s`; clap only knows
//! `--long`. [`normalize_go_args`] rewrites the arguments before clap sees them, and the value
//! parsers here read Go's duration and boolean syntax.

use std::time::Duration;

pub use telemetry::{normalize_go_args, parse_go_bool, parse_go_duration};

use crate::leader::{LeaderElectionConfig, default_identity, default_namespace};

/// Gives every flag whose value is named `BOOL` Go's boolean syntax: `--flag` alone means true,
/// a value must be attached (`--flag=false`; `--flag false` would leave `false` as an
/// argument, as Go's `flag` package does), and the values are `strconv.ParseBool`'s. A struct
/// that declares such flags, each `#[arg(long, default_value_t = .., value_parser =
/// parse_go_bool, value_name = "BOOL")]`, applies it with `#[command(mut_args = go_bools)]`.
pub fn go_bools(arg: clap::Arg) -> clap::Arg {
    let is_bool = arg
        .get_value_names()
        .is_some_and(|names| names.len() == 1 && names[0] == "BOOL");
    if !is_bool {
        return arg;
    }
    arg.num_args(0..=1)
        .require_equals(true)
        .default_missing_value("true")
}

/// Accepts any string, including the empty one Go manifests pass for "unset".
fn any_string(s: &str) -> Result<String, String> {
    Ok(s.to_owned())
}

/// The flags every Go CSI sidecar takes, with the same names and defaults.
///
/// Embed with `#[command(flatten)]` and parse `normalize_go_args(std::env::args_os())`.
/// Empty values (`--kubeconfig=""`, `--http-endpoint=""`) mean "unset", as in Go: use the
/// accessor methods, which fold them into `None`.
#[derive(clap::Args, Debug, Clone)]
#[command(mut_arg("kube_api_qps", |a| a.default_value("5")))]
#[command(mut_arg("kube_api_burst", |a| a.default_value("10")))]
pub struct CommonFlags {
    /// Address of the CSI driver socket: a plain path or a unix:// URL.
    #[arg(long, default_value = "/run/csi/socket", value_name = "ADDRESS")]
    pub csi_address: String,

    /// `--kubeconfig`, and the Go sidecars' client limits: `--kube-api-qps` 5,
    /// `--kube-api-burst` 10.
    #[command(flatten)]
    pub client: crate::KubeClientFlags,

    /// The `--leader-election*` flags.
    #[command(flatten)]
    pub election: LeaderElectionFlags,

    /// host:port (":8080" listens on all interfaces) for metrics and health checks. Empty:
    /// no HTTP server.
    #[arg(long, value_name = "ADDRESS", value_parser = any_string)]
    pub http_endpoint: Option<String>,

    /// Path the Prometheus metrics are served at on --http-endpoint.
    #[arg(long, default_value = "/metrics", value_name = "PATH")]
    pub metrics_path: String,

    /// How long to wait for the CSI driver's socket to accept a connection.
    #[arg(long, default_value = "1m", value_parser = parse_go_duration, value_name = "DURATION")]
    pub connection_timeout: Duration,

    /// Log verbosity (klog levels): 0-3 info, 4 debug, 5 and above trace. RUST_LOG overrides.
    #[arg(short = 'v', long = "v", default_value_t = 0, value_name = "LEVEL")]
    pub v: u8,
}

impl CommonFlags {
    /// `--http-endpoint`, with an empty value as unset.
    pub fn http_endpoint_addr(&self) -> Option<&str> {
        self.http_endpoint.as_deref().filter(|s| !s.is_empty())
    }

    /// Connects to the driver at `--csi-address` (retrying until `--connection-timeout`),
    /// waits for Probe and reads its name and capabilities: [`crate::connect_and_describe`].
    pub async fn connect_driver(
        &self,
        call_timeout: Duration,
        shutdown: &tokio_util::sync::CancellationToken,
    ) -> Result<(tonic::transport::Channel, crate::DriverInfo), crate::Error> {
        crate::connect_and_describe(
            &self.csi_address,
            self.connection_timeout,
            call_timeout,
            shutdown,
        )
        .await
    }

    /// What [`crate::serve_and_run`] needs: the HTTP endpoint and, with `--leader-election`,
    /// the Lease `lease_name`.
    pub fn serving(&self, lease_name: impl Into<String>) -> crate::Serving {
        crate::Serving {
            http_endpoint: self.http_endpoint_addr().map(str::to_string),
            metrics_path: self.metrics_path.clone(),
            leader_election: self.election.config(lease_name),
        }
    }
}

/// The leader election flags, named and defaulted as in the Go sidecars and
/// kube-controller-manager. [`CommonFlags`] has them; a binary that cannot take all of
/// [`CommonFlags`] (kube-controller-manager's controllers: no CSI socket, other client
/// defaults) embeds this group with `#[command(flatten)]`.
///
/// A binary that names its lease in `--leader-election`'s help overrides the help with
/// `#[command(mut_arg("leader_election", |a| a.help("...")))]`.
#[derive(clap::Args, Debug, Clone)]
#[command(mut_args = go_bools)]
pub struct LeaderElectionFlags {
    /// Elect a leader on a Lease; only the leader works. `--leader-election` alone means true.
    #[arg(long, default_value_t = false, value_parser = parse_go_bool, value_name = "BOOL")]
    pub leader_election: bool,

    /// Namespace of the leader election Lease. Empty: the pod's own namespace.
    #[arg(long, value_name = "NAMESPACE", value_parser = any_string)]
    pub leader_election_namespace: Option<String>,

    /// How long non-leaders wait after the last renewal before they may take the lease.
    #[arg(long, default_value = "15s", value_parser = parse_go_duration, value_name = "DURATION")]
    pub leader_election_lease_duration: Duration,

    /// How long the leader keeps trying to renew before it gives up leadership.
    #[arg(long, default_value = "10s", value_parser = parse_go_duration, value_name = "DURATION")]
    pub leader_election_renew_deadline: Duration,

    /// How often the leader renews and candidates retry.
    #[arg(long, default_value = "5s", value_parser = parse_go_duration, value_name = "DURATION")]
    pub leader_election_retry_period: Duration,
}

impl LeaderElectionFlags {
    /// `--leader-election-namespace`, with an empty value as unset.
    pub fn namespace_name(&self) -> Option<&str> {
        self.leader_election_namespace
            .as_deref()
            .filter(|s| !s.is_empty())
    }

    /// The election on Lease `lease_name` (in `--leader-election-namespace`, else the pod's
    /// namespace; this host's identity), or `None` without `--leader-election`.
    pub fn config(&self, lease_name: impl Into<String>) -> Option<LeaderElectionConfig> {
        self.leader_election.then(|| LeaderElectionConfig {
            lease_name: lease_name.into(),
            namespace: self
                .namespace_name()
                .map(str::to_string)
                .unwrap_or_else(default_namespace),
            identity: default_identity(),
            lease_duration: self.leader_election_lease_duration,
            renew_deadline: self.leader_election_renew_deadline,
            retry_period: self.leader_election_retry_period,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use std::path::Path;

    #[derive(Parser, Debug)]
    #[command(name = "test-sidecar", mut_args = go_bools)]
    struct Cli {
        #[command(flatten)]
        common: CommonFlags,
        /// A binary-specific bool flag, as the attacher's --dummy.
        #[arg(long, default_value_t = false, value_parser = parse_go_bool, value_name = "BOOL")]
        dummy: bool,
        #[arg(long, default_value = "15s", value_parser = parse_go_duration)]
        timeout: Duration,
    }

    fn os(args: &[&str]) -> Vec<std::ffi::OsString> {
        args.iter().map(std::ffi::OsString::from).collect()
    }

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        let mut all = vec!["test-sidecar"];
        all.extend_from_slice(args);
        Cli::try_parse_from(normalize_go_args(os(&all)))
    }

    #[test]
    fn defaults_are_the_go_sidecars_defaults() {
        let cli = parse(&[]).unwrap();
        let c = cli.common;
        assert_eq!(c.csi_address, "/run/csi/socket");
        assert_eq!(c.client.kubeconfig_path(), None);
        assert_eq!(c.client.kube_api_qps, 5.0);
        assert_eq!(c.client.kube_api_burst, 10);
        assert!(!c.election.leader_election);
        assert_eq!(c.election.namespace_name(), None);
        assert_eq!(
            c.election.leader_election_lease_duration,
            Duration::from_secs(15)
        );
        assert_eq!(
            c.election.leader_election_renew_deadline,
            Duration::from_secs(10)
        );
        assert_eq!(
            c.election.leader_election_retry_period,
            Duration::from_secs(5)
        );
        assert!(c.election.config("lease").is_none());
        assert_eq!(c.http_endpoint_addr(), None);
        assert_eq!(c.metrics_path, "/metrics");
        assert_eq!(c.connection_timeout, Duration::from_secs(60));
        assert_eq!(c.v, 0);
        assert!(!cli.dummy);
        assert_eq!(cli.timeout, Duration::from_secs(15));
    }

    #[test]
    fn go_style_command_lines_parse() {
        let cli = parse(&[
            "-csi-address=unix:///csi/csi.sock",
            "-kubeconfig",
            "/etc/kube.conf",
            "--kube-api-qps",
            "-1",
            "-kube-api-burst=100",
            "-leader-election",
            "--leader-election-namespace=kube-system",
            "-leader-election-lease-duration=1m30s",
            "--leader-election-renew-deadline",
            "45s",
            "-leader-election-retry-period=300ms",
            "-http-endpoint=:8080",
            "-metrics-path=/m",
            "-connection-timeout=2m",
            "-v=5",
            "-dummy",
            "-timeout",
            "1.5s",
        ])
        .unwrap();
        let c = cli.common;
        assert_eq!(c.csi_address, "unix:///csi/csi.sock");
        assert_eq!(
            c.client.kubeconfig_path().as_deref(),
            Some(Path::new("/etc/kube.conf"))
        );
        assert_eq!(c.client.kube_api_qps, -1.0);
        assert_eq!(c.client.kube_api_burst, 100);
        assert!(c.election.leader_election);
        assert_eq!(c.election.namespace_name(), Some("kube-system"));
        assert_eq!(
            c.election.leader_election_lease_duration,
            Duration::from_secs(90)
        );
        assert_eq!(
            c.election.leader_election_renew_deadline,
            Duration::from_secs(45)
        );
        assert_eq!(
            c.election.leader_election_retry_period,
            Duration::from_millis(300)
        );
        let lease = c.election.config("my-lease").unwrap();
        assert_eq!(lease.lease_name, "my-lease");
        assert_eq!(lease.namespace, "kube-system");
        // This host's identity (its random suffix differs from call to call).
        let host = |id: &str| id.rsplit_once('_').map(|(h, _)| h.to_string());
        assert_eq!(host(&lease.identity), host(&default_identity()));
        assert_eq!(
            (
                lease.lease_duration,
                lease.renew_deadline,
                lease.retry_period
            ),
            (
                Duration::from_secs(90),
                Duration::from_secs(45),
                Duration::from_millis(300)
            )
        );
        assert_eq!(c.http_endpoint_addr(), Some(":8080"));
        assert_eq!(c.metrics_path, "/m");
        assert_eq!(c.connection_timeout, Duration::from_secs(120));
        assert_eq!(c.v, 5);
        assert!(cli.dummy);
        assert_eq!(cli.timeout, Duration::from_millis(1500));
    }

    #[test]
    fn verbosity_spellings() {
        for args in [&["-v", "5"][..], &["-v=5"], &["--v=5"], &["--v", "5"]] {
            assert_eq!(parse(args).unwrap().common.v, 5, "{args:?}");
        }
    }

    #[test]
    fn bool_flag_spellings() {
        for (args, want) in [
            (&["--leader-election"][..], true),
            (&["-leader-election"], true),
            (&["--leader-election=true"], true),
            (&["-leader-election=T"], true),
            (&["--leader-election=1"], true),
            (&["--leader-election=false"], false),
            (&["-leader-election=0"], false),
            (&["--leader-election=False"], false),
        ] {
            assert_eq!(
                parse(args).unwrap().common.election.leader_election,
                want,
                "{args:?}"
            );
        }
        // Go does not take a separate value for a bool flag; clap then sees a stray argument.
        assert!(parse(&["--leader-election", "false"]).is_err());
        let err = parse(&["--leader-election=yes"]).unwrap_err().to_string();
        assert!(err.contains("invalid boolean \"yes\""), "{err}");
    }

    #[test]
    fn empty_values_mean_unset() {
        let c = parse(&[
            "--kubeconfig=",
            "--http-endpoint=",
            "--leader-election-namespace=",
        ])
        .unwrap()
        .common;
        assert_eq!(c.client.kubeconfig_path(), None);
        assert_eq!(c.http_endpoint_addr(), None);
        assert_eq!(c.election.namespace_name(), None);
        // An empty namespace is the pod's own, as if the flag were not given.
        let lease = c.election.config("l");
        assert!(lease.is_none(), "--leader-election is off");
        let on = parse(&["--leader-election", "--leader-election-namespace="])
            .unwrap()
            .common
            .election
            .config("l")
            .unwrap();
        assert_eq!(on.namespace, default_namespace());
    }

    #[test]
    fn bad_duration_names_the_flag_and_the_syntax() {
        let err = parse(&["--connection-timeout=10"]).unwrap_err().to_string();
        assert!(err.contains("--connection-timeout"), "{err}");
        assert!(err.contains("missing unit"), "{err}");
    }
}
