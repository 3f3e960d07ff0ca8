//! Flags ([`Flags`], Go `flag` syntax through `component_runtime::normalize_go_args`) and what the agent
//! runs with ([`Config`], [`Options`]); tests and `csi-cluster` build those directly.
//!
//! Names are the kubelet's where it has the flag (`--node-name` is its `--hostname-override`
//! spelled as csi-cluster's nodes want it, `--root-dir`, `--feature-gates`, `--provider-id`,
//! `--node-labels`, `--node-status-update-frequency`, `--node-lease-duration-seconds`,
//! `--kube-api-qps`/`--kube-api-burst` with its 50/100), the CSI sidecars' for the rest
//! (`--http-endpoint`, `-v`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use component_runtime::parse_go_duration;
use volume_plugins::{MigratedPlugins, SkipAttachMode};

use crate::Error;

/// Accepts any string, including the empty one Go manifests pass for "unset".
fn any_string(s: &str) -> Result<String, String> {
    Ok(s.to_owned())
}

/// csi-node-agent: the kubelet's volume part for one node. Registers CSI drivers (plugin
/// registration), keeps the Node and CSINode objects, stages and publishes the volumes of the
/// pods bound to this node and unpublishes them when the pods go. Runs no containers.
#[derive(Parser, Debug, Clone)]
#[command(name = "csi-node-agent", version, about, long_about = None)]
#[command(mut_arg("kube_api_qps", |a| a.default_value("50")))]
#[command(mut_arg("kube_api_burst", |a| a.default_value("100")))]
pub struct Flags {
    /// Name of the Node object this agent is (created if missing, adopted if present).
    #[arg(long, value_name = "NAME")]
    pub node_name: String,

    /// The kubelet's root directory: plugins_registry/, plugins/ (staging paths), pods/
    /// (publish paths) live under it.
    #[arg(long, default_value = "/var/lib/kubelet", value_name = "DIR")]
    pub root_dir: PathBuf,

    /// Kubernetes feature gates; only the CSIMigration* gates matter here. The CSINode
    /// `storage.alpha.kubernetes.io/migrated-plugins` annotation is written from them, and the
    /// node stays NotReady until the annotation on the CSINode matches. Defaults as
    /// kube-controller-manager and the kubelet v1.26: CSIMigrationAWS, CSIMigrationGCE,
    /// CSIMigrationAzureDisk, CSIMigrationAzureFile and CSIMigrationvSphere on (cinder, whose
    /// gate v1.26 removed, migrated too), CSIMigrationPortworx off. CSIMigrationAWS=false is
    /// accepted (v1.26 refuses it: locked to true) to un-migrate aws-ebs as the migration
    /// design's walkthroughs do (docs/design/migration.md); =false for the other locked gates is
    /// refused as v1.26 refuses it.
    #[arg(long, default_value = "", value_name = "GATE=BOOL,...", value_parser = any_string)]
    pub feature_gates: String,

    /// What happens to CSI volumes whose CSIDriver says attachRequired: false. bypass-adc
    /// (today's Kubernetes): mounted at once. through-adc (the skip-attach design as written in
    /// 2018, docs/design/skip-attach.md): mounted once the
    /// attach/detach controller lists them in node.status.volumesAttached (it must run with
    /// the same mode).
    #[arg(long, default_value = "bypass-adc", value_name = "MODE")]
    pub skip_attach: SkipAttachMode,

    /// spec.providerID of the Node (e.g. aws:///us-east-1a/i-0123456789abcdef0): the in-tree
    /// aws-ebs plugin of the attach/detach controller attaches to that instance.
    #[arg(long, value_name = "ID", value_parser = any_string)]
    pub provider_id: Option<String>,

    /// Labels to add to the Node (key=value,...).
    #[arg(long, default_value = "", value_name = "KEY=VALUE,...", value_parser = any_string)]
    pub node_labels: String,

    /// How often the Ready condition is re-posted when nothing changed (the kubelet's
    /// --node-status-report-frequency role; the Lease is the heartbeat).
    #[arg(long, default_value = "5m", value_parser = parse_go_duration, value_name = "DURATION")]
    pub node_status_report_frequency: Duration,

    /// How often the node's status is computed and posted when it changed.
    #[arg(long, default_value = "10s", value_parser = parse_go_duration, value_name = "DURATION")]
    pub node_status_update_frequency: Duration,

    /// The node Lease's spec.leaseDurationSeconds; it is renewed every quarter of it.
    #[arg(long, default_value_t = 40, value_name = "SECONDS")]
    pub node_lease_duration_seconds: i32,

    /// How often the volume manager's reconciler runs when no change woke it.
    #[arg(long, default_value = "100ms", value_parser = parse_go_duration, value_name = "DURATION")]
    pub reconciler_sync_period: Duration,

    /// How often the pods' volumes are synced again when nothing changed: a volume whose
    /// CSIDriver says requiresRepublish is published again (NodePublishVolume) this often, as
    /// the kubelet's --sync-frequency.
    #[arg(long, default_value = "1m", value_parser = parse_go_duration, value_name = "DURATION")]
    pub sync_frequency: Duration,

    /// How often volume stats are collected (NodeGetVolumeStats) for the
    /// kubelet_volume_stats_* metrics.
    #[arg(long, default_value = "1m", value_parser = parse_go_duration, value_name = "DURATION")]
    pub volume_stats_agg_period: Duration,

    /// Where in-tree aws-ebs devices appear (/dev; ec2-sim's per-instance device dir in tests).
    #[arg(long, default_value = "/dev", value_name = "DIR")]
    pub dev_root: PathBuf,

    /// Pods this node can run: the node's `status.capacity.pods` and `allocatable.pods`, which
    /// the scheduler fits pods against (the kubelet's --max-pods, default 110).
    #[arg(long, default_value_t = 110, value_name = "N")]
    pub max_pods: u32,

    /// How the controller reaches the API server.
    #[command(flatten)]
    pub client: component_runtime::KubeClientFlags,

    /// `--http-endpoint`, `--metrics-path`, `-v`.
    #[command(flatten)]
    pub telemetry: component_runtime::TelemetryFlags,
}

/// What the node agent does, apart from where it connects.
#[derive(Debug, Clone)]
pub struct Options {
    pub node_name: String,
    pub root_dir: PathBuf,
    pub skip_attach: SkipAttachMode,
    /// In-tree plugins this agent sends to their CSI drivers (`--feature-gates`).
    pub migrated: MigratedPlugins,
    pub provider_id: Option<String>,
    pub node_labels: BTreeMap<String, String>,
    pub node_status_update_frequency: Duration,
    pub node_status_report_frequency: Duration,
    pub node_lease_duration_seconds: i32,
    pub reconciler_sync_period: Duration,
    /// How often volumes of `requiresRepublish` drivers are published again
    /// (`--sync-frequency`).
    pub sync_frequency: Duration,
    /// First retry delay of a failed mount or unmount; doubles up to `backoff_max`.
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// How long one CSI node call may take (the kubelet's csiTimeout is 2 minutes).
    pub csi_timeout: Duration,
    /// How long the start waits for the watch caches' first lists.
    pub cache_sync_timeout: Duration,
    /// How long a mount waits for its VolumeAttachment to be attached, or for the device of
    /// an in-tree aws-ebs volume (the kubelet's 2 minutes).
    pub attach_timeout: Duration,
    /// How long a volume may wait (for volumesAttached, its driver, its PVC) before a
    /// `FailedMount` Event says what it waits for.
    pub stuck_event_after: Duration,
    /// How often NodeGetVolumeStats feeds the `kubelet_volume_stats_*` gauges (the kubelet's
    /// --volume-stats-agg-period).
    pub volume_stats_period: Duration,
    /// Where the in-tree aws-ebs plugin finds devices.
    pub dev_root: PathBuf,
    /// The node's pod capacity (`--max-pods`).
    pub max_pods: u32,
}

impl Options {
    /// The kubelet's defaults for node `node_name` under `root_dir`.
    pub fn new(node_name: impl Into<String>, root_dir: impl Into<PathBuf>) -> Self {
        Self {
            node_name: node_name.into(),
            root_dir: root_dir.into(),
            skip_attach: SkipAttachMode::default(),
            migrated: MigratedPlugins::none(),
            provider_id: None,
            node_labels: BTreeMap::new(),
            node_status_update_frequency: Duration::from_secs(10),
            node_status_report_frequency: Duration::from_secs(300),
            node_lease_duration_seconds: 40,
            reconciler_sync_period: Duration::from_millis(100),
            sync_frequency: Duration::from_secs(60),
            backoff_initial: Duration::from_millis(500),
            backoff_max: Duration::from_secs(122),
            csi_timeout: Duration::from_secs(120),
            cache_sync_timeout: Duration::from_secs(120),
            attach_timeout: Duration::from_secs(120),
            stuck_event_after: Duration::from_secs(15),
            volume_stats_period: Duration::from_secs(60),
            dev_root: PathBuf::from("/dev"),
            max_pods: 110,
        }
    }

    /// `<root-dir>/plugins_registry`, where drivers' registrars put their sockets.
    pub fn plugins_registry_dir(&self) -> PathBuf {
        self.root_dir.join("plugins_registry")
    }
}

/// Everything [`crate::run`] needs.
#[derive(Debug, Clone)]
pub struct Config {
    pub kubeconfig: Option<PathBuf>,
    pub kube_api_qps: f32,
    pub kube_api_burst: u32,
    /// The metrics and health endpoint (no leader election: one agent per node).
    pub serving: component_runtime::Serving,
    pub options: Options,
}

impl Config {
    /// A config for an in-process agent: the given kubeconfig, no HTTP server, no rate limit.
    pub fn new(kubeconfig: Option<PathBuf>, options: Options) -> Self {
        Self {
            kubeconfig,
            kube_api_qps: -1.0,
            kube_api_burst: 0,
            serving: component_runtime::Serving::default(),
            options,
        }
    }
}

/// `key=value,...` as the kubelet's `--node-labels` takes it.
fn parse_labels(value: &str) -> Result<BTreeMap<String, String>, Error> {
    let mut labels = BTreeMap::new();
    for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let Some((k, v)) = item.split_once('=') else {
            return Err(Error::Config(format!(
                "--node-labels: {item:?} is not key=value"
            )));
        };
        if k.trim().is_empty() {
            return Err(Error::Config(format!(
                "--node-labels: {item:?} has an empty key"
            )));
        }
        labels.insert(k.trim().to_string(), v.trim().to_string());
    }
    Ok(labels)
}

impl Flags {
    /// The checked [`Config`].
    pub fn config(&self) -> Result<Config, Error> {
        if self.node_name.trim().is_empty() {
            return Err(Error::Config("--node-name must not be empty".into()));
        }
        let migrated = MigratedPlugins::kubernetes_v1_26()
            .with_feature_gates(&self.feature_gates)
            .map_err(|e| Error::Config(e.to_string()))?;
        for warning in volume_plugins::feature_gate_warnings(&self.feature_gates) {
            tracing::warn!("{warning}");
        }
        for (flag, value) in [
            ("--reconciler-sync-period", self.reconciler_sync_period),
            ("--sync-frequency", self.sync_frequency),
            (
                "--node-status-update-frequency",
                self.node_status_update_frequency,
            ),
        ] {
            if value.is_zero() {
                return Err(Error::Config(format!("{flag} must be longer than 0")));
            }
        }
        if self.node_lease_duration_seconds <= 0 {
            return Err(Error::Config(format!(
                "--node-lease-duration-seconds must be positive, got {}",
                self.node_lease_duration_seconds
            )));
        }
        let mut options = Options::new(self.node_name.trim(), &self.root_dir);
        options.skip_attach = self.skip_attach;
        options.migrated = migrated;
        options.provider_id = self.provider_id.clone().filter(|p| !p.is_empty());
        options.node_labels = parse_labels(&self.node_labels)?;
        options.node_status_update_frequency = self.node_status_update_frequency;
        options.node_status_report_frequency = self.node_status_report_frequency;
        options.node_lease_duration_seconds = self.node_lease_duration_seconds;
        options.reconciler_sync_period = self.reconciler_sync_period;
        options.sync_frequency = self.sync_frequency;
        options.volume_stats_period = self.volume_stats_agg_period;
        options.dev_root = self.dev_root.clone();
        if self.max_pods == 0 {
            return Err(Error::Config(
                "--max-pods must be at least 1: a node that can run no pod is not a node".into(),
            ));
        }
        options.max_pods = self.max_pods;
        Ok(Config {
            kubeconfig: self.client.kubeconfig_path(),
            kube_api_qps: self.client.kube_api_qps,
            kube_api_burst: self.client.kube_api_burst,
            serving: self.telemetry.serving(None),
            options,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Flags, clap::Error> {
        let argv = std::iter::once("csi-node-agent")
            .chain(args.iter().copied())
            .map(std::ffi::OsString::from);
        Flags::try_parse_from(component_runtime::normalize_go_args(argv))
    }

    #[test]
    fn defaults_are_the_kubelets() {
        let c = parse(&["--node-name=n1"]).unwrap().config().unwrap();
        let o = &c.options;
        assert_eq!(o.node_name, "n1");
        assert_eq!(o.root_dir, PathBuf::from("/var/lib/kubelet"));
        assert_eq!(
            o.plugins_registry_dir(),
            PathBuf::from("/var/lib/kubelet/plugins_registry")
        );
        assert_eq!(o.skip_attach, SkipAttachMode::BypassAdc);
        // kube-controller-manager's and the kubelet's v1.26 gates: every GA migration on.
        assert_eq!(o.migrated, MigratedPlugins::kubernetes_v1_26());
        assert!(o.migrated.contains("kubernetes.io/aws-ebs"));
        assert_eq!(o.node_lease_duration_seconds, 40);
        assert_eq!((c.kube_api_qps, c.kube_api_burst), (50.0, 100));
        assert!(c.kubeconfig.is_none() && c.serving.http_endpoint.is_none());
        assert_eq!(o.max_pods, 110, "the kubelet's --max-pods default");
    }

    #[test]
    fn max_pods_is_read_and_zero_is_refused() {
        let c = parse(&["--node-name=n1", "--max-pods=600"]).unwrap();
        assert_eq!(c.config().unwrap().options.max_pods, 600);
        let err = parse(&["--node-name=n1", "--max-pods=0"])
            .unwrap()
            .config()
            .unwrap_err()
            .to_string();
        assert!(err.contains("--max-pods"), "{err}");
    }

    #[test]
    fn go_style_flags_parse() {
        let c = parse(&[
            "-node-name=n2",
            "-root-dir=/tmp/kubelet",
            "--feature-gates=CSIMigrationAWS=true",
            "-skip-attach=through-adc",
            "-provider-id=aws:///us-east-1a/i-0123",
            "--node-labels=zone=a, rack=r1",
            "-kubeconfig=/etc/kubeconfig",
            "-http-endpoint=:9808",
            "-v=4",
        ])
        .unwrap()
        .config()
        .unwrap();
        let o = &c.options;
        assert!(o.migrated.contains("kubernetes.io/aws-ebs"));
        assert_eq!(o.skip_attach, SkipAttachMode::ThroughAdc);
        assert_eq!(o.provider_id.as_deref(), Some("aws:///us-east-1a/i-0123"));
        assert_eq!(o.node_labels.get("rack").map(String::as_str), Some("r1"));
        assert_eq!(o.node_labels.get("zone").map(String::as_str), Some("a"));
        assert_eq!(c.serving.http_endpoint.as_deref(), Some(":9808"));
    }

    #[test]
    fn nonsense_is_refused_naming_the_flag() {
        let e = parse(&["--node-name=n", "--feature-gates=CSIMigrationAWS=maybe"])
            .unwrap()
            .config()
            .unwrap_err();
        assert!(e.to_string().contains("CSIMigrationAWS"), "{e}");
        let e = parse(&["--node-name=n", "--feature-gates=CSIMigrationGCE=false"])
            .unwrap()
            .config()
            .unwrap_err();
        assert!(
            e.to_string().contains(
                "cannot set feature gate CSIMigrationGCE to false, feature is locked to true"
            ),
            "{e}"
        );
        // The migration design's downgrade: aws-ebs alone un-migrated (v1.26 refuses this one; we
        // warn).
        let c = parse(&["--node-name=n", "--feature-gates=CSIMigrationAWS=false"])
            .unwrap()
            .config()
            .expect("CSIMigrationAWS=false is accepted");
        assert!(!c.options.migrated.contains("kubernetes.io/aws-ebs"));
        assert!(c.options.migrated.contains("kubernetes.io/gce-pd"));
        let e = parse(&["--node-name=n", "--node-labels=nokey"])
            .unwrap()
            .config()
            .unwrap_err();
        assert!(e.to_string().contains("--node-labels"), "{e}");
        let e = parse(&["--node-name= "]).unwrap().config().unwrap_err();
        assert!(e.to_string().contains("--node-name"), "{e}");
        let e = parse(&["--node-name=n", "--reconciler-sync-period=0s"])
            .unwrap()
            .config()
            .unwrap_err();
        assert!(e.to_string().contains("--reconciler-sync-period"), "{e}");
        assert!(parse(&[]).is_err(), "--node-name is required");
    }
}
