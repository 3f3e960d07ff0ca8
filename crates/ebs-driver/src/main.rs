//! `ebs-csi-driver`: flags into a config, then the library's `run`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use ebs_driver::{
    AwsConfig, BatchConfig, ControllerConfig, DriverConfig, IdentityConfig, Mode, NodeConfig,
    NodeInfo, PublishConfig,
};

/// The AWS EBS CSI driver. Serves csi.v1.Identity plus csi.v1.Controller (create, delete,
/// attach, detach, snapshot and expand EBS volumes through EC2) and/or csi.v1.Node (find the
/// attached device, format blank volumes, check and mount filesystems) on a unix socket.
#[derive(Debug, Parser)]
#[command(name = "ebs-csi-driver", version)]
struct Flags {
    /// CSI endpoint: unix:///path/to/csi.sock or a plain path.
    #[arg(
        long,
        env = "CSI_ENDPOINT",
        default_value = "unix:///var/lib/kubelet/plugins/ebs.csi.aws.com/csi.sock"
    )]
    endpoint: String,

    /// Which services to run. `node` loads no AWS credentials and makes no EC2 call.
    #[arg(long, value_enum, default_value = "all")]
    mode: Mode,

    /// The CSI driver name (GetPluginInfo); PVs and the CSIDriver object refer to it.
    #[arg(long, default_value = ebs_driver::identity::DEFAULT_DRIVER_NAME)]
    driver_name: String,

    /// Start ec2-sim in this process with its state in DIR (loop-device backed), point the
    /// EC2 client at it and register this machine as an instance: a complete driver on one
    /// machine with `--mode all`.
    #[arg(long, value_name = "DIR")]
    embedded_ec2: Option<PathBuf>,

    /// Timing of the embedded EC2: instant, fast, realistic.
    #[arg(long, default_value = "fast")]
    embedded_timing: String,

    /// AWS region (default: AWS_REGION, the profile, or instance metadata).
    #[arg(long, env = "AWS_REGION")]
    region: Option<String>,

    /// EC2 endpoint URL override (ec2-sim, moto, a VPC endpoint).
    #[arg(long, env = "AWS_EC2_ENDPOINT")]
    ec2_endpoint: Option<String>,

    /// Merge concurrent DescribeVolumes / DescribeInstances calls into one request.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    batching: bool,

    /// How long a batch collects IDs before its request goes out, in milliseconds.
    #[arg(long, default_value_t = 100)]
    batch_window_ms: u64,

    /// The most IDs in one batched request.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..=1000))]
    batch_max_size: u64,

    /// Serve Prometheus metrics (/metrics) and health (/healthz, /readyz) on this address.
    #[arg(long)]
    http_endpoint: Option<SocketAddr>,

    /// This node's ID as the controller knows it: the EC2 instance ID (node and all modes;
    /// --embedded-ec2 registers one).
    #[arg(long, env = "CSI_NODE_ID", default_value = "")]
    node_id: String,

    /// This node's availability zone, reported as topology.
    #[arg(long, env = "AWS_AVAILABILITY_ZONE")]
    zone: Option<String>,

    /// How many EBS volumes may be attached to a node: NodeGetInfo's max_volumes_per_node,
    /// and the controller refuses (ResourceExhausted) to attach more. The default is the
    /// Nitro budget of 28 attachments less the root volume and two network interfaces.
    #[arg(long, default_value_t = 25, value_parser = clap::value_parser!(i64).range(1..))]
    volume_attach_limit: i64,

    /// Seconds an attachment may stay `attaching` before it is undone (detached, not forced).
    #[arg(long, default_value_t = 90)]
    attach_timeout_secs: u64,

    /// Seconds ControllerUnpublish waits for a detach before it reports DeadlineExceeded.
    #[arg(long, default_value_t = 120)]
    detach_timeout_secs: u64,

    /// Tags for every volume the driver creates, key=value (repeatable).
    #[arg(long = "extra-tag", value_parser = parse_kv)]
    extra_tags: Vec<(String, String)>,

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

fn parse_kv(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("'{s}' is not key=value"))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let f = Flags::parse();
    let embedded_timing = f
        .embedded_timing
        .parse()
        .map_err(|e| anyhow::anyhow!("--embedded-timing: {e}"))?;
    let config = DriverConfig {
        endpoint: f.endpoint,
        mode: f.mode,
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
            max_volumes_per_node: f.volume_attach_limit,
        },
        controller: ControllerConfig {
            default_zone: None,
            extra_tags: f.extra_tags.into_iter().collect::<BTreeMap<_, _>>(),
            publish: PublishConfig {
                attach_timeout: Duration::from_secs(f.attach_timeout_secs),
                detach_timeout: Duration::from_secs(f.detach_timeout_secs),
                attach_limit: usize::try_from(f.volume_attach_limit).ok(),
                ..PublishConfig::default()
            },
        },
        aws: AwsConfig {
            region: f.region,
            endpoint: f.ec2_endpoint,
            batching: BatchConfig {
                enabled: f.batching,
                window: Duration::from_millis(f.batch_window_ms),
                max_size: usize::try_from(f.batch_max_size).unwrap_or(200),
            },
            ..AwsConfig::default()
        },
        embedded_ec2: f.embedded_ec2,
        embedded_timing,
        http_endpoint: f.http_endpoint,
    };
    ebs_driver::run(config, shutdown_signal())
        .await
        .context("ebs-csi-driver")
}

/// SIGTERM (kubelet, systemd) or Ctrl-C.
async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch SIGTERM; only Ctrl-C stops the driver");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = term => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tracing::info!("shutting down");
}
