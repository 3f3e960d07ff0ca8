//! Registering and deregistering one plugin socket: the kubelet's operation generator
//! (dial, GetInfo, NotifyRegistrationStatus) together with its CSI registration handler
//! (validate, NodeGetInfo, CSINode, the drivers store).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use csi_spec::v1::node_client::NodeClient;
use csi_spec::v1::node_service_capability::rpc::Type as NodeRpc;
use csi_spec::v1::{NodeGetCapabilitiesRequest, NodeGetInfoRequest};
use registrar::pluginregistration::registration_client::RegistrationClient;
use registrar::pluginregistration::{InfoRequest, PluginInfo, RegistrationStatus};
use tonic::transport::Channel;

use super::validation;
use super::watcher::SocketId;
use crate::drivers::{DriverRegistry, RegisteredDriver};
use crate::nodeinfomanager::NodeInfoManager;

/// The kubelet's deadlines: dialling the registration socket, GetInfo, NotifyRegistrationStatus.
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
const GET_INFO_TIMEOUT: Duration = Duration::from_secs(1);
const NOTIFY_TIMEOUT: Duration = Duration::from_secs(5);
/// NodeGetInfo and NodeGetCapabilities at registration (the kubelet allows NodeGetInfo 2 min;
/// a driver that slow is retried with backoff instead of holding its socket's slot).
const CSI_CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Attempts to remove a gone driver from the CSINode (any error; 200 ms, doubling).
const UNINSTALL_ATTEMPTS: u32 = 5;

/// What a registered socket registered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Registered {
    pub(crate) name: String,
    pub(crate) endpoint: String,
}

/// The CSI plugin handler shared by the operations of all sockets.
pub(crate) struct CsiHandler {
    drivers: DriverRegistry,
    node_info: NodeInfoManager,
    /// Driver name → the socket (and its identity) whose registration is the current one: a
    /// socket that goes away deregisters its driver only if no other socket took it over.
    owners: Mutex<HashMap<String, (PathBuf, SocketId)>>,
    /// One (de)registration per driver name at a time, so a driver restarting from another
    /// socket is never removed from the CSINode after it was added again.
    name_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl CsiHandler {
    pub(crate) fn new(drivers: DriverRegistry, node_info: NodeInfoManager) -> Self {
        Self {
            drivers,
            node_info,
            owners: Mutex::default(),
            name_locks: Mutex::default(),
        }
    }

    /// Registers the plugin behind `socket`; every failure after GetInfo answered is also sent
    /// to the plugin as NotifyRegistrationStatus(false, reason). The error is the reason.
    pub(crate) async fn register(&self, socket: &Path, id: SocketId) -> Result<Registered, String> {
        let socket_str = socket.display().to_string();
        let channel = tokio::time::timeout(DIAL_TIMEOUT, csi_spec::connect_unix(&socket_str))
            .await
            .map_err(|_| format!("dialling registration socket {socket_str}: no connection within {DIAL_TIMEOUT:?}"))?
            .map_err(|e| format!("dialling registration socket {socket_str}: {e}"))?;
        let mut client = RegistrationClient::new(channel);
        let mut request = tonic::Request::new(InfoRequest {});
        request.set_timeout(GET_INFO_TIMEOUT);
        let info = tokio::time::timeout(GET_INFO_TIMEOUT, client.get_info(request))
            .await
            .map_err(|_| format!("GetInfo at registration socket {socket_str}: no answer within {GET_INFO_TIMEOUT:?}"))?
            .map_err(|s| format!("GetInfo at registration socket {socket_str}: {s}"))?
            .into_inner();
        match self.register_plugin(socket, id, info).await {
            Ok(registered) => {
                if let Err(e) = notify(&mut client, true, "").await {
                    // As the kubelet: the driver stays registered; if its registrar is gone,
                    // its socket goes too and that deregisters it.
                    tracing::warn!(socket = %socket_str, driver = %registered.name, error = %e, "could not tell the plugin it is registered");
                }
                Ok(registered)
            }
            Err(reason) => {
                if let Err(e) = notify(&mut client, false, &reason).await {
                    tracing::warn!(socket = %socket_str, error = %e, "could not tell the plugin its registration failed");
                }
                Err(reason)
            }
        }
    }

    async fn register_plugin(
        &self,
        socket: &Path,
        id: SocketId,
        info: PluginInfo,
    ) -> Result<Registered, String> {
        let socket_str = socket.display().to_string();
        if info.r#type != registrar::CSI_PLUGIN_TYPE {
            return Err(format!(
                "RegisterPlugin error -- no handler registered for plugin type {:?} at socket \
                 {socket_str}: this node agent registers only {:?} plugins",
                info.r#type,
                registrar::CSI_PLUGIN_TYPE
            ));
        }
        let endpoint = if info.endpoint.is_empty() {
            // The kubelet's rule: no endpoint means the driver serves CSI on this very socket.
            socket_str.clone()
        } else {
            info.endpoint.clone()
        };
        let version = validation::validate(&info.name, &info.supported_versions).map_err(|e| {
            format!("RegisterPlugin error -- plugin validation failed at socket {socket_str}: {e}")
        })?;
        let name = info.name;
        tracing::info!(driver = %name, socket = %socket_str, endpoint = %endpoint, %version, "registering CSI driver");

        let lock = self.name_lock(&name);
        let _guard = lock.lock().await;
        let driver = self.driver_from(&name, &endpoint).await.map_err(|e| {
            format!(
                "RegisterPlugin error -- plugin registration failed for CSI driver {name:?}: {e}"
            )
        })?;
        self.node_info.install_driver(&driver).await.map_err(|e| {
            format!(
                "RegisterPlugin error -- plugin registration failed for CSI driver {name:?}: {e}"
            )
        })?;
        let previous = self
            .lock_owners()
            .insert(name.clone(), (socket.to_path_buf(), id));
        if let Some((old, _)) = previous.filter(|(old, _)| old != socket) {
            tracing::info!(driver = %name, socket = %socket_str, previous = %old.display(), "driver registered again from another socket: replacing the earlier registration");
        }
        self.drivers.register(driver.clone());
        tracing::info!(
            driver = %name,
            socket = %socket_str,
            endpoint = %endpoint,
            node_id = %driver.node_id,
            stage_unstage = driver.stage_unstage,
            "CSI driver registered"
        );
        Ok(Registered { name, endpoint })
    }

    /// NodeGetInfo and NodeGetCapabilities over a (lazy, reconnecting) channel to the driver.
    async fn driver_from(&self, name: &str, endpoint: &str) -> Result<RegisteredDriver, String> {
        let channel: Channel = csi_spec::connect_unix_lazy(endpoint).map_err(|e| e.to_string())?;
        let mut node = NodeClient::new(channel.clone());
        let mut request = tonic::Request::new(NodeGetInfoRequest {});
        request.set_timeout(CSI_CALL_TIMEOUT);
        let info = tokio::time::timeout(CSI_CALL_TIMEOUT, node.node_get_info(request))
            .await
            .map_err(|_| {
                format!("NodeGetInfo at {endpoint}: no answer within {CSI_CALL_TIMEOUT:?}")
            })?
            .map_err(|s| format!("NodeGetInfo at {endpoint}: {s}"))?
            .into_inner();
        if info.node_id.is_empty() {
            return Err(format!(
                "NodeGetInfo at {endpoint} returned an empty node_id (required)"
            ));
        }
        let mut request = tonic::Request::new(NodeGetCapabilitiesRequest {});
        request.set_timeout(CSI_CALL_TIMEOUT);
        let caps = tokio::time::timeout(CSI_CALL_TIMEOUT, node.node_get_capabilities(request))
            .await
            .map_err(|_| {
                format!("NodeGetCapabilities at {endpoint}: no answer within {CSI_CALL_TIMEOUT:?}")
            })?
            .map_err(|s| format!("NodeGetCapabilities at {endpoint}: {s}"))?
            .into_inner();
        let has = |rpc: NodeRpc| caps.capabilities.iter().any(|c| c.rpc_type() == Some(rpc));
        Ok(RegisteredDriver {
            name: name.to_owned(),
            endpoint: endpoint.to_owned(),
            node_id: info.node_id,
            max_volumes_per_node: (info.max_volumes_per_node > 0)
                .then_some(info.max_volumes_per_node),
            topology: info
                .accessible_topology
                .map(|t| t.segments.into_iter().collect())
                .unwrap_or_default(),
            stage_unstage: has(NodeRpc::StageUnstageVolume),
            volume_stats: has(NodeRpc::GetVolumeStats),
            single_node_multi_writer: has(NodeRpc::SingleNodeMultiWriter),
            channel,
        })
    }

    /// The socket `socket` (identity `id`) that registered `registered` is gone or replaced:
    /// the driver leaves the drivers store and the CSINode, unless another socket registered
    /// it since.
    pub(crate) async fn deregister(&self, socket: &Path, id: SocketId, registered: &Registered) {
        let name = &registered.name;
        let lock = self.name_lock(name);
        let _guard = lock.lock().await;
        {
            let mut owners = self.lock_owners();
            match owners.get(name) {
                Some((path, owner_id)) if path == socket && *owner_id == id => {
                    owners.remove(name);
                }
                other => {
                    tracing::info!(
                        driver = %name,
                        socket = %socket.display(),
                        current = ?other.map(|(p, _)| p.display().to_string()),
                        "registration socket gone, but the driver is registered from another socket now: keeping it"
                    );
                    return;
                }
            }
        }
        self.drivers.deregister(name);
        tracing::info!(driver = %name, socket = %socket.display(), "registration socket gone: CSI driver deregistered");
        let mut pause = Duration::from_millis(200);
        for attempt in 1..=UNINSTALL_ATTEMPTS {
            match self.node_info.uninstall_driver(name).await {
                Ok(()) => return,
                Err(e) if attempt < UNINSTALL_ATTEMPTS => {
                    tracing::warn!(driver = %name, attempt, error = %e, "removing the driver from the CSINode failed; retrying");
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                }
                Err(e) => {
                    tracing::error!(driver = %name, error = %e, "removing the driver from the CSINode failed; giving up");
                }
            }
        }
    }

    fn name_lock(&self, name: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self
            .name_locks
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        Arc::clone(locks.entry(name.to_owned()).or_default())
    }

    fn lock_owners(&self) -> std::sync::MutexGuard<'_, HashMap<String, (PathBuf, SocketId)>> {
        // Single inserts and removes: a panic elsewhere cannot leave the map half-updated.
        self.owners
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

async fn notify(
    client: &mut RegistrationClient<Channel>,
    registered: bool,
    error: &str,
) -> Result<(), String> {
    let mut request = tonic::Request::new(RegistrationStatus {
        plugin_registered: registered,
        error: error.to_owned(),
    });
    request.set_timeout(NOTIFY_TIMEOUT);
    tokio::time::timeout(NOTIFY_TIMEOUT, client.notify_registration_status(request))
        .await
        .map_err(|_| format!("no answer within {NOTIFY_TIMEOUT:?}"))?
        .map_err(|s| s.to_string())?;
    Ok(())
}
