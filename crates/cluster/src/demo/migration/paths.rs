//! Which path served each volume operation, in-tree or CSI, told from counters the components
//! keep ("Migration Shim Testing" in the migration design, docs/design/migration.md: the driver
//! serves the operations and none of the in-tree code is called, or the other way round).
//!
//! In-tree: the aws-ebs plugin's EC2 client shared by the PV controller and the attach/detach
//! controller (kube-controller-manager's cloud provider) and, on the node, the plugin's own
//! staging mounts (`plugins/kubernetes.io/aws-ebs/mounts/...`; the node agent keeps no
//! per-plugin counter). CSI: the EBS driver's RPC counts, controller and per node.

use std::fmt;
use std::path::Path as FsPath;

use crate::RunningCluster;

/// The volume operations the migration design splits between the two paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Op {
    Provision,
    Attach,
    Mount,
    Unmount,
    Detach,
    Delete,
}

impl Op {
    pub const ALL: [Op; 6] = [
        Op::Provision,
        Op::Attach,
        Op::Mount,
        Op::Unmount,
        Op::Detach,
        Op::Delete,
    ];

    fn name(self) -> &'static str {
        match self {
            Op::Provision => "provision",
            Op::Attach => "attach",
            Op::Mount => "mount",
            Op::Unmount => "unmount",
            Op::Detach => "detach",
            Op::Delete => "delete",
        }
    }

    /// What counts on the in-tree side and on the CSI side.
    fn evidence(self) -> (&'static str, &'static str) {
        match self {
            Op::Provision => ("EC2 CreateVolume", "CreateVolume"),
            Op::Attach => ("EC2 AttachVolume", "ControllerPublishVolume"),
            Op::Mount => ("aws-ebs staging mount", "NodeStageVolume"),
            Op::Unmount => ("aws-ebs staging unmount", "NodeUnstageVolume"),
            Op::Detach => ("EC2 DetachVolume", "ControllerUnpublishVolume"),
            Op::Delete => ("EC2 DeleteVolume", "DeleteVolume"),
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Who did an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    InTree,
    Csi,
    /// Nobody (not asked for, or refused).
    Neither,
    /// Both paths: what the migration design's sync between the controller and the node rules out.
    Both,
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Path::InTree => "in-tree",
            Path::Csi => "CSI",
            Path::Neither => "nobody",
            Path::Both => "BOTH",
        })
    }
}

/// The counters at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts {
    /// The in-tree plugin's EC2 calls: CreateVolume, AttachVolume, DetachVolume, DeleteVolume.
    in_tree_ec2: [u64; 4],
    /// In-tree staging mounts (one per volume mounted in-tree on any node).
    in_tree_mounts: u64,
    /// The EBS controller service's RPCs: CreateVolume, ControllerPublishVolume,
    /// ControllerUnpublishVolume, DeleteVolume.
    csi_controller: [u64; 4],
    /// The EBS controller service's own EC2 calls, same actions as `in_tree_ec2`.
    csi_ec2: [u64; 4],
    /// Every node's EBS driver: NodeStageVolume, NodeUnstageVolume, NodePublishVolume,
    /// NodeUnpublishVolume.
    csi_node: [u64; 4],
}

const EC2_ACTIONS: [&str; 4] = [
    "CreateVolume",
    "AttachVolume",
    "DetachVolume",
    "DeleteVolume",
];
const CONTROLLER_RPCS: [&str; 4] = [
    "CreateVolume",
    "ControllerPublishVolume",
    "ControllerUnpublishVolume",
    "DeleteVolume",
];
const NODE_RPCS: [&str; 4] = [
    "NodeStageVolume",
    "NodeUnstageVolume",
    "NodePublishVolume",
    "NodeUnpublishVolume",
];

/// The in-tree aws-ebs plugin's staging directory below a kubelet root.
const IN_TREE_STAGING: &str = "/plugins/kubernetes.io/aws-ebs/mounts/";

impl Counts {
    /// The cluster's counters now.
    pub fn of(cluster: &RunningCluster) -> Counts {
        let in_tree = cluster.in_tree_ec2_metrics();
        let driver = cluster.ebs_controller_metrics();
        let mut c = Counts {
            in_tree_ec2: EC2_ACTIONS.map(|a| in_tree.calls(a)),
            in_tree_mounts: in_tree_mounts_below(cluster.data_dir()),
            csi_controller: CONTROLLER_RPCS.map(|m| driver.rpc.calls(m)),
            csi_ec2: EC2_ACTIONS.map(|a| driver.ec2.calls(a)),
            csi_node: [0; 4],
        };
        for node in cluster.node_names() {
            if let Some(m) = cluster.ebs_node_metrics(&node) {
                for (sum, rpc) in c.csi_node.iter_mut().zip(NODE_RPCS) {
                    *sum += m.rpc.calls(rpc);
                }
            }
        }
        c
    }

    /// Who did `op` between `before` and `self`.
    pub fn served_since(&self, before: &Counts, op: Op) -> Served {
        let d = |a: u64, b: u64| a.saturating_sub(b);
        let (in_tree, csi, csi_ec2) = match op {
            Op::Provision => (
                d(self.in_tree_ec2[0], before.in_tree_ec2[0]),
                d(self.csi_controller[0], before.csi_controller[0]),
                d(self.csi_ec2[0], before.csi_ec2[0]),
            ),
            Op::Attach => (
                d(self.in_tree_ec2[1], before.in_tree_ec2[1]),
                d(self.csi_controller[1], before.csi_controller[1]),
                d(self.csi_ec2[1], before.csi_ec2[1]),
            ),
            Op::Detach => (
                d(self.in_tree_ec2[2], before.in_tree_ec2[2]),
                d(self.csi_controller[2], before.csi_controller[2]),
                d(self.csi_ec2[2], before.csi_ec2[2]),
            ),
            Op::Delete => (
                d(self.in_tree_ec2[3], before.in_tree_ec2[3]),
                d(self.csi_controller[3], before.csi_controller[3]),
                d(self.csi_ec2[3], before.csi_ec2[3]),
            ),
            Op::Mount => (
                d(self.in_tree_mounts, before.in_tree_mounts),
                d(self.csi_node[0], before.csi_node[0]),
                0,
            ),
            Op::Unmount => (
                d(before.in_tree_mounts, self.in_tree_mounts),
                d(self.csi_node[1], before.csi_node[1]),
                0,
            ),
        };
        Served {
            op,
            in_tree,
            csi,
            csi_ec2,
        }
    }

    /// Every operation between `before` and `self`.
    pub fn all_since(&self, before: &Counts) -> Vec<Served> {
        Op::ALL
            .iter()
            .map(|op| self.served_since(before, *op))
            .collect()
    }
}

/// One operation's counts between two moments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Served {
    pub op: Op,
    /// In-tree EC2 calls (or in-tree staging mounts made/removed).
    pub in_tree: u64,
    /// The driver's RPCs for it.
    pub csi: u64,
    /// The driver's own EC2 calls for it (controller operations only).
    pub csi_ec2: u64,
}

impl Served {
    pub fn path(&self) -> Path {
        match (self.in_tree > 0, self.csi > 0) {
            (true, true) => Path::Both,
            (true, false) => Path::InTree,
            (false, true) => Path::Csi,
            (false, false) => Path::Neither,
        }
    }
}

impl fmt::Display for Served {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (in_tree, csi) = self.op.evidence();
        write!(
            f,
            "{:<9} {:<7} (in-tree {in_tree} ×{}; driver {csi} ×{}",
            self.op.name(),
            self.path().to_string(),
            self.in_tree,
            self.csi
        )?;
        if self.csi_ec2 > 0 {
            write!(f, ", its EC2 calls ×{}", self.csi_ec2)?;
        }
        f.write_str(")")
    }
}

/// The operations someone did, for printing: `attach CSI (...)`, one per line.
pub fn describe(served: &[Served]) -> Vec<String> {
    served
        .iter()
        .filter(|s| s.path() != Path::Neither)
        .map(ToString::to_string)
        .collect()
}

/// The path of `op` in `served` (`Neither` when not listed).
pub fn path_of(served: &[Served], op: Op) -> Path {
    served
        .iter()
        .find(|s| s.op == op)
        .map_or(Path::Neither, Served::path)
}

/// In-tree aws-ebs staging mounts below `dir` (every node's kubelet root is below the data
/// dir).
fn in_tree_mounts_below(dir: &FsPath) -> u64 {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    count_in_tree_mounts(&mountinfo, &dir.to_string_lossy())
}

fn count_in_tree_mounts(mountinfo: &str, root: &str) -> u64 {
    let n = mountinfo
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4))
        .filter(|p| p.starts_with(root) && p.contains(IN_TREE_STAGING))
        .count();
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// Which plugin a pod's volume path belongs to: the node agent puts an in-tree aws-ebs volume
/// under `volumes/kubernetes.io~aws-ebs/` and a CSI one under `volumes/kubernetes.io~csi/`.
pub fn mount_path_kind(volume_path: &FsPath) -> Path {
    let p = volume_path.to_string_lossy();
    match (
        p.contains("/kubernetes.io~aws-ebs/"),
        p.contains("/kubernetes.io~csi/"),
    ) {
        (true, false) => Path::InTree,
        (false, true) => Path::Csi,
        (true, true) => Path::Both,
        (false, false) => Path::Neither,
    }
}

/// Which plugin a node status `volumesAttached` name belongs to.
pub fn attached_name_kind(name: &str) -> Path {
    if name.starts_with("kubernetes.io/aws-ebs/") {
        Path::InTree
    } else if name.starts_with("kubernetes.io/csi/") {
        Path::Csi
    } else {
        Path::Neither
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_path_is_whoever_counted() {
        let before = Counts::default();
        let mut after = before.clone();
        after.in_tree_ec2[1] = 1; // AttachVolume
        after.csi_node[0] = 1; // NodeStageVolume
        after.csi_controller[0] = 2; // CreateVolume (a retry)
        after.csi_ec2[0] = 1;
        assert_eq!(after.served_since(&before, Op::Attach).path(), Path::InTree);
        assert_eq!(after.served_since(&before, Op::Mount).path(), Path::Csi);
        assert_eq!(after.served_since(&before, Op::Provision).path(), Path::Csi);
        assert_eq!(
            after.served_since(&before, Op::Detach).path(),
            Path::Neither
        );
        after.csi_controller[1] = 1;
        let all = after.all_since(&before);
        assert_eq!(path_of(&all, Op::Attach), Path::Both);
        let lines = describe(&all);
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(
            lines[0].contains("CSI") && lines[0].contains("its EC2 calls ×1"),
            "{lines:?}"
        );
    }

    #[test]
    fn in_tree_unmount_is_a_staging_mount_gone() {
        let before = Counts {
            in_tree_mounts: 1,
            ..Counts::default()
        };
        let after = Counts::default();
        assert_eq!(
            after.served_since(&before, Op::Unmount).path(),
            Path::InTree
        );
        assert_eq!(after.served_since(&before, Op::Mount).path(), Path::Neither);
    }

    #[test]
    fn staging_mounts_are_counted_below_the_root_only() {
        let info = "\
36 35 7:1 / /data/nodes/node-0/kubelet/plugins/kubernetes.io/aws-ebs/mounts/aws/us-east-1a/vol-1 rw - ext4 /dev/loop1 rw
37 35 7:1 / /data/nodes/node-0/kubelet/pods/u/volumes/kubernetes.io~aws-ebs/pv-1 rw - ext4 /dev/loop1 rw
38 35 7:2 / /data/nodes/node-0/kubelet/plugins/kubernetes.io/csi/ebs.csi.aws.com/x/globalmount rw - ext4 /dev/loop2 rw
39 35 7:3 / /other/plugins/kubernetes.io/aws-ebs/mounts/vol-3 rw - ext4 /dev/loop3 rw";
        assert_eq!(count_in_tree_mounts(info, "/data"), 1);
    }

    #[test]
    fn paths_and_names_tell_the_plugin() {
        assert_eq!(
            mount_path_kind(FsPath::new("/k/pods/u/volumes/kubernetes.io~aws-ebs/pv-1")),
            Path::InTree
        );
        assert_eq!(
            mount_path_kind(FsPath::new(
                "/k/pods/u/volumes/kubernetes.io~csi/pv-1/mount"
            )),
            Path::Csi
        );
        assert_eq!(
            attached_name_kind("kubernetes.io/aws-ebs/aws://us-east-1a/vol-1"),
            Path::InTree
        );
        assert_eq!(
            attached_name_kind("kubernetes.io/csi/ebs.csi.aws.com^vol-1"),
            Path::Csi
        );
    }
}
