//! `hostpath-csi-driver`: flags into a config, then the library's `run`.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use hostpath_driver::{Config, DEFAULT_DRIVER_NAME, parse_quantity};

/// A node-local CSI driver: mount volumes are directories under the state directory, block
/// volumes sparse files behind loop devices. Serves csi.v1.Identity, Controller (ControllerPublish
/// only with --enable-attach: nothing to attach) and Node on a unix socket.
///
/// Takes the Go csi-driver-host-path's flag names (`--nodeid`, `--drivername`, `--statedir`,
/// `--maxvolumespernode`) as well as dashed ones, with one or two dashes.
#[derive(Debug, Parser)]
#[command(name = "hostpath-csi-driver", version)]
struct Flags {
    /// CSI endpoint: unix:///path/to/csi.sock, unix:/path or a plain path.
    #[arg(long, env = "CSI_ENDPOINT", default_value = "unix:///csi/csi.sock")]
    endpoint: String,

    /// This node's ID: NodeGetInfo's node_id and the topology value of every volume.
    #[arg(long = "node-id", alias = "nodeid", env = "KUBE_NODE_NAME")]
    node_id: String,

    /// The CSI driver name (GetPluginInfo).
    #[arg(long = "drivername", alias = "driver-name", default_value = DEFAULT_DRIVER_NAME)]
    driver_name: String,

    /// Directory for volumes, snapshots and the state file.
    #[arg(
        long = "state-dir",
        alias = "statedir",
        default_value = "/csi-data-dir"
    )]
    state_dir: PathBuf,

    /// NodeGetInfo's max_volumes_per_node; 0 leaves it unset.
    #[arg(long = "max-volumes-per-node", alias = "maxvolumespernode", default_value_t = 0,
          value_parser = clap::value_parser!(i64).range(0..))]
    max_volumes_per_node: i64,

    /// Total bytes all volumes may take (`107374182400`, `100Gi`, `500G`).
    #[arg(long, default_value = "100Gi", value_parser = parse_quantity)]
    capacity: u64,

    /// Offer STAGE_UNSTAGE_VOLUME (`--stage-unstage=false` publishes straight from the volume).
    #[arg(long, default_value_t = true, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", action = clap::ArgAction::Set)]
    stage_unstage: bool,

    /// Where sysfs is mounted (loop devices' backing files, device sizes).
    #[arg(long, default_value = "/sys")]
    sys_root: PathBuf,

    /// Offer ControllerPublish/Unpublish (for a CSIDriver with attachRequired: true). Nothing is
    /// attached: publishing checks that the node is the volume's node.
    #[arg(long)]
    enable_attach: bool,

    /// klog verbosity: 0-3 info, 4 debug, 5 and more trace (RUST_LOG overrides).
    #[arg(long = "v", default_value_t = 0)]
    verbosity: u8,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let f = Flags::parse_from(telemetry::normalize_go_args(std::env::args_os()));
    // The binary's own target is not in telemetry's list of ours; raise it with the library.
    let level = telemetry::level_for_verbosity(f.verbosity)
        .as_str()
        .to_ascii_lowercase();
    let bin = format!("hostpath_csi_driver={level}");
    telemetry::init_logging_with(f.verbosity, telemetry::LogFormat::Text, &[&bin]);
    let config = Config {
        endpoint: f.endpoint,
        driver_name: f.driver_name,
        node_id: f.node_id,
        state_dir: f.state_dir,
        capacity_bytes: f.capacity,
        max_volumes_per_node: f.max_volumes_per_node,
        stage_unstage: f.stage_unstage,
        sys_root: f.sys_root,
        enable_attach: f.enable_attach,
        ..Config::default()
    };
    // SIGTERM (kubelet, systemd) or SIGINT: stop serving and remove the socket.
    let shutdown = telemetry::shutdown_on_signals();
    hostpath_driver::run(config, shutdown.cancelled_owned())
        .await
        .context("hostpath-csi-driver")
}
