//! `ebs-csi-driver`: flags into a config, then the library's `run`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use ebs_driver::{DriverConfig, IdentityConfig, NodeConfig, NodeInfo};

/// The AWS EBS CSI driver (node service). Serves csi.v1.Identity and csi.v1.Node on a unix
/// socket for kubelet: finds the attached EBS device (verifying its identity), formats blank
/// volumes, checks and mounts filesystems, bind-mounts them into pods.
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

    /// The CSI driver name (GetPluginInfo); PVs and the CSIDriver object refer to it.
    #[arg(long, default_value = ebs_driver::identity::DEFAULT_DRIVER_NAME)]
    driver_name: String,

    /// This node's ID as the controller knows it: the EC2 instance ID.
    #[arg(long, env = "CSI_NODE_ID")]
    node_id: String,

    /// This node's availability zone, reported as topology (omit to report none).
    #[arg(long, env = "AWS_AVAILABILITY_ZONE")]
    zone: Option<String>,

    /// How many EBS volumes may be attached to this node (NodeGetInfo max_volumes_per_node).
    /// The default is the usual Nitro budget of 28 attachments less the root volume and two
    /// network interfaces.
    #[arg(long, default_value_t = 25, value_parser = clap::value_parser!(i64).range(1..))]
    volume_attach_limit: i64,

    /// Where device nodes and udev links live.
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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let f = Flags::parse();
    let config = DriverConfig {
        endpoint: f.endpoint,
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
