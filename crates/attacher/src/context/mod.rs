//! What the watches, the workers, the handlers and the reconciler share: the driver's
//! capabilities, the caches and queues (`Ctx`), the writes and what was last written. A leaf
//! below all of them: the controller builds it and passes it in, as the Go sidecar passes its
//! listers and queues to its handler.

pub(crate) mod events;
pub(crate) mod fresh;
pub(crate) mod writes;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use component_runtime::workqueue::WorkQueue;
use csi_spec::v1::controller_service_capability::rpc::Type as Rpc;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client};

use crate::Error;
use crate::config::Options;
use crate::names::{DUMMY_DRIVER, DUMMY_DRIVER_VALID};
use crate::slim_objects::{CsiNode, Pv, Va};

use self::events::VaEvents;
use self::fresh::Fresh;

/// Lanes of the VolumeAttachment queue.
pub(crate) const ATTACH: usize = 0;
pub(crate) const DETACH: usize = 1;

/// The driver's controller capabilities that matter to the attacher.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// PUBLISH_UNPUBLISH_VOLUME: without it the trivial handler is used.
    pub publish_unpublish: bool,
    /// PUBLISH_READONLY: only then is `readonly` passed on from the PV.
    pub publish_readonly: bool,
    /// LIST_VOLUMES with LIST_VOLUMES_PUBLISHED_NODES: enables the reconciler.
    pub list_published_nodes: bool,
    /// SINGLE_NODE_MULTI_WRITER: selects the finer access-mode mapping.
    pub single_node_multi_writer: bool,
}

impl Capabilities {
    /// From `ControllerServiceCapability.RPC.Type` values (as `i32`).
    pub fn from_rpc_types(types: impl IntoIterator<Item = i32>) -> Self {
        let set: HashSet<i32> = types.into_iter().collect();
        let has = |t: Rpc| set.contains(&(t as i32));
        Self {
            publish_unpublish: has(Rpc::PublishUnpublishVolume),
            publish_readonly: has(Rpc::PublishReadonly),
            list_published_nodes: has(Rpc::ListVolumes) && has(Rpc::ListVolumesPublishedNodes),
            single_node_multi_writer: has(Rpc::SingleNodeMultiWriter),
        }
    }
}

/// State shared by the watches, the workers and the handlers.
pub(crate) struct Ctx {
    pub client: Client,
    pub driver: String,
    pub finalizer: String,
    pub opts: Options,
    pub va_api: Api<Va>,
    pub pv_api: Api<Pv>,
    pub csinode_api: Api<CsiNode>,
    pub vas: Store<Va>,
    pub pvs: Store<Pv>,
    pub csinodes: Store<CsiNode>,
    pub fresh_vas: Fresh<Va>,
    pub fresh_pvs: Fresh<Pv>,
    pub va_queue: Arc<WorkQueue>,
    pub pv_queue: Arc<WorkQueue>,
    pub events: VaEvents,
    /// VolumeAttachments the reconciler wants attached/detached even if their status agrees.
    pub(crate) force_sync: Mutex<HashSet<String>>,
}

impl Ctx {
    /// VolumeAttachments as the writers see them.
    pub(crate) fn va_objects(&self) -> writes::Objects<'_, Va> {
        writes::Objects {
            api: &self.va_api,
            store: &self.vas,
            fresh: &self.fresh_vas,
        }
    }

    pub(crate) fn pv_objects(&self) -> writes::Objects<'_, Pv> {
        writes::Objects {
            api: &self.pv_api,
            store: &self.pvs,
            fresh: &self.fresh_pvs,
        }
    }

    /// The newest copy of a VolumeAttachment we know: the cache, or our own last write.
    pub(crate) fn current_va(&self, name: &str) -> Option<Arc<Va>> {
        self.va_objects().current(name)
    }

    pub(crate) fn current_pv(&self, name: &str) -> Option<Arc<Pv>> {
        self.pv_objects().current(name)
    }

    /// A PV from the cache, or (not cached yet: its watch may lag the VolumeAttachment's) a GET.
    pub(crate) async fn get_pv(&self, name: &str) -> Result<Option<Arc<Pv>>, Error> {
        if let Some(pv) = self.current_pv(name) {
            return Ok(Some(pv));
        }
        match self.pv_api.get_opt(name).await {
            Ok(pv) => Ok(pv.map(Arc::new)),
            Err(e) => Err(Error::kube(format!("reading PersistentVolume {name}"), e)),
        }
    }

    /// A CSINode from the cache. (No GET: one that registers later kicks the VolumeAttachments
    /// waiting for it, and the attacher needs no `get` permission on CSINodes.)
    pub(crate) fn get_csinode(&self, name: &str) -> Option<Arc<CsiNode>> {
        self.csinodes.get(&ObjectRef::new(name))
    }

    pub(crate) fn set_force_sync(&self, name: &str) {
        self.force_sync
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_string());
    }

    pub(crate) fn take_force_sync(&self, name: &str) -> bool {
        self.force_sync
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name)
    }

    /// Is this VolumeAttachment ours?
    pub(crate) fn owns(&self, va: &Va) -> bool {
        va.spec.attacher == self.driver
            || (self.driver == DUMMY_DRIVER && va.spec.attacher == DUMMY_DRIVER_VALID)
    }

    /// Queues a VolumeAttachment in the lane its state calls for.
    pub(crate) fn enqueue_va(&self, va: &Va) {
        let Some(name) = va.metadata.name.as_deref() else {
            return;
        };
        let lane = if va.metadata.deletion_timestamp.is_some() {
            DETACH
        } else {
            ATTACH
        };
        self.va_queue.add(name, lane);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities_from_rpc_types() {
        let caps = Capabilities::from_rpc_types([
            Rpc::PublishUnpublishVolume as i32,
            Rpc::ListVolumesPublishedNodes as i32,
        ]);
        assert!(caps.publish_unpublish);
        assert!(!caps.list_published_nodes, "needs LIST_VOLUMES too");
        assert!(!caps.publish_readonly);
        let caps = Capabilities::from_rpc_types([
            Rpc::ListVolumes as i32,
            Rpc::ListVolumesPublishedNodes as i32,
            Rpc::PublishReadonly as i32,
            Rpc::SingleNodeMultiWriter as i32,
            999,
        ]);
        assert!(
            caps.list_published_nodes && caps.publish_readonly && caps.single_node_multi_writer
        );
        assert!(!caps.publish_unpublish);
    }
}
