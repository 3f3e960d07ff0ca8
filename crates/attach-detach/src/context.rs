//! What the reconciler, the populators, the status updater and the operations share: the
//! watch caches, the CSI and in-tree plugins, the options, and the actual state with the
//! running operations under one lock. A leaf below all of them (the controller builds it,
//! they only read it), as kube-controller-manager passes its caches, actual state and
//! operation executor into the reconciler rather than the reconciler reaching back up.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use component_runtime::{ObjectCache, SharedCaches};
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, CSINode, VolumeAttachment};
use kube::Client;
use volume_plugins::CsiPlugin;

use crate::Error;
use crate::cache::ActualStateOfWorld;
use crate::config::Options;
use crate::events::EventRecorder;
use crate::in_tree::InTree;
use crate::metrics::Metrics;
use crate::pending_operations::OperationTable;

/// The reflectors (client-go informers) of the seven kinds the controller reads.
#[derive(Debug, Clone)]
pub(crate) struct Caches {
    pub pods: ObjectCache<Pod>,
    pub nodes: ObjectCache<Node>,
    pub pvs: ObjectCache<PersistentVolume>,
    pub pvcs: ObjectCache<PersistentVolumeClaim>,
    pub csidrivers: ObjectCache<CSIDriver>,
    pub csinodes: ObjectCache<CSINode>,
    pub vas: ObjectCache<VolumeAttachment>,
}

impl Caches {
    pub(crate) fn spawn(source: &SharedCaches) -> Self {
        Self {
            pods: source.all(),
            nodes: source.all(),
            pvs: source.all(),
            pvcs: source.all(),
            csidrivers: source.all(),
            csinodes: source.all(),
            vas: source.all(),
        }
    }

    pub(crate) async fn wait_until_ready(&self, timeout: Duration) -> Result<(), Error> {
        component_runtime::wait_all_ready(
            [
                self.pods.readiness(),
                self.nodes.readiness(),
                self.pvs.readiness(),
                self.pvcs.readiness(),
                self.csidrivers.readiness(),
                self.csinodes.readiness(),
                self.vas.readiness(),
            ],
            timeout,
        )
        .await?;
        Ok(())
    }
}

/// What operations share with the reconciler: the actual state and the running operations.
#[derive(Debug)]
pub(crate) struct State {
    pub asw: ActualStateOfWorld,
    pub ops: OperationTable,
}

impl State {
    pub(crate) fn new(options: &Options) -> Self {
        Self {
            asw: ActualStateOfWorld::default(),
            ops: OperationTable::new(component_runtime::workqueue::Backoff {
                start: options.backoff_initial,
                max: options.backoff_max,
            }),
        }
    }
}

/// Everything the reconciler and the operations need.
pub(crate) struct Ctx {
    pub client: Client,
    pub caches: Caches,
    pub csi: CsiPlugin,
    pub in_tree: InTree,
    pub options: Options,
    pub metrics: Arc<Metrics>,
    pub events: EventRecorder,
    state: Mutex<State>,
}

impl Ctx {
    pub(crate) fn new(
        events: EventRecorder,
        client: Client,
        caches: Caches,
        csi: CsiPlugin,
        in_tree: InTree,
        options: Options,
        metrics: Arc<Metrics>,
    ) -> Self {
        let state = Mutex::new(State::new(&options));
        Self {
            client,
            caches,
            csi,
            in_tree,
            options,
            metrics,
            events,
            state,
        }
    }

    /// The shared state; never held across an await.
    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}
