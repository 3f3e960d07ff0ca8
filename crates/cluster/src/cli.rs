//! The command line: [`Flags`] with the `up`, `down`, `status`, `demo` and `chaos`
//! subcommands, and the checks that turn `up`'s flags into an [`UpConfig`]. The top of the
//! crate's module graph: it names every subcommand's flags; nothing but `main` imports it.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::Error;
use crate::config::{DEFAULT_DATA_DIR, DEFAULT_MAX_PODS, Migration, UpConfig};

/// csi-cluster: the Kubernetes CSI storage stack in one process, driven with kubectl.
#[derive(Parser, Debug, Clone)]
#[command(name = "csi-cluster", version, about, long_about = None)]
pub struct Flags {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug, Clone)]
pub enum Command {
    /// Run the cluster in the foreground until Ctrl-C or SIGTERM (`csi-cluster down`).
    Up(UpFlags),
    /// Stop the cluster running on the data dir (SIGTERM to its pid file) and wait for it.
    Down(DownFlags),
    /// Print nodes, drivers, attached and mounted volumes, claims and stuck operations.
    Status(StatusFlags),
    /// Walk volumes through the whole lifecycle on a throw-away cluster, printing each step
    /// with its time and what it proves (`demo migration`: the upgrade and downgrade of the
    /// migration design, docs/design/migration.md).
    Demo(crate::demo::DemoFlags),
    /// Moved: the whole-stack benchmark is `csi-bench stack` (docs/csi-bench/stack.md). Kept,
    /// hidden, to say so to whoever runs the old command.
    #[command(hide = true)]
    Bench {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// A randomized fault test: a seeded schedule of workload operations, CSI and EC2 faults
    /// and component kills on a throw-away cluster, with storage-safety invariants checked
    /// all along; exits non-zero on a violation (docs/chaos.md).
    Chaos(crate::chaos::ChaosFlags),
}

#[derive(clap::Args, Debug, Clone)]
pub struct UpFlags {
    /// How many nodes (each: an EC2 instance, a node agent, the EBS and hostpath drivers).
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub nodes: usize,

    /// State (API objects, EC2 volumes, kubelet dirs), logs, sockets and the kubeconfig.
    #[arg(long, default_value = DEFAULT_DATA_DIR, value_name = "DIR")]
    pub data_dir: PathBuf,

    /// Remove the data dir when the cluster stops (a throw-away cluster).
    #[arg(long)]
    pub ephemeral: bool,

    /// How long EC2 state changes take: fast (tens of ms) or realistic (AWS's medians:
    /// attach 1-4 s, create ~1.5 s).
    #[arg(long, default_value = "fast", value_name = "fast|realistic")]
    pub timing: ec2_sim::Timing,

    /// In-tree aws-ebs → ebs.csi.aws.com migration (CSIMigrationAWS): on the controller side
    /// (PV controller, attach/detach controller), on the nodes, both or none.
    #[arg(
        long,
        default_value = "aws-ebs=controller,node",
        value_name = "aws-ebs=controller,node|controller|node|none"
    )]
    pub migration: Migration,

    /// How many of the region's zones (a, b, c) the nodes are spread over, round robin. An EBS
    /// volume lives in one zone, so it can move only between nodes of that zone: `--zones 1`
    /// puts every node in us-east-1a.
    #[arg(long, default_value_t = 3, value_name = "1-3")]
    pub zones: usize,

    /// How volumes of drivers with `attachRequired: false` are handled: bypass-adc (today's
    /// Kubernetes: no attach/detach controller involvement) or through-adc (the skip-attach design
    /// as written in 2018, docs/design/skip-attach.md: a no-op attach in the attach/detach
    /// controller, no VolumeAttachment). Both the attach/detach controller and the node agents get
    /// it.
    #[arg(
        long,
        default_value = "bypass-adc",
        value_name = "bypass-adc|through-adc"
    )]
    pub skip_attach: volume_plugins::SkipAttachMode,

    /// The built-in hostpath driver's CSIDriver says `attachRequired: true` (the driver then
    /// offers ControllerPublish and a csi-attacher serves its VolumeAttachments).
    #[arg(long)]
    pub hostpath_attach_required: bool,

    /// Run another CSI driver: COMMAND (run by `sh -c`) once as the controller plugin and once
    /// per node, each on its own socket. Placeholders in COMMAND: {endpoint} (unix://...
    /// socket), {node} (node name; "controller" for the controller plugin), {mode}
    /// (controller|node), {state-dir} (a directory of its own under DATA_DIR/drivers).
    /// Repeatable. It gets a CSIDriver and a StorageClass named NAME.
    #[arg(long = "driver", value_name = "NAME=COMMAND")]
    pub drivers: Vec<String>,

    /// The `--driver` drivers' CSIDrivers say `attachRequired: true` (a csi-attacher per
    /// driver serves their VolumeAttachments through the controller plugin); default false.
    #[arg(long)]
    pub attach_required: bool,

    /// The `--driver` drivers are node-local (like hostpath): each node runs a csi-provisioner
    /// against its own node plugin for the claims whose selected node it is. Default: one
    /// csi-provisioner against the controller plugin.
    #[arg(long)]
    pub driver_node_deployment: bool,

    /// Start in the background: return once the cluster is ready, leaving it running (stop it
    /// with `csi-cluster down`); its output goes to DATA_DIR/logs/up.out.
    #[arg(long)]
    pub background: bool,

    /// Also write the kubeconfig here (it is always at DATA_DIR/kubeconfig).
    #[arg(long, value_name = "PATH")]
    pub kubeconfig_out: Option<PathBuf>,

    /// The API server's port on 127.0.0.1; 0 picks a free one. Default: 6443 if free, else
    /// any free port.
    #[arg(long, value_name = "PORT")]
    pub port: Option<u16>,

    /// Pods each node can run (its `status.capacity.pods`), as the kubelet's --max-pods.
    #[arg(long, default_value_t = DEFAULT_MAX_PODS, value_name = "N")]
    pub max_pods: u32,

    /// Log verbosity of the components (klog levels: 4 debug, 5 trace).
    #[arg(short = 'v', long = "v", default_value_t = 0, value_name = "LEVEL")]
    pub v: u8,
}

#[derive(clap::Args, Debug, Clone)]
pub struct DownFlags {
    #[arg(long, default_value = DEFAULT_DATA_DIR, value_name = "DIR")]
    pub data_dir: PathBuf,

    /// How long to wait for the cluster to stop, in seconds.
    #[arg(long, default_value_t = 120, value_name = "SECONDS")]
    pub timeout: u64,
}

#[derive(clap::Args, Debug, Clone)]
pub struct StatusFlags {
    #[arg(long, default_value = DEFAULT_DATA_DIR, value_name = "DIR")]
    pub data_dir: PathBuf,

    /// text or json.
    #[arg(long, short = 'o', default_value = "text", value_name = "text|json")]
    pub output: String,
}

impl UpFlags {
    /// The checked [`UpConfig`].
    pub fn config(&self) -> Result<UpConfig, Error> {
        if self.nodes == 0 || self.nodes > 100 {
            return Err(Error::Config(format!(
                "--nodes must be between 1 and 100, got {}",
                self.nodes
            )));
        }
        if !(1..=3).contains(&self.zones) {
            return Err(Error::Config(format!(
                "--zones must be 1, 2 or 3 (us-east-1a..c), got {}",
                self.zones
            )));
        }
        crate::require_real_timing(self.timing)?;
        crate::external::parse_all(&self.drivers)?;
        if self.max_pods == 0 {
            return Err(Error::Config(
                "--max-pods must be at least 1: a node that can run no pod is not a node".into(),
            ));
        }
        if self.drivers.is_empty() {
            for (set, flag) in [
                (self.attach_required, "--attach-required"),
                (self.driver_node_deployment, "--driver-node-deployment"),
            ] {
                if set {
                    return Err(Error::Config(format!(
                        "{flag} is about the --driver drivers, and there is none (for the built-in hostpath driver: --hostpath-attach-required)"
                    )));
                }
            }
        }
        Ok(UpConfig {
            nodes: self.nodes,
            data_dir: self.data_dir.clone(),
            ephemeral: self.ephemeral,
            timing: self.timing,
            migration: self.migration,
            zones: self.zones,
            skip_attach: self.skip_attach,
            hostpath_attach_required: self.hostpath_attach_required,
            drivers: self.drivers.clone(),
            attach_required: self.attach_required,
            driver_node_deployment: self.driver_node_deployment,
            background: self.background,
            audit: false,
            kubeconfig_out: self.kubeconfig_out.clone(),
            port: self.port,
            verbosity: self.v,
            max_pods: self.max_pods,
            csi_faults: None,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn parse(args: &[&str]) -> Flags {
        Flags::try_parse_from(std::iter::once("csi-cluster").chain(args.iter().copied()))
            .expect("parses")
    }

    #[test]
    fn up_defaults_and_checks() {
        let Command::Up(up) = parse(&["up"]).command else {
            panic!("not up");
        };
        let c = up.config().unwrap();
        assert_eq!(c.nodes, 3);
        assert_eq!(c.data_dir, PathBuf::from(DEFAULT_DATA_DIR));
        assert_eq!(c.migration, Migration::default());
        assert_eq!(c.timing, ec2_sim::Timing::Fast);
        let Command::Up(up) = parse(&["up", "--nodes", "0"]).command else {
            panic!("not up");
        };
        assert!(up.config().unwrap_err().to_string().contains("--nodes"));
        let Command::Up(up) =
            parse(&["up", "--timing", "realistic", "--migration", "aws-ebs=none"]).command
        else {
            panic!("not up");
        };
        let c = up.config().unwrap();
        assert_eq!(c.timing, ec2_sim::Timing::Realistic);
        assert!(!c.migration.controller && !c.migration.node);
        let Command::Up(up) = parse(&["up", "--attach-required"]).command else {
            panic!("not up");
        };
        let e = up.config().unwrap_err().to_string();
        assert!(
            e.contains("--attach-required is about the --driver drivers"),
            "{e}"
        );
        let Command::Up(up) =
            parse(&["up", "--driver", "a.example.com=d", "--attach-required"]).command
        else {
            panic!("not up");
        };
        let c = up.config().unwrap();
        assert!(c.attach_required);
        assert_eq!(c.drivers, vec!["a.example.com=d".to_string()]);
        let Command::Up(up) = parse(&["up", "--driver", "A=d"]).command else {
            panic!("not up");
        };
        assert!(
            up.config()
                .unwrap_err()
                .to_string()
                .contains("--driver A=d: NAME")
        );
    }
}
