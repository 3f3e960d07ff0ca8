//! The command line: the Go csi-driver-host-path's flag names and dashed ones, into a
//! [`Config`]. `main` only parses, logs and runs.

use std::path::PathBuf;

use clap::Parser;

use crate::{Config, DEFAULT_DRIVER_NAME, parse_quantity};

/// A node-local CSI driver: mount volumes are directories under the state directory, block
/// volumes sparse files behind loop devices. Serves csi.v1.Identity, Controller (ControllerPublish
/// only with --enable-attach: nothing to attach) and Node on a unix socket.
///
/// Takes the Go csi-driver-host-path's flag names (`--nodeid`, `--drivername`, `--statedir`,
/// `--maxvolumespernode`) as well as dashed ones, with one or two dashes.
#[derive(Debug, Parser)]
#[command(name = "hostpath-csi-driver", version)]
pub struct Flags {
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

impl Flags {
    /// The flags of this process (Go's single-dash forms normalized first).
    pub fn from_args() -> Self {
        Self::parse_from(telemetry::normalize_go_args(std::env::args_os()))
    }

    /// klog's `-v`: the library and this binary at that level (the binary's own target is
    /// not in telemetry's list of ours).
    pub fn init_logging(&self) {
        let level = telemetry::level_for_verbosity(self.verbosity)
            .as_str()
            .to_ascii_lowercase();
        let bin = format!("hostpath_csi_driver={level}");
        telemetry::init_logging_with(self.verbosity, telemetry::LogFormat::Text, &[&bin]);
    }

    /// The driver's config.
    pub fn into_config(self) -> Config {
        Config {
            endpoint: self.endpoint,
            driver_name: self.driver_name,
            node_id: self.node_id,
            state_dir: self.state_dir,
            capacity_bytes: self.capacity,
            max_volumes_per_node: self.max_volumes_per_node,
            stage_unstage: self.stage_unstage,
            sys_root: self.sys_root,
            enable_attach: self.enable_attach,
            ..Config::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(args: &[&str]) -> Config {
        let args = std::iter::once("hostpath-csi-driver").chain(args.iter().copied());
        Flags::try_parse_from(telemetry::normalize_go_args(args.map(Into::into)))
            .expect("flags parse")
            .into_config()
    }

    #[test]
    fn go_names_and_dashed_names_fill_the_same_config() {
        let go = config(&[
            "-nodeid=n1",
            "-drivername=d.example.com",
            "-statedir=/data",
            "-maxvolumespernode=5",
            "--capacity=1Gi",
            "--stage-unstage=false",
        ]);
        assert_eq!(go.node_id, "n1");
        assert_eq!(go.driver_name, "d.example.com");
        assert_eq!(go.state_dir, PathBuf::from("/data"));
        assert_eq!(go.max_volumes_per_node, 5);
        assert_eq!(go.capacity_bytes, 1 << 30);
        assert!(!go.stage_unstage && !go.enable_attach);
        let dashed = config(&["--node-id", "n1", "--state-dir=/data", "--enable-attach"]);
        assert_eq!(
            (dashed.node_id.as_str(), dashed.state_dir),
            ("n1", go.state_dir)
        );
        assert_eq!(dashed.driver_name, DEFAULT_DRIVER_NAME);
        assert!(dashed.stage_unstage && dashed.enable_attach);
    }
}
