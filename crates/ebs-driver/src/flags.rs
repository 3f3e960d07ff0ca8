//! The command line: the Go aws-ebs-csi-driver's flags (every one of them accepted), checked
//! and turned into a [`DriverConfig`]. `main` only parses, logs and runs.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use clap::builder::TypedValueParser as _;

use crate::{
    AwsConfig, BatchConfig, ControllerConfig, DriverConfig, Error, IdentityConfig, Mode,
    NodeConfig, NodeInfo, PublishConfig, go_args,
};

/// What the command line asks for.
#[derive(Debug)]
pub enum Command {
    /// Serve CSI with this config.
    Serve(Box<DriverConfig>),
    /// The Go driver's `pre-stop-hook`: it waits for the node's VolumeAttachments to go; this
    /// driver's node side holds no Kubernetes client, and the kubelet unmounts before the pod
    /// goes, so there is nothing to wait for.
    PreStopHook,
}

/// The AWS EBS CSI driver. Serves csi.v1.Identity plus csi.v1.Controller (create, delete,
/// attach, detach, snapshot, expand and modify EBS volumes through EC2) and/or csi.v1.Node (find
/// the attached device, format blank volumes, check and mount filesystems) on a unix socket.
///
/// Takes the Go aws-ebs-csi-driver's arguments as they are: the mode as a first word
/// (`controller`, `node`, `all`) or `--mode`, single- or double-dash flags, `--flag=value` or
/// `--flag value`, and every Go flag (see docs/ebs-driver.md, "Flags").
#[derive(Debug, Parser)]
#[command(name = "ebs-csi-driver", version)]
pub struct Flags {
    /// CSI endpoint: unix:///path/to/csi.sock, unix:/path or a plain path.
    #[arg(
        long,
        env = "CSI_ENDPOINT",
        default_value = "unix:///var/lib/kubelet/plugins/ebs.csi.aws.com/csi.sock"
    )]
    endpoint: String,

    /// Which services to run (or the first word of the command line). `node` loads no AWS
    /// credentials and makes no EC2 call; `pre-stop-hook` (the Go node DaemonSet's preStop
    /// hook) returns at once.
    #[arg(long, value_enum, default_value = "all")]
    mode: CliMode,

    /// The CSI driver name (GetPluginInfo); PVs and the CSIDriver object refer to it.
    #[arg(long, default_value = crate::identity::DEFAULT_DRIVER_NAME)]
    driver_name: String,

    /// Start ec2-sim in this process with its state in DIR (loop-device backed), point the
    /// EC2 client at it and register this machine as an instance: a complete driver on one
    /// machine with `--mode all`. Only in builds with the `embedded-ec2` feature (the
    /// default of `cargo build`); the images are built without it and refuse the flag.
    #[arg(long, value_name = "DIR")]
    embedded_ec2: Option<PathBuf>,

    /// Timing of the embedded EC2: instant, fast, realistic (with --embedded-ec2).
    #[arg(long, default_value = "fast")]
    embedded_timing: String,

    /// AWS region (default: AWS_REGION, the profile, or instance metadata).
    #[arg(long, env = "AWS_REGION")]
    region: Option<String>,

    /// EC2 endpoint URL override (ec2-sim, moto, a VPC endpoint).
    #[arg(long, env = "AWS_EC2_ENDPOINT")]
    ec2_endpoint: Option<String>,

    /// Merge concurrent DescribeVolumes / DescribeInstances calls into one request
    /// (`--batching`, `--batching=true|false`).
    #[arg(long, default_value_t = true, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", action = clap::ArgAction::Set)]
    batching: bool,

    /// How long a batch collects IDs before its request goes out, in milliseconds.
    #[arg(long, default_value_t = 100)]
    batch_window_ms: u64,

    /// The most IDs in one batched request.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..=1000))]
    batch_max_size: u64,

    /// Serve Prometheus metrics (/metrics) and health (/healthz, /readyz) on this address
    /// (`0.0.0.0:3301`, or Go's `:3301`).
    #[arg(long, value_parser = parse_http_endpoint)]
    http_endpoint: Option<SocketAddr>,

    /// This node's ID as the controller knows it: the EC2 instance ID (node and all modes;
    /// --embedded-ec2 registers one).
    #[arg(long, env = "CSI_NODE_ID", default_value = "")]
    node_id: String,

    /// This node's availability zone, reported as topology.
    #[arg(long, env = "AWS_AVAILABILITY_ZONE")]
    zone: Option<String>,

    /// How many EBS volumes may be attached to a node: NodeGetInfo's max_volumes_per_node,
    /// and the controller refuses (ResourceExhausted) to attach more. -1 (the Go default):
    /// the Nitro budget of 28 attachments less two network interfaces and
    /// --reserved-volume-attachments (default 1, the root volume), i.e. 25.
    #[arg(long, default_value_t = -1, allow_negative_numbers = true,
          value_parser = clap::value_parser!(i64).range(-1..))]
    volume_attach_limit: i64,

    /// Attachments reserved for system use (root and other non-CSI volumes); -1 = 1. Not
    /// together with --volume-attach-limit (as in the Go driver).
    #[arg(long, default_value_t = -1, allow_negative_numbers = true,
          value_parser = clap::value_parser!(i64).range(-1..=26))]
    reserved_volume_attachments: i64,

    /// Seconds an attachment may stay `attaching` before it is undone (detached, not forced).
    #[arg(long, default_value_t = 90)]
    attach_timeout_secs: u64,

    /// Seconds ControllerUnpublish waits for a detach before it reports DeadlineExceeded.
    #[arg(long, default_value_t = 120)]
    detach_timeout_secs: u64,

    /// Tags for every volume the driver creates, key=value (repeatable).
    #[arg(long = "extra-tag", value_parser = parse_kv)]
    extra_tag: Vec<(String, String)>,

    /// Tags for every volume the driver creates: k1=v1,k2=v2 (the Go driver's flag).
    #[arg(long, value_parser = go_args::parse_map)]
    extra_tags: Vec<Vec<(String, String)>>,

    /// Deprecated Go spelling of --extra-tags.
    #[arg(long, value_parser = go_args::parse_map)]
    extra_volume_tags: Vec<Vec<(String, String)>>,

    /// Cluster ID: volumes are tagged `kubernetes.io/cluster/<ID>: owned`,
    /// `KubernetesCluster: <ID>` and `Name: <ID>-dynamic-<volume name>`.
    #[arg(long)]
    k8s_tag_cluster_id: Option<String>,

    /// Log format: text or json.
    #[arg(long, default_value = "text",
          value_parser = clap::builder::PossibleValuesParser::new(["text", "json"])
              .try_map(|s| s.parse::<telemetry::LogFormat>()))]
    logging_format: telemetry::LogFormat,

    /// klog verbosity: 0-3 info, 4 debug, 5 and more trace (for the driver's own crates;
    /// RUST_LOG overrides).
    #[arg(long = "v", default_value_t = 0)]
    verbosity: u8,

    /// Log the AWS SDK's requests at debug level.
    #[arg(long, default_value_t = false, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", action = clap::ArgAction::Set)]
    aws_sdk_debug_log: bool,

    /// Skip an invalid `tagSpecification_N` / `tagDeletion_N` with a warning instead of
    /// failing CreateVolume / ControllerModifyVolume with InvalidArgument.
    #[arg(long, default_value_t = false, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", action = clap::ArgAction::Set)]
    warn_on_invalid_tag: bool,

    /// Appended to the AWS SDK's User-Agent (as its app name), e.g. `helm`.
    #[arg(long)]
    user_agent_extra: Option<String>,

    /// Bound on how long ControllerModifyVolume waits for the modification to reach
    /// `optimizing` (Go duration; the RPC's own deadline wins when shorter). Default 5m.
    #[arg(long, value_parser = telemetry::parse_go_duration)]
    modify_volume_timeout: Option<Duration>,

    /// Go flags accepted for drop-in compatibility; see docs/ebs-driver.md for why each is
    /// ignored.
    #[command(flatten)]
    ignored: IgnoredGoFlags,

    /// Where device nodes and udev links live (node side).
    #[arg(long, default_value = "/dev")]
    dev_root: PathBuf,

    /// Where sysfs is mounted (NVMe serials, loop backing files, device sizes).
    #[arg(long, default_value = "/sys")]
    sys_root: PathBuf,

    /// How long stage and publish wait for a just-attached device to appear, in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    device_wait_ms: u64,

    /// Filesystem for blank volumes when the volume capability names none (ext2, ext3, ext4, xfs).
    #[arg(long, default_value = "ext4")]
    default_fs_type: String,
}

/// The Go driver's first-word commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum CliMode {
    Controller,
    Node,
    All,
    PreStopHook,
}

/// Go flags with no effect here, accepted so the upstream manifests start the driver; the
/// reasons are in docs/ebs-driver.md.
#[derive(Debug, clap::Args)]
struct IgnoredGoFlags {
    #[arg(long, hide = true)]
    kubeconfig: Option<String>,
    #[arg(long, hide = true)]
    metadata_sources: Option<String>,
    #[arg(long, hide = true)]
    metrics_cert_file: Option<String>,
    #[arg(long, hide = true)]
    metrics_key_file: Option<String>,
    #[arg(long, hide = true, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", action = clap::ArgAction::Set)]
    enable_otel_tracing: Option<bool>,
    #[arg(long, hide = true, value_parser = telemetry::parse_go_duration)]
    modify_volume_request_handler_timeout: Option<Duration>,
    #[arg(long, hide = true, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", action = clap::ArgAction::Set)]
    deprecated_metrics: Option<bool>,
    #[arg(long, hide = true, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", action = clap::ArgAction::Set)]
    windows_host_process: Option<bool>,
    #[arg(long, hide = true, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", action = clap::ArgAction::Set)]
    legacy_xfs: Option<bool>,
    #[arg(long, hide = true)]
    csi_mount_point_prefix: Option<String>,
    #[arg(long, hide = true, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", action = clap::ArgAction::Set)]
    logtostderr: Option<bool>,
    #[arg(long, hide = true, value_parser = telemetry::parse_go_duration)]
    log_flush_frequency: Option<Duration>,
    #[arg(long, hide = true)]
    vmodule: Option<String>,
    #[arg(long, hide = true, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", action = clap::ArgAction::Set)]
    log_json_split_stream: Option<bool>,
    #[arg(long, hide = true)]
    log_json_info_buffer_size: Option<String>,
    #[arg(long, hide = true, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", action = clap::ArgAction::Set)]
    log_text_split_stream: Option<bool>,
    #[arg(long, hide = true)]
    log_text_info_buffer_size: Option<String>,
}

fn parse_kv(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("'{s}' is not key=value"))
}

/// `host:port`, or Go's `:port` (all interfaces).
fn parse_http_endpoint(s: &str) -> Result<SocketAddr, String> {
    let full = if s.starts_with(':') {
        format!("0.0.0.0{s}")
    } else {
        s.to_string()
    };
    full.parse()
        .map_err(|e| format!("'{s}' is not host:port or :port ({e})"))
}

impl Flags {
    /// The flags of this process: Go's single-dash and first-word forms normalized first.
    pub fn from_args() -> Self {
        Self::parse_from(go_args::normalize(std::env::args_os()))
    }

    /// klog's `-v` and `--logging-format` through [`telemetry::init_logging_with`]: our crates
    /// at the `-v` level, libraries at info (the AWS SDK at debug with `--aws-sdk-debug-log`),
    /// `RUST_LOG` overrides; on stderr, as klog. Then tells which accepted Go flags do nothing
    /// here.
    pub fn init_logging(&self) {
        const AWS_SDK_DEBUG: &[&str] = &[
            "aws_smithy_runtime=debug",
            "aws_sdk_ec2=debug",
            "aws_config=debug",
        ];
        let extra = if self.aws_sdk_debug_log {
            AWS_SDK_DEBUG
        } else {
            &[]
        };
        telemetry::init_logging_with(self.verbosity, self.logging_format, extra);
        warn_ignored(&self.ignored);
    }

    /// What the flags ask for, checked: the driver's config, or the pre-stop hook.
    pub fn into_command(self) -> Result<Command, Error> {
        let f = self;
        let mode = match f.mode {
            CliMode::Controller => Mode::Controller,
            CliMode::Node => Mode::Node,
            CliMode::All => Mode::All,
            CliMode::PreStopHook => return Ok(Command::PreStopHook),
        };
        if f.ignored.metrics_cert_file.is_some() || f.ignored.metrics_key_file.is_some() {
            return Err(Error::invalid(
                "--metrics-cert-file / --metrics-key-file",
                "HTTPS metrics are not supported; serve plain HTTP on --http-endpoint (e.g. behind kube-rbac-proxy) and drop these flags",
            ));
        }
        if f.volume_attach_limit != -1 && f.reserved_volume_attachments != -1 {
            return Err(Error::invalid(
                "--volume-attach-limit",
                "only one of --volume-attach-limit and --reserved-volume-attachments may be specified",
            ));
        }
        let volume_attach_limit = if f.volume_attach_limit > 0 {
            f.volume_attach_limit
        } else {
            // 28 Nitro attachment slots, less two network interfaces and the reserved ones.
            let reserved = if f.reserved_volume_attachments < 0 {
                1
            } else {
                f.reserved_volume_attachments
            };
            (26 - reserved).max(1)
        };
        #[cfg(feature = "embedded-ec2")]
        let embedded_timing = f
            .embedded_timing
            .parse::<crate::EmbeddedTiming>()
            .map_err(|e| Error::invalid("--embedded-timing", e.to_string()))?;
        #[cfg(not(feature = "embedded-ec2"))]
        {
            if f.embedded_ec2.is_some() {
                return Err(Error::invalid("--embedded-ec2", crate::NO_EMBEDDED_EC2));
            }
            // Only read with --embedded-ec2, which this build refuses.
            let _ = &f.embedded_timing;
        }
        let mut extra_tags: BTreeMap<String, String> = BTreeMap::new();
        extra_tags.extend(f.extra_volume_tags.into_iter().flatten());
        extra_tags.extend(f.extra_tags.into_iter().flatten());
        extra_tags.extend(f.extra_tag);
        let config = DriverConfig {
            endpoint: f.endpoint,
            mode,
            identity: IdentityConfig {
                driver_name: f.driver_name,
                ..IdentityConfig::default()
            },
            node: NodeConfig {
                dev_root: f.dev_root,
                sys_root: f.sys_root,
                device_wait: Duration::from_millis(f.device_wait_ms),
                default_fs_type: f.default_fs_type,
                ..NodeConfig::default()
            },
            node_info: NodeInfo {
                node_id: f.node_id,
                zone: f.zone,
                max_volumes_per_node: volume_attach_limit,
            },
            controller: ControllerConfig {
                default_zone: None,
                extra_tags,
                cluster_id: f.k8s_tag_cluster_id.filter(|c| !c.is_empty()),
                modify_timeout: f.modify_volume_timeout,
                warn_on_invalid_tag: f.warn_on_invalid_tag,
                publish: PublishConfig {
                    attach_timeout: Duration::from_secs(f.attach_timeout_secs),
                    detach_timeout: Duration::from_secs(f.detach_timeout_secs),
                    attach_limit: usize::try_from(volume_attach_limit).ok(),
                    ..PublishConfig::default()
                },
            },
            aws: AwsConfig {
                region: f.region,
                endpoint: f.ec2_endpoint,
                app_name: f.user_agent_extra.filter(|u| !u.is_empty()),
                batching: BatchConfig {
                    enabled: f.batching,
                    window: Duration::from_millis(f.batch_window_ms),
                    max_size: usize::try_from(f.batch_max_size).unwrap_or(200),
                },
                ..AwsConfig::default()
            },
            embedded_ec2: f.embedded_ec2,
            #[cfg(feature = "embedded-ec2")]
            embedded_timing,
            http_endpoint: f.http_endpoint,
            metrics: crate::DriverMetrics::default(),
        };
        Ok(Command::Serve(Box::new(config)))
    }
}

/// Tells, once at start, which accepted Go flags do nothing here.
fn warn_ignored(i: &IgnoredGoFlags) {
    let mut ignored = Vec::new();
    let mut note = |set: bool, flag: &'static str| {
        if set {
            ignored.push(flag);
        }
    };
    note(i.kubeconfig.is_some(), "--kubeconfig");
    note(i.metadata_sources.is_some(), "--metadata-sources");
    note(i.enable_otel_tracing == Some(true), "--enable-otel-tracing");
    note(
        i.modify_volume_request_handler_timeout.is_some(),
        "--modify-volume-request-handler-timeout",
    );
    note(i.deprecated_metrics == Some(true), "--deprecated-metrics");
    note(
        i.windows_host_process == Some(true),
        "--windows-host-process",
    );
    note(i.legacy_xfs == Some(true), "--legacy-xfs");
    note(
        i.csi_mount_point_prefix.is_some(),
        "--csi-mount-point-prefix",
    );
    note(i.vmodule.is_some(), "--vmodule");
    if !ignored.is_empty() {
        tracing::info!(
            flags = %ignored.join(" "),
            "accepted for compatibility with the Go driver; no effect here (docs/ebs-driver.md, Flags)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn command(args: &[&str]) -> Result<Command, Error> {
        let args = std::iter::once("ebs-csi-driver")
            .chain(args.iter().copied())
            .map(std::ffi::OsString::from);
        Flags::try_parse_from(go_args::normalize(args))
            .expect("flags parse")
            .into_command()
    }

    fn config(args: &[&str]) -> DriverConfig {
        match command(args) {
            Ok(Command::Serve(config)) => *config,
            other => panic!("{args:?}: {other:?}"),
        }
    }

    #[test]
    fn the_attach_limit_is_the_nitro_slots_left_or_the_one_given() {
        let limit = |args: &[&str]| config(args).node_info.max_volumes_per_node;
        // 28 Nitro slots, less two network interfaces and one reserved.
        assert_eq!(limit(&["node"]), 25);
        assert_eq!(limit(&["node", "--reserved-volume-attachments=3"]), 23);
        assert_eq!(limit(&["node", "--volume-attach-limit=10"]), 10);
        let publish = config(&["controller", "--volume-attach-limit=10"])
            .controller
            .publish
            .attach_limit;
        assert_eq!(publish, Some(10));
        let both = command(&[
            "node",
            "--volume-attach-limit=10",
            "--reserved-volume-attachments=2",
        ]);
        assert!(
            matches!(
                &both,
                Err(Error::InvalidArgument {
                    field: "--volume-attach-limit",
                    ..
                })
            ),
            "{both:?}"
        );
    }

    #[test]
    fn modes_tags_and_the_pre_stop_hook() {
        let c = config(&[
            "all",
            "--extra-tags=team=a,env=dev",
            "--extra-tag=env=prod",
            "--k8s-tag-cluster-id=",
        ]);
        assert_eq!(c.mode, Mode::All);
        assert_eq!(c.controller.extra_tags["team"], "a");
        assert_eq!(
            c.controller.extra_tags["env"], "prod",
            "--extra-tag last wins"
        );
        assert_eq!(c.controller.cluster_id, None, "an empty cluster ID is none");
        assert!(matches!(
            command(&["pre-stop-hook"]),
            Ok(Command::PreStopHook)
        ));
        let https = command(&["controller", "--metrics-cert-file=/tls/crt"]).unwrap_err();
        assert!(
            https
                .to_string()
                .contains("HTTPS metrics are not supported"),
            "{https}"
        );
    }
}
