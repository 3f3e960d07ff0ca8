//! Command-line flags, named and defaulted as the Go external-provisioner's so existing
//! manifests work unchanged (`-flag=value`, `--flag value`: run the arguments through
//! `component_runtime::normalize_go_args` first).

use std::time::Duration;

use clap::Parser;
use component_runtime::{parse_go_bool, parse_go_duration};

/// csi-provisioner: provisions and deletes CSI volumes for PersistentVolumeClaims.
#[derive(Parser, Debug, Clone)]
#[command(name = "csi-provisioner", version, about, long_about = None)]
#[command(mut_args = component_runtime::go_bools)]
#[command(mut_arg("leader_election", |a| a.help(
    "Elect a leader on a Lease named after the driver (ebs.csi.aws.com -> ebs-csi-aws-com); only the leader provisions. --leader-election alone means true."
)))]
pub struct Config {
    #[command(flatten)]
    pub common: component_runtime::CommonFlags,

    /// Timeout of every CSI call (CreateVolume, DeleteVolume, ...).
    #[arg(long, default_value = "15s", value_parser = parse_go_duration, value_name = "DURATION")]
    pub timeout: Duration,

    /// How many claims and volumes are worked on at once.
    #[arg(long, default_value_t = 100, value_name = "N")]
    pub worker_threads: usize,

    /// Backoff after the first failure of a claim or volume; it doubles with every failure.
    #[arg(long, default_value = "1s", value_parser = parse_go_duration, value_name = "DURATION")]
    pub retry_interval_start: Duration,

    /// Longest backoff between retries of one claim or volume.
    #[arg(long, default_value = "5m", value_parser = parse_go_duration, value_name = "DURATION")]
    pub retry_interval_max: Duration,

    /// Prefix of the volume (and PV) names: <prefix>-<claim UID>.
    #[arg(long, default_value = "pvc", value_name = "PREFIX")]
    pub volume_name_prefix: String,

    /// How many characters of the claim UID go into the name (-1: all of it).
    #[arg(long, default_value_t = -1, allow_negative_numbers = true, value_name = "N")]
    pub volume_name_uuid_length: i32,

    /// Pass csi.storage.k8s.io/pvc/name, pvc/namespace and pv/name to CreateVolume.
    #[arg(long, default_value_t = false, value_parser = parse_go_bool, value_name = "BOOL")]
    pub extra_create_metadata: bool,

    /// Filesystem of mount volumes whose class names none (empty: the driver decides).
    #[arg(long, default_value = "", value_name = "FSTYPE")]
    pub default_fstype: String,

    /// Comma-separated key=true|false pairs: Topology (default false, as in Go). Unknown
    /// gates are refused.
    #[arg(long, default_value = "", value_name = "GATES")]
    pub feature_gates: String,

    /// Requisite topology of a WaitForFirstConsumer volume is only the selected node's.
    #[arg(long, default_value_t = false, value_parser = parse_go_bool, value_name = "BOOL")]
    pub strict_topology: bool,

    /// Immediate volumes without allowedTopologies get every node's topology as requisite.
    #[arg(long, default_value_t = true, value_parser = parse_go_bool, value_name = "BOOL")]
    pub immediate_topology: bool,

    /// Run next to a node-local driver on one node (`--node-name`): only claims whose
    /// `volume.kubernetes.io/selected-node` is that node are provisioned (Immediate claims are
    /// not), and only PVs whose node affinity matches that node are deleted.
    #[arg(long, default_value_t = false, value_parser = parse_go_bool, value_name = "BOOL")]
    pub node_deployment: bool,

    /// The node this provisioner runs on, for `--node-deployment` (the Go sidecar reads it
    /// from NODE_NAME).
    #[arg(long, env = "NODE_NAME", default_value = "", value_name = "NAME")]
    pub node_name: String,
}

/// The feature gates the Go external-provisioner knows. Only `Topology` changes what we do;
/// the others are accepted so manifests that set them keep working.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FeatureGates {
    pub topology: bool,
}

/// Gates accepted and ignored: their behaviour is always on (HonorPVReclaimPolicy: our
/// finalizer) or not offered.
const IGNORED_GATES: &[&str] = &[
    "HonorPVReclaimPolicy",
    "CrossNamespaceVolumeDataSource",
    "VolumeAttributesClass",
    "AllAlpha",
    "AllBeta",
];

impl FeatureGates {
    /// `Topology=true,HonorPVReclaimPolicy=false`: Go's `--feature-gates` syntax.
    pub fn parse(s: &str) -> Result<Self, crate::Error> {
        let mut gates = Self::default();
        for pair in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').ok_or_else(|| {
                crate::Error::Config(format!(
                    "--feature-gates: {pair:?} is not key=value (e.g. Topology=true)"
                ))
            })?;
            let on = parse_go_bool(value.trim())
                .map_err(|e| crate::Error::Config(format!("--feature-gates: {key}: {e}")))?;
            match key.trim() {
                "Topology" => gates.topology = on,
                k if IGNORED_GATES.contains(&k) => {}
                k => {
                    return Err(crate::Error::Config(format!(
                        "--feature-gates: unrecognized feature gate: {k} (known: Topology, {})",
                        IGNORED_GATES.join(", ")
                    )));
                }
            }
        }
        Ok(gates)
    }
}

/// What the controller needs from the flags (tests build it directly).
#[derive(Debug, Clone)]
pub struct Options {
    pub timeout: Duration,
    pub workers: usize,
    pub retry_interval_start: Duration,
    pub retry_interval_max: Duration,
    pub volume_name_prefix: String,
    /// `None`: the whole UID.
    pub volume_name_uuid_length: Option<usize>,
    pub extra_create_metadata: bool,
    pub default_fstype: String,
    pub topology: bool,
    pub strict_topology: bool,
    pub immediate_topology: bool,
    /// `--node-deployment`: the node whose claims (selected node) and volumes (node affinity)
    /// are ours; `None`: every claim and volume of the driver.
    pub node_deployment: Option<String>,
}

impl Default for Options {
    /// The Go sidecar's defaults.
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(15),
            workers: 100,
            retry_interval_start: Duration::from_secs(1),
            retry_interval_max: Duration::from_secs(300),
            volume_name_prefix: "pvc".into(),
            volume_name_uuid_length: None,
            extra_create_metadata: false,
            default_fstype: String::new(),
            topology: false,
            strict_topology: false,
            immediate_topology: true,
            node_deployment: None,
        }
    }
}

impl Config {
    /// The controller's options, checked.
    pub fn options(&self) -> Result<Options, crate::Error> {
        let bad = |m: &str| Err(crate::Error::Config(m.to_string()));
        if self.worker_threads == 0 {
            return bad("--worker-threads must be at least 1");
        }
        if self.timeout.is_zero() {
            return bad("--timeout must be longer than 0");
        }
        if self.retry_interval_start.is_zero() {
            return bad("--retry-interval-start must be longer than 0");
        }
        if self.retry_interval_max < self.retry_interval_start {
            return Err(crate::Error::Config(format!(
                "--retry-interval-max ({:?}) must not be shorter than --retry-interval-start ({:?})",
                self.retry_interval_max, self.retry_interval_start
            )));
        }
        if self.volume_name_prefix.is_empty() {
            return bad("--volume-name-prefix must not be empty");
        }
        if self.volume_name_prefix.ends_with('-') {
            return bad("--volume-name-prefix must not end with '-' (the name is <prefix>-<uid>)");
        }
        let gates = FeatureGates::parse(&self.feature_gates)?;
        let node_deployment = match (self.node_deployment, self.node_name.trim()) {
            (false, _) => None,
            (true, "") => {
                return bad("--node-deployment needs this node's name: --node-name or NODE_NAME");
            }
            (true, node) => Some(node.to_string()),
        };
        Ok(Options {
            timeout: self.timeout,
            workers: self.worker_threads,
            retry_interval_start: self.retry_interval_start,
            retry_interval_max: self.retry_interval_max,
            volume_name_prefix: self.volume_name_prefix.clone(),
            volume_name_uuid_length: usize::try_from(self.volume_name_uuid_length).ok(),
            extra_create_metadata: self.extra_create_metadata,
            default_fstype: self.default_fstype.clone(),
            topology: gates.topology,
            strict_topology: self.strict_topology,
            immediate_topology: self.immediate_topology,
            node_deployment,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn parse(args: &[&str]) -> Config {
        let argv = std::iter::once("csi-provisioner")
            .chain(args.iter().copied())
            .map(std::ffi::OsString::from);
        Config::try_parse_from(component_runtime::normalize_go_args(argv)).expect("parses")
    }

    #[test]
    fn defaults_are_the_go_sidecars() {
        let c = parse(&[]);
        let o = c.options().unwrap();
        assert_eq!(c.common.csi_address, "/run/csi/socket");
        assert_eq!(o.timeout, Duration::from_secs(15));
        assert_eq!(o.workers, 100);
        assert_eq!(o.retry_interval_start, Duration::from_secs(1));
        assert_eq!(o.retry_interval_max, Duration::from_secs(300));
        assert_eq!(o.volume_name_prefix, "pvc");
        assert_eq!(o.volume_name_uuid_length, None);
        assert!(!o.extra_create_metadata);
        assert!(!o.topology);
        assert!(!o.strict_topology);
        assert!(o.immediate_topology);
        assert_eq!(o.node_deployment, None);
        assert_eq!(c.common.client.kube_api_qps, 5.0);
        assert_eq!(c.common.client.kube_api_burst, 10);
    }

    #[test]
    fn go_style_flags_parse() {
        let c = parse(&[
            "-timeout=1m",
            "--worker-threads",
            "3",
            "-volume-name-prefix=vol",
            "-volume-name-uuid-length=8",
            "-extra-create-metadata",
            "--feature-gates=Topology=true,HonorPVReclaimPolicy=true",
            "-strict-topology",
            "--immediate-topology=false",
            "-default-fstype=ext4",
            "-v=5",
        ]);
        let o = c.options().unwrap();
        assert_eq!(o.timeout, Duration::from_secs(60));
        assert_eq!(o.workers, 3);
        assert_eq!(o.volume_name_prefix, "vol");
        assert_eq!(o.volume_name_uuid_length, Some(8));
        assert!(o.extra_create_metadata && o.topology && o.strict_topology);
        assert!(!o.immediate_topology);
        assert_eq!(o.default_fstype, "ext4");
    }

    #[test]
    fn node_deployment_needs_the_node_name() {
        let o = parse(&["--node-deployment", "--node-name=node-1"])
            .options()
            .unwrap();
        assert_eq!(o.node_deployment.as_deref(), Some("node-1"));
        let e = parse(&["-node-deployment=true", "--node-name="])
            .options()
            .unwrap_err();
        assert!(e.to_string().contains("--node-name"), "{e}");
    }

    #[test]
    fn unknown_feature_gates_and_nonsense_are_refused_naming_the_flag() {
        let e = parse(&["--feature-gates=Bogus=true"])
            .options()
            .unwrap_err();
        assert!(
            e.to_string().contains("unrecognized feature gate: Bogus"),
            "{e}"
        );
        let e = parse(&["--feature-gates=Topology"]).options().unwrap_err();
        assert!(e.to_string().contains("--feature-gates"), "{e}");
        let e = parse(&["--worker-threads=0"]).options().unwrap_err();
        assert!(e.to_string().contains("--worker-threads"), "{e}");
    }
}
