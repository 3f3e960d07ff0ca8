//! What the driver is configured with, and the constants the CO sees.

use std::path::PathBuf;

/// The name CSIDriver objects and PVs refer to (the Go hostpath driver's default).
pub const DEFAULT_DRIVER_NAME: &str = "hostpath.csi.k8s.io";

/// The topology key of every volume and of the node: its value is the node ID.
pub const TOPOLOGY_KEY: &str = "topology.hostpath.csi/node";

/// volume_context key the kubelet sets on NodePublish of a CSI ephemeral inline volume.
pub const EPHEMERAL_CONTEXT_KEY: &str = "csi.storage.k8s.io/ephemeral";

/// Total capacity when none is configured: 100 GiB.
pub const DEFAULT_CAPACITY: u64 = 100 << 30;

/// The size of a volume whose request names no capacity, and of an ephemeral volume: 1 GiB.
pub const DEFAULT_VOLUME_SIZE: u64 = 1 << 30;

/// Everything the driver needs. `Default` gives the binary's defaults except `node_id`, which
/// has none (serving fails without it).
#[derive(Debug, Clone)]
pub struct Config {
    /// Where [`crate::run`] binds: `unix:///path/csi.sock`, `unix:/path` or a plain path.
    pub endpoint: String,
    /// GetPluginInfo's name.
    pub driver_name: String,
    /// GetPluginInfo's vendor_version.
    pub vendor_version: String,
    /// This node's ID: NodeGetInfo and the topology value of every volume. Required.
    pub node_id: String,
    /// Volumes, snapshots and the state file live here.
    pub state_dir: PathBuf,
    /// Total bytes all volumes may take together (CreateVolume's RESOURCE_EXHAUSTED).
    pub capacity_bytes: u64,
    /// NodeGetInfo's max_volumes_per_node; 0 = not reported.
    pub max_volumes_per_node: i64,
    /// Whether the node service offers STAGE_UNSTAGE_VOLUME.
    pub stage_unstage: bool,
    /// Where sysfs is mounted (loop devices' backing files, device sizes).
    pub sys_root: PathBuf,
    /// Offer PUBLISH_UNPUBLISH_VOLUME (the Go driver's `--enable-attach`), for a CSIDriver
    /// with `attachRequired: true`: ControllerPublish checks the node, nothing is attached.
    pub enable_attach: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            endpoint: "unix:///csi/csi.sock".to_string(),
            driver_name: DEFAULT_DRIVER_NAME.to_string(),
            vendor_version: env!("CARGO_PKG_VERSION").to_string(),
            node_id: String::new(),
            state_dir: PathBuf::from("/csi-data-dir"),
            capacity_bytes: DEFAULT_CAPACITY,
            max_volumes_per_node: 0,
            stage_unstage: true,
            sys_root: PathBuf::from("/sys"),
            enable_attach: false,
        }
    }
}

/// A byte count as Kubernetes writes quantities: `1073741824`, `100Gi`, `512Mi`, `10G`,
/// `1k`. Binary suffixes Ki Mi Gi Ti Pi, decimal k M G T P; no fractions.
pub fn parse_quantity(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, suffix) = s.split_at(split);
    if digits.is_empty() {
        return Err(format!(
            "{s:?} is not a byte quantity (expected digits and an optional suffix such as Gi)"
        ));
    }
    let n: u64 = digits
        .parse()
        .map_err(|e| format!("{s:?} is not a byte quantity: {e}"))?;
    let factor: u64 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        other => {
            return Err(format!(
                "{s:?}: unknown suffix {other:?} (expected Ki, Mi, Gi, Ti, Pi, k, M, G, T or P)"
            ));
        }
    };
    n.checked_mul(factor)
        .ok_or_else(|| format!("{s:?} does not fit in 64 bits"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn quantities_in_kubernetes_notation() {
        assert_eq!(parse_quantity("100Gi").unwrap(), 100 << 30);
        assert_eq!(parse_quantity("512Mi").unwrap(), 512 << 20);
        assert_eq!(parse_quantity("1073741824").unwrap(), 1 << 30);
        assert_eq!(parse_quantity("10G").unwrap(), 10_000_000_000);
        assert_eq!(parse_quantity("1k").unwrap(), 1000);
        for bad in ["", "Gi", "1.5Gi", "10gb", "-1", "99999999999999Pi"] {
            assert!(parse_quantity(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn defaults_are_the_go_driver_s() {
        let c = Config::default();
        assert_eq!(c.driver_name, "hostpath.csi.k8s.io");
        assert_eq!(c.capacity_bytes, 100 << 30);
        assert_eq!(c.max_volumes_per_node, 0);
        assert!(c.stage_unstage);
        assert!(!c.enable_attach);
        assert!(c.node_id.is_empty());
    }
}
