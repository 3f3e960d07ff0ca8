//! Flags ([`Flags`], Go `flag` syntax through `component_runtime::normalize_go_args`) and what the
//! controller runs with ([`Config`], [`Options`]): tests and `crates/e2e` build those directly.
//!
//! Names follow kube-controller-manager where it has the flag (`--feature-gates`,
//! `--disable-force-detach-on-timeout`, `--kube-api-qps`/`--kube-api-burst` with its defaults
//! 20/30, `--cloud-provider`), the EBS driver for EC2 access (`--region`, `--ec2-endpoint`), and
//! the CSI sidecars for the rest (`--http-endpoint`, `--leader-election*`, `-v`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use component_runtime::{parse_go_bool, parse_go_duration};
use volume_plugins::{MigratedPlugins, SkipAttachMode};

use crate::Error;

/// Accepts any string, including the empty one Go manifests pass for "unset".
fn any_string(s: &str) -> Result<String, String> {
    Ok(s.to_owned())
}

/// attach-detach-controller: attaches the volumes of scheduled pods to their nodes and detaches
/// them once no pod on the node uses them (Kubernetes' attach/detach controller).
#[derive(Parser, Debug, Clone)]
#[command(name = "attach-detach-controller", version, about, long_about = None)]
#[command(mut_args = component_runtime::go_bools)]
// The shared group's help does not name the lease; this one always has the same name.
#[command(mut_arg("leader_election", |a| a.help(
    "Elect a leader on a Lease (named attachdetach-controller); only the leader works"
)))]
pub struct Flags {
    /// What happens to CSI volumes whose CSIDriver says attachRequired: false. bypass-adc
    /// (today's Kubernetes): this controller leaves them alone, no VolumeAttachment, not in
    /// node.status.volumesAttached. through-adc (the skip-attach design as written in 2018,
    /// docs/design/skip-attach.md): a no-op attach, listed in
    /// volumesAttached (the node agent must run with the same mode).
    #[arg(long, default_value = "bypass-adc", value_name = "MODE")]
    pub skip_attach: SkipAttachMode,

    /// Kubernetes feature gates; only the CSIMigration* gates matter here
    /// (e.g. CSIMigrationAWS sends kubernetes.io/aws-ebs volumes on nodes that migrated it
    /// to the EBS CSI driver). Defaults as
    /// kube-controller-manager and the kubelet v1.26: CSIMigrationAWS, CSIMigrationGCE,
    /// CSIMigrationAzureDisk, CSIMigrationAzureFile and CSIMigrationvSphere on (cinder, whose
    /// gate v1.26 removed, migrated too), CSIMigrationPortworx off. CSIMigrationAWS=false is
    /// accepted (v1.26 refuses it: locked to true) to un-migrate aws-ebs as the migration
    /// design's walkthroughs do (docs/design/migration.md); =false for the other locked gates is
    /// refused as v1.26 refuses it.
    #[arg(long, default_value = "", value_name = "GATE=BOOL,...", value_parser = any_string)]
    pub feature_gates: String,

    /// How often the reconciler compares the desired and the actual state.
    #[arg(long, default_value = "100ms", value_parser = parse_go_duration, value_name = "DURATION")]
    pub reconciler_sync_period: Duration,

    /// How long a volume that is no longer needed but still in the node's
    /// status.volumesInUse waits before it is detached anyway (a forced detach).
    #[arg(long, default_value = "6m", value_parser = parse_go_duration, value_name = "DURATION")]
    pub max_wait_for_unmount: Duration,

    /// Never force a detach: a volume the node still reports in use stays attached until the
    /// node stops reporting it, however long that takes.
    #[arg(long, default_value_t = false, value_parser = parse_go_bool, value_name = "BOOL")]
    pub disable_force_detach_on_timeout: bool,

    /// How long one CSI attach waits for the external attacher to set the VolumeAttachment's
    /// status.attached (Kubernetes' CSI plugin waits 2m) and one in-tree EBS attach waits for
    /// EC2; a timed-out attach is retried with backoff.
    #[arg(long, default_value = "2m", value_parser = parse_go_duration, value_name = "DURATION")]
    pub attach_timeout: Duration,

    /// How long one detach waits for the VolumeAttachment to be gone (or EC2 to detach).
    #[arg(long, default_value = "2m", value_parser = parse_go_duration, value_name = "DURATION")]
    pub detach_timeout: Duration,

    /// `--cloud-provider`, `--region`, `--ec2-endpoint` (a volume that is not migrated and
    /// has no cloud gets a FailedAttachVolume Event saying so).
    #[command(flatten)]
    pub cloud: component_runtime::CloudFlags,

    /// The `--leader-election*` flags (the lease: [`LEASE_NAME`]).
    #[command(flatten)]
    pub election: component_runtime::LeaderElectionFlags,

    /// How the controller reaches the API server.
    #[command(flatten)]
    pub client: component_runtime::KubeClientFlags,

    /// `--http-endpoint`, `--metrics-path`, `-v`.
    #[command(flatten)]
    pub telemetry: component_runtime::TelemetryFlags,
}

/// The reconciler's settings.
#[derive(Debug, Clone)]
pub struct Options {
    pub skip_attach: SkipAttachMode,
    /// In-tree plugins this controller sends to their CSI drivers (`--feature-gates`).
    pub migrated: MigratedPlugins,
    pub reconciler_sync_period: Duration,
    pub max_wait_for_unmount: Duration,
    pub disable_force_detach_on_timeout: bool,
    pub attach_timeout: Duration,
    pub detach_timeout: Duration,
    /// First retry delay of a failed operation; it doubles up to `backoff_max`.
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// How long the start waits for the watch caches' first lists.
    pub cache_sync_timeout: Duration,
}

impl Default for Options {
    /// kube-controller-manager's defaults (backoff: its exponential backoff, 500 ms to 2m2s).
    fn default() -> Self {
        Self {
            skip_attach: SkipAttachMode::default(),
            migrated: MigratedPlugins::none(),
            reconciler_sync_period: Duration::from_millis(100),
            max_wait_for_unmount: Duration::from_secs(360),
            disable_force_detach_on_timeout: false,
            attach_timeout: Duration::from_secs(120),
            detach_timeout: Duration::from_secs(120),
            backoff_initial: Duration::from_millis(500),
            backoff_max: Duration::from_secs(122),
            cache_sync_timeout: Duration::from_secs(120),
        }
    }
}

/// Everything [`crate::run`] needs.
#[derive(Clone)]
pub struct Config {
    pub kubeconfig: Option<PathBuf>,
    pub kube_api_qps: f32,
    pub kube_api_burst: u32,
    /// The metrics and health endpoint, and the Lease to work under.
    pub serving: component_runtime::Serving,
    pub options: Options,
    /// EC2 for the in-tree `kubernetes.io/aws-ebs` plugin (`--cloud-provider=aws`); `None`: no
    /// cloud, in-tree volumes that are not migrated fail with an Event.
    pub cloud: Option<Arc<dyn ebs_cloud::Cloud>>,
    /// Watch caches shared with the other controllers of the process (`csi-cluster`, as
    /// kube-controller-manager's informer factory); `None`: caches of its own.
    pub shared_caches: Option<component_runtime::SharedCaches>,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("kubeconfig", &self.kubeconfig)
            .field("kube_api_qps", &self.kube_api_qps)
            .field("kube_api_burst", &self.kube_api_burst)
            .field("serving", &self.serving)
            .field("options", &self.options)
            .field("cloud", &self.cloud.is_some())
            .finish()
    }
}

impl Config {
    /// A config for an in-process controller: the given kubeconfig, no leader election, no
    /// HTTP server, no cloud.
    pub fn new(kubeconfig: Option<PathBuf>, options: Options) -> Self {
        Self {
            kubeconfig,
            kube_api_qps: -1.0,
            kube_api_burst: 0,
            serving: component_runtime::Serving::default(),
            options,
            cloud: None,
            shared_caches: None,
        }
    }
}

/// The lease the leader holds.
pub const LEASE_NAME: &str = "attachdetach-controller";

impl Flags {
    /// The checked [`Config`]; `cloud` is built by the binary from `--cloud-provider`,
    /// `--region` and `--ec2-endpoint`.
    pub fn config(&self, cloud: Option<Arc<dyn ebs_cloud::Cloud>>) -> Result<Config, Error> {
        self.cloud.wants_aws()?;
        let migrated = MigratedPlugins::kubernetes_v1_26()
            .with_feature_gates(&self.feature_gates)
            .map_err(|e| Error::Config(e.to_string()))?;
        for warning in volume_plugins::feature_gate_warnings(&self.feature_gates) {
            tracing::warn!("{warning}");
        }
        for (flag, value) in [
            ("--reconciler-sync-period", self.reconciler_sync_period),
            ("--attach-timeout", self.attach_timeout),
            ("--detach-timeout", self.detach_timeout),
        ] {
            if value.is_zero() {
                return Err(Error::Config(format!("{flag} must be longer than 0")));
            }
        }
        let leader_election = self.election.config(LEASE_NAME);
        Ok(Config {
            kubeconfig: self.client.kubeconfig_path(),
            kube_api_qps: self.client.kube_api_qps,
            kube_api_burst: self.client.kube_api_burst,
            serving: self.telemetry.serving(leader_election),
            options: Options {
                skip_attach: self.skip_attach,
                migrated,
                reconciler_sync_period: self.reconciler_sync_period,
                max_wait_for_unmount: self.max_wait_for_unmount,
                disable_force_detach_on_timeout: self.disable_force_detach_on_timeout,
                attach_timeout: self.attach_timeout,
                detach_timeout: self.detach_timeout,
                ..Options::default()
            },
            cloud,
            shared_caches: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Flags {
        let argv = std::iter::once("attach-detach-controller")
            .chain(args.iter().copied())
            .map(std::ffi::OsString::from);
        Flags::try_parse_from(component_runtime::normalize_go_args(argv)).expect("parses")
    }

    #[test]
    fn defaults_are_kube_controller_managers() {
        let c = parse(&[]).config(None).expect("valid");
        let o = &c.options;
        assert_eq!(o.skip_attach, SkipAttachMode::BypassAdc);
        // kube-controller-manager's and the kubelet's v1.26 gates: every GA migration on.
        assert_eq!(o.migrated, MigratedPlugins::kubernetes_v1_26());
        assert!(o.migrated.contains("kubernetes.io/aws-ebs"));
        assert_eq!(o.reconciler_sync_period, Duration::from_millis(100));
        assert_eq!(o.max_wait_for_unmount, Duration::from_secs(360));
        assert!(!o.disable_force_detach_on_timeout);
        assert_eq!(o.attach_timeout, Duration::from_secs(120));
        assert_eq!((c.kube_api_qps, c.kube_api_burst), (20.0, 30));
        assert!(c.serving.leader_election.is_none() && c.serving.http_endpoint.is_none());
        assert!(c.kubeconfig.is_none() && c.cloud.is_none());
    }

    #[test]
    fn go_style_flags_parse() {
        let f = parse(&[
            "-skip-attach=through-adc",
            "--feature-gates=CSIMigrationAWS=true",
            "-reconciler-sync-period=1s",
            "--max-wait-for-unmount",
            "30s",
            "-disable-force-detach-on-timeout",
            "-attach-timeout=5s",
            "--cloud-provider=aws",
            "-region=us-east-1",
            "-kubeconfig=/etc/kubeconfig",
            "-leader-election",
            "-leader-election-namespace=kube-system",
            "-http-endpoint=:8080",
            "-v=4",
        ]);
        assert!(f.cloud.wants_aws().expect("valid"));
        assert_eq!(f.cloud.region.as_deref(), Some("us-east-1"));
        assert_eq!(f.telemetry.v, 4);
        let c = f.config(None).expect("valid");
        let o = &c.options;
        assert_eq!(o.skip_attach, SkipAttachMode::ThroughAdc);
        assert!(o.migrated.contains("kubernetes.io/aws-ebs"));
        assert_eq!(o.reconciler_sync_period, Duration::from_secs(1));
        assert_eq!(o.max_wait_for_unmount, Duration::from_secs(30));
        assert!(o.disable_force_detach_on_timeout);
        assert_eq!(o.attach_timeout, Duration::from_secs(5));
        assert_eq!(c.kubeconfig, Some(PathBuf::from("/etc/kubeconfig")));
        let lease = c.serving.leader_election.expect("leader election on");
        assert_eq!(lease.lease_name, LEASE_NAME);
        assert_eq!(lease.namespace, "kube-system");
        assert_eq!(c.serving.http_endpoint.as_deref(), Some(":8080"));
    }

    #[test]
    fn shared_leader_election_flags_keep_this_controllers_help() {
        use clap::CommandFactory;
        let cmd = Flags::command();
        let help = |id: &str| {
            cmd.get_arguments()
                .find(|a| a.get_id() == id)
                .and_then(|a| a.get_help())
                .map(|h| h.to_string())
                .unwrap_or_default()
        };
        assert_eq!(
            help("leader_election"),
            "Elect a leader on a Lease (named attachdetach-controller); only the leader works"
        );
        assert_eq!(
            help("leader_election_retry_period"),
            "How often the leader renews and candidates retry"
        );
        let f = parse(&["-leader-election-lease-duration=1m30s"]);
        assert_eq!(
            f.election.leader_election_lease_duration,
            Duration::from_secs(90)
        );
    }

    #[test]
    fn nonsense_is_refused_naming_the_flag() {
        let e = parse(&["--cloud-provider=gce"]).config(None).unwrap_err();
        assert!(e.to_string().contains("--cloud-provider=gce"), "{e}");
        let e = parse(&["--feature-gates=CSIMigrationAWS=maybe"])
            .config(None)
            .unwrap_err();
        assert!(e.to_string().contains("CSIMigrationAWS"), "{e}");
        let e = parse(&["--feature-gates=CSIMigrationGCE=false"])
            .config(None)
            .unwrap_err();
        assert!(
            e.to_string().contains(
                "cannot set feature gate CSIMigrationGCE to false, feature is locked to true"
            ),
            "{e}"
        );
        // The migration design's downgrade: aws-ebs alone un-migrated (v1.26 refuses this one; we
        // warn).
        let c = parse(&["--feature-gates=CSIMigrationAWS=false"])
            .config(None)
            .expect("CSIMigrationAWS=false is accepted");
        assert!(!c.options.migrated.contains("kubernetes.io/aws-ebs"));
        assert!(c.options.migrated.contains("kubernetes.io/gce-pd"));
        let e = parse(&["--reconciler-sync-period=0s"])
            .config(None)
            .unwrap_err();
        assert!(e.to_string().contains("--reconciler-sync-period"), "{e}");
        let argv = ["attach-detach-controller", "--skip-attach=seed"].map(std::ffi::OsString::from);
        let e = Flags::try_parse_from(argv).unwrap_err().to_string();
        assert!(e.contains("through-adc"), "{e}");
    }
}
