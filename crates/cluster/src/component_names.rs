//! The names of the cluster's components, as `csi-cluster status`, the log files, the
//! supervisor and the fault tests call them. A leaf: every other module may use it.

use crate::HOSTPATH_DRIVER;

/// The control plane's component names (`csi-cluster status`, logs, the fault tests).
pub const EBS_CONTROLLER: &str = "ebs-csi-driver (controller)";
pub const PV_CONTROLLER: &str = "PV controller";
/// kcm's ephemeral-volume controller: the claims of generic ephemeral volumes.
pub const EPHEMERAL_VOLUME: &str = "ephemeral volume controller";
pub const ADC: &str = "attach/detach controller";
pub const ATTACHER: &str = "csi-attacher (ebs.csi.aws.com)";
/// The hostpath driver's controller-only instance (`--hostpath-attach-required`).
pub const HOSTPATH_CONTROLLER: &str = "hostpath-csi-driver (controller)";
pub const PROVISIONER: &str = "csi-provisioner (ebs.csi.aws.com)";

/// The csi-attacher of a driver: `csi-attacher (<driver>)`.
pub fn attacher_name(driver: &str) -> String {
    format!("csi-attacher ({driver})")
}

/// The workload controllers' component names.
pub const SCHEDULER: &str = "scheduler";
pub const STATEFULSET: &str = "StatefulSet controller";

/// The component names of an external driver's parts.
pub fn external_controller(driver: &str) -> String {
    format!("{driver} (controller plugin)")
}
pub fn external_node(node: &str, driver: &str) -> String {
    format!("{node}: {driver} (node plugin)")
}
pub fn external_provisioner(node: Option<&str>, driver: &str) -> String {
    match node {
        Some(node) => format!("{node}: csi-provisioner ({driver})"),
        None => format!("csi-provisioner ({driver})"),
    }
}

/// The names of node `node`'s components (`csi-cluster status`, logs, the fault tests).
pub fn ebs_node_driver(node: &str) -> String {
    format!("{node}: ebs-csi-driver (node)")
}
pub fn hostpath_driver(node: &str) -> String {
    format!("{node}: hostpath-csi-driver")
}
pub fn registrar(node: &str, driver: &str) -> String {
    format!("{node}: csi-node-driver-registrar ({driver})")
}
pub fn node_agent(node: &str) -> String {
    format!("{node}: node agent")
}
pub fn hostpath_provisioner(node: &str) -> String {
    format!("{node}: csi-provisioner ({HOSTPATH_DRIVER})")
}
