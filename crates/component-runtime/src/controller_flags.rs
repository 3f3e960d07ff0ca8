//! The flag groups of the kube-controller-manager-style components (the PV, ephemeral-volume,
//! StatefulSet and attach/detach controllers, the scheduler, the node agent), each embedded
//! with `#[command(flatten)]`. The CSI sidecars take [`crate::CommonFlags`] instead: their
//! names and defaults are the Go sidecars'.
//!
//! Names and defaults are kube-controller-manager's. A binary whose Go counterpart has other
//! defaults (kube-scheduler and the kubelet talk to the API server at 50/100; each controller
//! names its own Lease) changes them with `#[command(mut_arg("kube_api_qps", |a|
//! a.default_value("50")))]`, so `--help` shows what applies.

use std::path::PathBuf;
use std::time::Duration;

use crate::leader::{LeaderElectionConfig, default_identity};
use crate::{Error, Serving, parse_go_bool, parse_go_duration};

/// Accepts any string, including the empty one Go manifests pass for "unset".
fn any_string(s: &str) -> Result<String, String> {
    Ok(s.to_owned())
}

/// How the component reaches the API server.
#[derive(clap::Args, Debug, Clone)]
pub struct KubeClientFlags {
    /// Path to a kubeconfig file. Empty: in-cluster configuration, then $KUBECONFIG or
    /// ~/.kube/config.
    #[arg(long, value_name = "PATH", value_parser = any_string)]
    pub kubeconfig: Option<String>,

    /// Queries per second to the API server (client-go semantics: a negative value means
    /// unlimited).
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
}

impl KubeClientFlags {
    /// `--kubeconfig`, with an empty value as unset.
    pub fn kubeconfig_path(&self) -> Option<PathBuf> {
        self.kubeconfig
            .as_deref()
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
    }

    /// Leader election's own client, sending `user_agent` + " leader-election": unlimited, so a
    /// busy controller never delays a lease renewal.
    pub async fn election_client(&self, user_agent: &str) -> Result<kube::Client, Error> {
        let user_agent = format!("{user_agent} leader-election");
        crate::build_client(self.kubeconfig_path().as_deref(), &user_agent, -1.0, 0).await
    }

    /// The rate-limited client these flags describe, sending `user_agent`.
    pub async fn client(&self, user_agent: &str) -> Result<kube::Client, Error> {
        crate::build_client(
            self.kubeconfig_path().as_deref(),
            user_agent,
            self.kube_api_qps,
            self.kube_api_burst,
        )
        .await
    }
}

/// kube-controller-manager's and kube-scheduler's `--leader-elect*` flags. The binary names
/// its Lease: `#[command(mut_arg("leader_elect_resource_name", |a|
/// a.default_value("pv-controller")))]`.
#[derive(clap::Args, Debug, Clone)]
#[command(mut_args = crate::go_bools)]
pub struct LeaderElectFlags {
    /// Elect a leader on a Lease (--leader-elect-resource-name in
    /// --leader-elect-resource-namespace); only the leader works.
    #[arg(long, default_value_t = true, value_parser = parse_go_bool, value_name = "BOOL")]
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

    /// Name of the leader election Lease.
    // Not required on the command line: every binary gives it a default with `mut_arg`, and
    // one that forgot fails to parse its flags at all (its flag tests catch that).
    #[arg(long, required = false, value_name = "NAME")]
    pub leader_elect_resource_name: String,
}

impl LeaderElectFlags {
    /// The election these flags ask for (this host's identity), or `None` without
    /// `--leader-elect`.
    pub fn config(&self) -> Option<LeaderElectionConfig> {
        self.leader_elect.then(|| LeaderElectionConfig {
            lease_name: self.leader_elect_resource_name.clone(),
            namespace: self.leader_elect_resource_namespace.clone(),
            identity: default_identity(),
            lease_duration: self.leader_elect_lease_duration,
            renew_deadline: self.leader_elect_renew_deadline,
            retry_period: self.leader_elect_retry_period,
        })
    }
}

/// Where metrics and health are served, and how much is logged.
#[derive(clap::Args, Debug, Clone)]
pub struct TelemetryFlags {
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

impl TelemetryFlags {
    /// `--http-endpoint`, with an empty value as unset.
    pub fn http_endpoint_addr(&self) -> Option<&str> {
        self.http_endpoint.as_deref().filter(|s| !s.is_empty())
    }

    /// What [`crate::serve_and_run`] needs, with the election `leader_election`.
    pub fn serving(&self, leader_election: Option<LeaderElectionConfig>) -> Serving {
        Serving {
            http_endpoint: self.http_endpoint_addr().map(str::to_string),
            metrics_path: self.metrics_path.clone(),
            leader_election,
        }
    }
}

/// All three groups, for a controller that elects a leader (the PV, ephemeral-volume and
/// StatefulSet controllers, the scheduler).
#[derive(clap::Args, Debug, Clone)]
pub struct ControllerFlags {
    #[command(flatten)]
    pub client: KubeClientFlags,
    #[command(flatten)]
    pub leader: LeaderElectFlags,
    #[command(flatten)]
    pub telemetry: TelemetryFlags,
}

impl ControllerFlags {
    /// What [`crate::serve_and_run`] needs: the endpoint and the election these flags ask for.
    pub fn serving(&self) -> Serving {
        self.telemetry.serving(self.leader.config())
    }
}

/// kube-controller-manager's cloud flags, for the in-tree kubernetes.io/aws-ebs plugin of the
/// attach/detach and PV controllers. Only the binary builds the EC2 client
/// (`ebs_cloud_aws::in_tree_cloud`), and only with its `aws` feature: without it
/// `ebs_cloud::in_tree_cloud_without_ec2` says why `--cloud-provider=aws` cannot work.
#[derive(clap::Args, Debug, Clone)]
pub struct CloudFlags {
    /// Cloud provider of the in-tree aws-ebs plugin: "" (none: what is not migrated fails with
    /// an Event saying so) or "aws".
    #[arg(long, default_value = "", value_name = "PROVIDER", value_parser = any_string)]
    pub cloud_provider: String,

    /// AWS region of the in-tree aws-ebs plugin. Empty: AWS_REGION, the profile, or instance
    /// metadata.
    #[arg(long, value_name = "REGION", value_parser = any_string)]
    pub region: Option<String>,

    /// EC2 endpoint URL override (ec2-sim, a VPC endpoint); also AWS_EC2_ENDPOINT.
    #[arg(long, env = "AWS_EC2_ENDPOINT", value_name = "URL", value_parser = any_string)]
    pub ec2_endpoint: Option<String>,
}

impl CloudFlags {
    /// Whether `--cloud-provider` asks for EC2 (only "" and "aws" exist).
    pub fn wants_aws(&self) -> Result<bool, Error> {
        match self.cloud_provider.as_str() {
            "" => Ok(false),
            "aws" => Ok(true),
            other => Err(Error::Flag(format!(
                "--cloud-provider={other}: want \"\" (no cloud) or \"aws\""
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// A controller that moves its defaults, as kube-scheduler's flags differ from kcm's.
    #[derive(Parser, Debug)]
    #[command(name = "test-controller")]
    #[command(mut_arg("leader_elect_resource_name", |a| a.default_value("test-controller")))]
    #[command(mut_arg("kube_api_qps", |a| a.default_value("50")))]
    struct Cli {
        #[command(flatten)]
        client: KubeClientFlags,
        #[command(flatten)]
        leader: LeaderElectFlags,
        #[command(flatten)]
        telemetry: TelemetryFlags,
    }

    fn parse(args: &[&str]) -> Cli {
        let mut all = vec!["test-controller"];
        all.extend_from_slice(args);
        Cli::try_parse_from(crate::normalize_go_args(
            all.into_iter().map(std::ffi::OsString::from),
        ))
        .unwrap()
    }

    #[test]
    fn defaults_are_kcms_unless_the_binary_moves_them() {
        let c = parse(&[]);
        assert_eq!(c.client.kube_api_qps, 50.0, "moved by the binary");
        assert_eq!(c.client.kube_api_burst, 30);
        assert_eq!(c.client.kubeconfig_path(), None);
        let lease = c.leader.config().expect("kcm elects a leader by default");
        assert_eq!(lease.lease_name, "test-controller");
        assert_eq!(lease.namespace, "kube-system");
        assert_eq!(
            (
                lease.lease_duration,
                lease.renew_deadline,
                lease.retry_period
            ),
            (
                Duration::from_secs(15),
                Duration::from_secs(10),
                Duration::from_secs(2)
            )
        );
        let serving = c.telemetry.serving(c.leader.config());
        assert_eq!(serving.http_endpoint, None);
        assert_eq!(serving.metrics_path, "/metrics");
        assert_eq!(c.telemetry.v, 0);
    }

    #[test]
    fn go_style_values_are_read_and_empty_means_unset() {
        let c = parse(&[
            "-kubeconfig=",
            "--kube-api-qps=-1",
            "-leader-elect=false",
            "--leader-elect-retry-period",
            "500ms",
            "-http-endpoint=",
            "--v=5",
        ]);
        assert_eq!(c.client.kubeconfig_path(), None);
        assert_eq!(c.client.kube_api_qps, -1.0);
        assert!(c.leader.config().is_none());
        assert_eq!(
            c.leader.leader_elect_retry_period,
            Duration::from_millis(500)
        );
        assert_eq!(c.telemetry.http_endpoint_addr(), None);
        assert_eq!(c.telemetry.v, 5);

        let c = parse(&["--kubeconfig=/k", "--http-endpoint=:8080"]);
        assert_eq!(c.client.kubeconfig_path(), Some(PathBuf::from("/k")));
        let serving = c.telemetry.serving(None);
        assert_eq!(serving.http_endpoint.as_deref(), Some(":8080"));
        assert!(serving.leader_election.is_none());
    }
}
