//! The state every service shares: the configuration, the state file and the volume locks.

use std::path::PathBuf;
use std::sync::Arc;

use csi_spec::v1::Topology;
use tokio::sync::Mutex;

use crate::backing;
use crate::config::{Config, TOPOLOGY_KEY};
use crate::locks::Locks;
use crate::state::{State, Store, Volume};
use crate::{Error, Result};

#[derive(Debug)]
pub(crate) struct Driver {
    pub config: Config,
    store: Mutex<Store>,
    pub locks: Locks,
}

impl Driver {
    /// Checks the configuration, creates the state directory and loads the state file.
    pub(crate) async fn open(config: Config) -> Result<Arc<Self>> {
        if config.node_id.is_empty() {
            return Err(Error::Config(
                "node_id is required (--nodeid / --node-id)".into(),
            ));
        }
        if config.driver_name.is_empty() {
            return Err(Error::Config(
                "driver_name must not be empty (--drivername)".into(),
            ));
        }
        if config.capacity_bytes == 0 {
            return Err(Error::Config("capacity must be more than 0 bytes".into()));
        }
        for dir in [
            config.state_dir.clone(),
            backing::volumes_dir(&config.state_dir),
            backing::snapshots_dir(&config.state_dir),
        ] {
            std::fs::create_dir_all(&dir).map_err(|e| Error::io("creating", &dir, e))?;
        }
        let store = Store::open(&config.state_dir)?;
        tracing::info!(
            volumes = store.state.volumes.len(),
            snapshots = store.state.snapshots.len(),
            "state loaded"
        );
        Ok(Arc::new(Self {
            config,
            store: Mutex::new(store),
            locks: Locks::default(),
        }))
    }

    /// A copy of the current state.
    pub(crate) async fn snapshot(&self) -> State {
        self.store.lock().await.state.clone()
    }

    pub(crate) async fn volume(&self, id: &str) -> Option<Volume> {
        self.store.lock().await.state.volumes.get(id).cloned()
    }

    /// The volume, or NOT_FOUND naming it.
    pub(crate) async fn existing_volume(&self, id: &str) -> Result<Volume> {
        self.volume(id)
            .await
            .ok_or_else(|| Error::volume_not_found(id))
    }

    /// Applies `change` to a copy of the state and saves it; the change takes effect only once
    /// it is on disk (a failed write leaves memory and file as they were).
    pub(crate) async fn update<T>(
        &self,
        change: impl FnOnce(&mut State) -> Result<T>,
    ) -> Result<T> {
        let mut store = self.store.lock().await;
        let before = store.state.clone();
        let out = change(&mut store.state);
        let out = match out {
            Ok(v) => v,
            Err(e) => {
                store.state = before;
                return Err(e);
            }
        };
        if store.state != before {
            if let Err(e) = store.save() {
                store.state = before;
                return Err(e);
            }
        }
        Ok(out)
    }

    /// Where a volume's content lives.
    pub(crate) fn volume_path(&self, v: &Volume) -> PathBuf {
        backing::volume_path(&self.config.state_dir, &v.id, v.kind)
    }

    /// The topology of this node and of every volume on it.
    pub(crate) fn topology(&self) -> Topology {
        Topology {
            segments: [(TOPOLOGY_KEY.to_string(), self.config.node_id.clone())].into(),
        }
    }
}
