//! What `up` runs with ([`UpConfig`]), the migration sides and the defaults the flags share.
//! A leaf: the command line that fills it is in `cli`.

use std::path::PathBuf;
use std::str::FromStr;

/// Where the cluster keeps its state unless `--data-dir` says otherwise. `up` needs root
/// anyway (loop devices, mounts), so the default is root's place for service state.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/csi-cluster";

/// The API server's port when it is free (kube-apiserver's); else any free port.
pub const DEFAULT_PORT: u16 = 6443;

/// The kubelet's default --max-pods.
pub const DEFAULT_MAX_PODS: u32 = 110;

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
    /// Keep apiserver-lite's audit record of every request (`csi-bench stack` counts writes per pod
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
}
