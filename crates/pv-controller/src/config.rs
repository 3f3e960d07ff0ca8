//! Flags ([`Flags`], Go `flag` syntax through `component_runtime::normalize_go_args`) and what the
//! controller runs with ([`Config`], [`Options`]); tests, csi-cluster and `crates/e2e` build
//! those directly.
//!
//! Names are kube-controller-manager's (`--pvclaimbinder-sync-period`, `--feature-gates`,
//! `--cloud-provider`, `--cluster-name`, `--enable-dynamic-provisioning`, `--leader-elect*`,
//! `--kube-api-qps`/`--kube-api-burst` with its defaults 20/30), the EBS driver's for EC2
//! access (`--region`, `--ec2-endpoint`), the CSI sidecars' for `--http-endpoint` and `-v`.

use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use component_runtime::{parse_go_bool, parse_go_duration};
use volume_plugins::MigratedPlugins;

use crate::Error;

/// Accepts any string, including the empty one Go manifests pass for "unset".
fn any_string(s: &str) -> Result<String, String> {
    Ok(s.to_owned())
}

/// pv-controller: binds PersistentVolumeClaims to PersistentVolumes, asks provisioners for
/// new volumes, reclaims released ones and guards both with finalizers (kube-controller-
/// manager's persistentvolume-binder, pvc-protection and pv-protection controllers).
#[derive(Parser, Debug, Clone)]
#[command(name = "pv-controller", version, about, long_about = None)]
#[command(mut_args = component_runtime::go_bools)]
#[command(mut_arg("leader_elect_resource_name", |a| a.default_value("pv-controller")))]
pub struct Flags {
    /// Kubernetes feature gates; only the CSIMigration* gates matter here (e.g.
    /// CSIMigrationAWS hands kubernetes.io/aws-ebs classes to ebs.csi.aws.com). Defaults as
    /// kube-controller-manager and the kubelet v1.26: CSIMigrationAWS, CSIMigrationGCE,
    /// CSIMigrationAzureDisk, CSIMigrationAzureFile and CSIMigrationvSphere on (cinder, whose
    /// gate v1.26 removed, migrated too), CSIMigrationPortworx off. CSIMigrationAWS=false is
    /// accepted (v1.26 refuses it: locked to true) to un-migrate aws-ebs as the migration
    /// design's walkthroughs do (docs/design/migration.md); =false for the other locked gates is
    /// refused as v1.26 refuses it.
    #[arg(long, default_value = "", value_name = "GATE=BOOL,...", value_parser = any_string)]
    pub feature_gates: String,

    /// How often every claim and volume is synced again even without a change.
    #[arg(long, default_value = "15s", value_parser = parse_go_duration, value_name = "DURATION")]
    pub pvclaimbinder_sync_period: Duration,

    /// Whether classes of in-tree plugins are provisioned here at all.
    #[arg(long, default_value_t = true, value_parser = parse_go_bool, value_name = "BOOL")]
    pub enable_dynamic_provisioning: bool,

    /// `--cloud-provider`, `--region`, `--ec2-endpoint` (a kubernetes.io/aws-ebs class that is
    /// not migrated and has no cloud gets a ProvisioningFailed Event saying so).
    #[command(flatten)]
    pub cloud: component_runtime::CloudFlags,

    /// The cluster's name, in the tags of the EBS volumes the in-tree provisioner creates.
    #[arg(long, default_value = "kubernetes", value_name = "NAME")]
    pub cluster_name: String,

    /// How many provisioning and deletion operations run at once.
    #[arg(long, default_value_t = 8, value_name = "N")]
    pub concurrent_operations: usize,

    /// `--kubeconfig`, `--kube-api-*`, `--leader-elect*`, `--http-endpoint`, `-v`.
    #[command(flatten)]
    pub controller: component_runtime::ControllerFlags,
}

/// The controller's settings.
#[derive(Debug, Clone)]
pub struct Options {
    /// In-tree plugins migrated to CSI (`--feature-gates`).
    pub migrated: MigratedPlugins,
    /// `--pvclaimbinder-sync-period`.
    pub sync_period: Duration,
    /// `--enable-dynamic-provisioning`.
    pub enable_dynamic_provisioning: bool,
    /// `--cluster-name`.
    pub cluster_name: String,
    /// Provisioning and deletion operations at once.
    pub concurrent_operations: usize,
    /// First retry delay of a failed sync or operation; it doubles up to `backoff_max`.
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// How long the start waits for the watch caches' first lists.
    pub cache_sync_timeout: Duration,
}

impl Default for Options {
    /// kube-controller-manager's defaults (backoff: its exponential backoff, 500 ms to 2m2s).
    fn default() -> Self {
        Self {
            migrated: MigratedPlugins::none(),
            sync_period: Duration::from_secs(15),
            enable_dynamic_provisioning: true,
            cluster_name: "kubernetes".into(),
            concurrent_operations: 8,
            backoff_initial: Duration::from_millis(500),
            backoff_max: Duration::from_secs(122),
            cache_sync_timeout: Duration::from_secs(120),
        }
    }
}

/// Everything [`crate::run`] needs besides the client.
#[derive(Clone)]
pub struct Config {
    /// The metrics and health endpoint, and the Lease to work under.
    pub serving: component_runtime::Serving,
    pub options: Options,
    /// EC2 for the in-tree `kubernetes.io/aws-ebs` provisioner and deleter
    /// (`--cloud-provider=aws`); `None`: no cloud, unmigrated in-tree classes fail with an
    /// Event saying so. Callers may pass any [`ebs_cloud::Cloud`] (ec2-sim through
    /// `ebs-cloud-aws`, a fake).
    pub cloud: Option<Arc<dyn ebs_cloud::Cloud>>,
    /// Watch caches shared with the other controllers of the process (`csi-cluster`, as
    /// kube-controller-manager's informer factory); `None`: caches of its own.
    pub shared_caches: Option<component_runtime::SharedCaches>,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("serving", &self.serving)
            .field("options", &self.options)
            .field("cloud", &self.cloud.is_some())
            .finish()
    }
}

impl Config {
    /// A config for an in-process controller: no leader election, no HTTP server, no cloud.
    pub fn new(options: Options) -> Self {
        Self {
            serving: component_runtime::Serving::default(),
            options,
            cloud: None,
            shared_caches: None,
        }
    }
}

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
        if self.pvclaimbinder_sync_period.is_zero() {
            return Err(Error::Config(
                "--pvclaimbinder-sync-period must be longer than 0".into(),
            ));
        }
        if self.concurrent_operations == 0 {
            return Err(Error::Config(
                "--concurrent-operations must be at least 1".into(),
            ));
        }
        if self.cluster_name.is_empty() {
            return Err(Error::Config("--cluster-name must not be empty".into()));
        }
        Ok(Config {
            serving: self.controller.serving(),
            options: Options {
                migrated,
                sync_period: self.pvclaimbinder_sync_period,
                enable_dynamic_provisioning: self.enable_dynamic_provisioning,
                cluster_name: self.cluster_name.clone(),
                concurrent_operations: self.concurrent_operations,
                ..Options::default()
            },
            cloud,
            shared_caches: None,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn parse(args: &[&str]) -> Flags {
        let argv = std::iter::once("pv-controller")
            .chain(args.iter().copied())
            .map(std::ffi::OsString::from);
        Flags::try_parse_from(component_runtime::normalize_go_args(argv)).expect("parses")
    }

    #[test]
    fn defaults_are_kube_controller_managers() {
        let f = parse(&[]);
        let c = f.config(None).expect("valid");
        let o = &c.options;
        // kube-controller-manager's and the kubelet's v1.26 gates: every GA migration on.
        assert_eq!(o.migrated, MigratedPlugins::kubernetes_v1_26());
        assert!(o.migrated.contains("kubernetes.io/aws-ebs"));
        assert_eq!(o.sync_period, Duration::from_secs(15));
        assert!(o.enable_dynamic_provisioning);
        assert_eq!(o.cluster_name, "kubernetes");
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
            .expect("kcm elects a leader by default");
        assert_eq!(lease.lease_name, "pv-controller");
        assert_eq!(lease.namespace, "kube-system");
        assert_eq!(lease.retry_period, Duration::from_secs(2));
        assert!(c.serving.http_endpoint.is_none() && c.cloud.is_none());
        assert!(f.controller.client.kubeconfig_path().is_none());
    }

    #[test]
    fn go_style_flags_parse() {
        let f = parse(&[
            "--feature-gates=CSIMigrationAWS=true",
            "-pvclaimbinder-sync-period=1s",
            "--cloud-provider=aws",
            "-cluster-name=prod",
            "-region=us-east-1",
            "-kubeconfig=/etc/kubeconfig",
            "-leader-elect=false",
            "-http-endpoint=:8080",
            "-v=4",
        ]);
        assert!(f.cloud.wants_aws().expect("valid"));
        assert_eq!(
            f.controller.client.kubeconfig_path(),
            Some(std::path::PathBuf::from("/etc/kubeconfig"))
        );
        let c = f.config(None).expect("valid");
        assert!(c.options.migrated.contains("kubernetes.io/aws-ebs"));
        assert_eq!(c.options.sync_period, Duration::from_secs(1));
        assert_eq!(c.options.cluster_name, "prod");
        assert!(c.serving.leader_election.is_none());
        assert_eq!(c.serving.http_endpoint.as_deref(), Some(":8080"));
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
        let e = parse(&["--pvclaimbinder-sync-period=0s"])
            .config(None)
            .unwrap_err();
        assert!(e.to_string().contains("--pvclaimbinder-sync-period"), "{e}");
    }
}
