//! The CSI drivers registered on this node (the kubelet's `csiDrivers` store): filled by the
//! plugin manager after a driver's registration succeeded, read by the volume manager for
//! every node call. A driver that is not here is "not registered": its volumes wait, with a
//! `FailedMount` Event that says so.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use tokio::sync::watch;
use tonic::transport::Channel;

/// One registered driver, as learned at registration (GetInfo, NodeGetInfo,
/// NodeGetCapabilities).
#[derive(Clone, Debug)]
pub struct RegisteredDriver {
    /// The CSI driver name (GetInfo's name = GetPluginInfo's).
    pub name: String,
    /// The driver's CSI endpoint: a unix socket path, as GetInfo's `endpoint` gave it.
    pub endpoint: String,
    /// NodeGetInfo's node_id.
    pub node_id: String,
    /// NodeGetInfo's max_volumes_per_node (None: 0, no limit).
    pub max_volumes_per_node: Option<i64>,
    /// NodeGetInfo's accessible_topology segments.
    pub topology: BTreeMap<String, String>,
    /// NodeGetCapabilities: STAGE_UNSTAGE_VOLUME.
    pub stage_unstage: bool,
    /// NodeGetCapabilities: GET_VOLUME_STATS.
    pub volume_stats: bool,
    /// NodeGetCapabilities: SINGLE_NODE_MULTI_WRITER (ReadWriteOnce and ReadWriteOncePod are
    /// then told apart; without it both go as SINGLE_NODE_WRITER).
    pub single_node_multi_writer: bool,
    /// A (lazy, reconnecting) channel to `endpoint`.
    pub channel: Channel,
}

/// The registry; cheap to clone, shared by the plugin manager and the volume manager.
#[derive(Clone, Debug)]
pub struct DriverRegistry {
    drivers: Arc<RwLock<HashMap<String, RegisteredDriver>>>,
    changed: Arc<watch::Sender<u64>>,
}

impl Default for DriverRegistry {
    fn default() -> Self {
        Self {
            drivers: Arc::default(),
            changed: Arc::new(watch::channel(0).0),
        }
    }
}

impl DriverRegistry {
    /// Adds or replaces (a driver that re-registered, e.g. after a restart) a driver.
    pub fn register(&self, driver: RegisteredDriver) {
        self.write().insert(driver.name.clone(), driver);
        self.changed.send_modify(|n| *n += 1);
    }

    /// Removes a driver; returns what was registered.
    pub fn deregister(&self, name: &str) -> Option<RegisteredDriver> {
        let removed = self.write().remove(name);
        if removed.is_some() {
            self.changed.send_modify(|n| *n += 1);
        }
        removed
    }

    pub fn get(&self, name: &str) -> Option<RegisteredDriver> {
        self.read().get(name).cloned()
    }

    /// Registered driver names, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.read().keys().cloned().collect();
        names.sort();
        names
    }

    /// Ticks on every register/deregister.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, RegisteredDriver>> {
        // A panic while holding the lock cannot leave the map half-updated (insert/remove are
        // single calls), so a poisoned lock still holds a consistent map.
        self.drivers.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, RegisteredDriver>> {
        self.drivers.write().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn driver(name: &str) -> RegisteredDriver {
        RegisteredDriver {
            name: name.into(),
            endpoint: "/tmp/none.sock".into(),
            node_id: "n1".into(),
            max_volumes_per_node: None,
            topology: BTreeMap::new(),
            stage_unstage: true,
            volume_stats: false,
            single_node_multi_writer: false,
            channel: Channel::from_static("http://[::1]:1").connect_lazy(),
        }
    }

    #[tokio::test]
    async fn register_and_deregister_tick_subscribers() {
        let reg = DriverRegistry::default();
        let mut rx = reg.subscribe();
        reg.register(driver("b.csi"));
        reg.register(driver("a.csi"));
        assert!(rx.has_changed().unwrap());
        rx.mark_unchanged();
        assert_eq!(reg.names(), vec!["a.csi", "b.csi"]);
        assert!(reg.deregister("a.csi").is_some());
        assert!(rx.has_changed().unwrap());
        rx.mark_unchanged();
        assert!(reg.deregister("a.csi").is_none());
        assert!(!rx.has_changed().unwrap(), "removing nothing is no change");
        assert!(reg.get("b.csi").is_some() && reg.get("a.csi").is_none());
    }
}
