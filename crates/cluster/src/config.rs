//! Flags ([`Flags`]: `up`, `down`, `status`) and what `up` runs with ([`UpConfig`]).

use std::path::PathBuf;
use std::str::FromStr;

use clap::{Parser, Subcommand};

use crate::Error;

/// Where the cluster keeps its state unless `--data-dir` says otherwise. `up` needs root
/// anyway (loop devices, mounts), so the default is root's place for service state.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/csi-cluster";

/// The API server's port when it is free (kube-apiserver's); else any free port.
pub const DEFAULT_PORT: u16 = 6443;

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
    /// Measure pod-volume-ready latency, API writes per pod, provisioning throughput and each
    /// component's memory, per scenario, on throw-away clusters.
    Bench(crate::bench::BenchFlags),
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

/// The kubelet's default --max-pods.
pub const DEFAULT_MAX_PODS: u32 = 110;

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

/// Which side of the cluster migrated in-tree aws-ebs to `ebs.csi.aws.com` (the migration design).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Migration {
    /// PV controller and attach/detach controller (kube-controller-manager's gate).
    pub controller: bool,
    /// Every node agent (the kubelet's gate).
    pub node: bool,
}

impl Default for Migration {
    /// Today's Kubernetes: CSIMigrationAWS is GA and locked on everywhere.
    fn default() -> Self {
        Self {
            controller: true,
            node: true,
        }
    }
}

impl Migration {
    /// `--feature-gates` for one side: kube-controller-manager's and the kubelet's v1.26
    /// migration gates (every GA one on; cinder, whose gate v1.26 removed, migrated too;
    /// Portworx off), with `CSIMigrationAWS` as `on` says. `CSIMigrationAWS=false` is what
    /// the migration design's walkthroughs start from; v1.26 itself refuses it (locked to true).
    pub fn gates(on: bool) -> &'static str {
        if on {
            "CSIMigrationAWS=true,CSIMigrationGCE=true,CSIMigrationAzureDisk=true,\
             CSIMigrationAzureFile=true,CSIMigrationvSphere=true,CSIMigrationOpenStack=true,\
             CSIMigrationPortworx=false"
        } else {
            "CSIMigrationAWS=false,CSIMigrationGCE=true,CSIMigrationAzureDisk=true,\
             CSIMigrationAzureFile=true,CSIMigrationvSphere=true,CSIMigrationOpenStack=true,\
             CSIMigrationPortworx=false"
        }
    }
}

impl FromStr for Migration {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (plugin, sides) = s
            .split_once('=')
            .ok_or_else(|| format!("{s:?} is not PLUGIN=SIDES (e.g. aws-ebs=controller,node)"))?;
        if plugin.trim() != "aws-ebs" {
            return Err(format!(
                "{plugin:?}: only aws-ebs can be migrated (the only in-tree plugin left)"
            ));
        }
        let mut m = Migration {
            controller: false,
            node: false,
        };
        for side in sides.split(',').map(str::trim) {
            match side {
                "controller" => m.controller = true,
                "node" => m.node = true,
                "none" | "" => {}
                other => {
                    return Err(format!("{other:?} is not one of controller, node, none"));
                }
            }
        }
        Ok(m)
    }
}

impl std::fmt::Display for Migration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sides = match (self.controller, self.node) {
            (true, true) => "controller,node",
            (true, false) => "controller",
            (false, true) => "node",
            (false, false) => "none",
        };
        write!(f, "aws-ebs={sides}")
    }
}

/// The migration gates as they are now: the controller side's and each node's. Components
/// read it when they start, so a change takes effect with their restart (the migration design's
/// upgrade: controller first, then node by node, each drained before).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationState {
    pub controller: bool,
    pub nodes: Vec<bool>,
}

impl MigrationState {
    /// Every node as `m.node`.
    pub fn new(m: Migration, nodes: usize) -> Self {
        Self {
            controller: m.controller,
            nodes: vec![m.node; nodes],
        }
    }

    /// Node `i`'s gate (off for a node it does not know).
    pub fn node(&self, i: usize) -> bool {
        self.nodes.get(i).copied().unwrap_or(false)
    }
}

/// Shared between the running cluster and the components' factories.
pub(crate) type SharedMigration = std::sync::Arc<std::sync::RwLock<MigrationState>>;

/// What [`crate::up`] runs with.
#[derive(Debug, Clone)]
pub struct UpConfig {
    pub nodes: usize,
    pub data_dir: PathBuf,
    pub ephemeral: bool,
    pub timing: ec2_sim::Timing,
    pub migration: Migration,
    /// How many zones the nodes are spread over (1 to 3).
    pub zones: usize,
    pub skip_attach: volume_plugins::SkipAttachMode,
    pub hostpath_attach_required: bool,
    /// `--driver NAME=COMMAND`, as given (parsed by the component that runs them).
    pub drivers: Vec<String>,
    pub attach_required: bool,
    /// Per-node csi-provisioners for the `--driver` drivers.
    pub driver_node_deployment: bool,
    pub background: bool,
    /// Keep apiserver-lite's audit record of every request (`bench` counts writes per pod
    /// with it); off for `up`, where nobody reads it and it would only grow.
    pub audit: bool,
    pub kubeconfig_out: Option<PathBuf>,
    /// `None`: [`DEFAULT_PORT`] if free, else any; `Some(0)`: any.
    pub port: Option<u16>,
    pub verbosity: u8,
    /// Each node's pod capacity (the node agents' --max-pods).
    pub max_pods: u32,
    /// `csi-cluster chaos`: a fault proxy ([`csi_spec::faults`]) in front of every driver
    /// socket, failing what this plan names; `None` (the default) leaves the sockets direct.
    pub csi_faults: Option<csi_spec::faults::FaultPlan>,
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

impl UpConfig {
    /// `--nodes N` with everything else at its default, under `data_dir`.
    pub fn new(nodes: usize, data_dir: impl Into<PathBuf>) -> Self {
        Self {
            nodes,
            data_dir: data_dir.into(),
            ephemeral: false,
            timing: ec2_sim::Timing::Fast,
            migration: Migration::default(),
            zones: 3,
            skip_attach: volume_plugins::SkipAttachMode::default(),
            hostpath_attach_required: false,
            drivers: Vec::new(),
            attach_required: false,
            driver_node_deployment: false,
            background: false,
            audit: false,
            kubeconfig_out: None,
            port: None,
            verbosity: 0,
            max_pods: DEFAULT_MAX_PODS,
            csi_faults: None,
        }
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
    fn migration_sides_parse_and_print() {
        for (text, controller, node) in [
            ("aws-ebs=controller,node", true, true),
            ("aws-ebs=controller", true, false),
            ("aws-ebs=node", false, true),
            ("aws-ebs=none", false, false),
        ] {
            let m: Migration = text.parse().unwrap();
            assert_eq!((m.controller, m.node), (controller, node), "{text}");
            assert_eq!(m.to_string(), text);
        }
        assert!("gce-pd=node".parse::<Migration>().is_err());
        assert!("aws-ebs=kubelet".parse::<Migration>().is_err());
        assert!("aws-ebs".parse::<Migration>().is_err());
    }

    #[test]
    fn gates_are_kubernetes_v1_26s_with_aws_as_asked() {
        use volume_plugins::MigratedPlugins;
        let on = MigratedPlugins::from_feature_gates(Migration::gates(true)).unwrap();
        assert_eq!(on, MigratedPlugins::kubernetes_v1_26());
        let off = MigratedPlugins::from_feature_gates(Migration::gates(false)).unwrap();
        assert!(!off.contains("kubernetes.io/aws-ebs"));
        assert_eq!(
            off.with_feature_gates("CSIMigrationAWS=true").unwrap(),
            MigratedPlugins::kubernetes_v1_26()
        );
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
