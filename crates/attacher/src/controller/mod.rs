//! The controller: caches (reflectors) of VolumeAttachments, PVs and CSINodes, the attach,
//! detach and PV queues with their workers, periodic resync and the reconciler.

mod events;
pub(crate) mod fresh;
mod watch;
mod workers;
pub(crate) use workers::every;
pub(crate) mod writes;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use crate::slim_objects::Pv;
use crate::slim_objects::{CsiNode, Va};
use csi_spec::v1::controller_service_capability::rpc::Type as Rpc;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::{Api, Client};
use prometheus_client::registry::Registry;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::Options;
use crate::csi::CsiClient;
use crate::handler::{CsiHandler, Handler, TrivialHandler};
use crate::metrics::{CsiCallObserver, Metrics};
use crate::names::{DUMMY_DRIVER, DUMMY_DRIVER_VALID, finalizer_name};
use crate::{Error, reconciler};
use component_runtime::workqueue::{Backoff, WorkQueue};

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

/// Whom the attacher works for.
#[derive(Debug, Clone)]
pub enum Driver {
    /// A CSI driver on `channel`, named `name` (GetPluginInfo).
    Csi {
        name: String,
        channel: tonic::transport::Channel,
        capabilities: Capabilities,
    },
    /// `--dummy`: VolumeAttachments of attacher `csi/dummy` (or `csi-dummy`, the spelling
    /// today's API servers accept), trivial handler, no driver.
    Dummy,
}

impl Driver {
    /// The `spec.attacher` this controller handles.
    pub fn name(&self) -> &str {
        match self {
            Driver::Csi { name, .. } => name,
            Driver::Dummy => DUMMY_DRIVER,
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
    force_sync: Mutex<HashSet<String>>,
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

/// The controller, ready to run.
pub struct Controller {
    ctx: Arc<Ctx>,
    handler: Arc<dyn Handler>,
    csi: Option<CsiClient>,
    reconcile: bool,
    writers: Option<watch::Writers>,
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("driver", &self.ctx.driver)
            .field("handler", &self.handler.kind())
            .finish_non_exhaustive()
    }
}

impl Controller {
    /// Builds the controller for `driver` on `client`, registering its metrics in `registry`.
    /// `operations` receives every CSI call (see `component_runtime::OperationMetrics`).
    pub fn new(
        client: Client,
        driver: Driver,
        options: Options,
        registry: &mut Registry,
        operations: Option<CsiCallObserver>,
    ) -> Self {
        let metrics = Arc::new(Metrics::register(registry, operations));
        let backoff = Backoff {
            start: options.retry_interval_start,
            max: options.retry_interval_max,
        };
        let va_queue = Arc::new(WorkQueue::new(
            &["csi-attacher-va-attach", "csi-attacher-va-detach"],
            backoff,
            Some(metrics.queue.clone()),
        ));
        let pv_queue = Arc::new(WorkQueue::new(
            &["csi-attacher-pv"],
            backoff,
            Some(metrics.queue.clone()),
        ));
        metrics.gauges.watch(&va_queue);
        metrics.gauges.watch(&pv_queue);
        let (vas, va_writer) = reflector::store();
        let (pvs, pv_writer) = reflector::store();
        let (csinodes, csinode_writer) = reflector::store();
        let name = driver.name().to_string();
        let ctx = Arc::new(Ctx {
            va_api: Api::all(client.clone()),
            pv_api: Api::all(client.clone()),
            csinode_api: Api::all(client.clone()),
            events: VaEvents::new(client.clone(), format!("csi-attacher {name}")),
            client,
            finalizer: finalizer_name(&name),
            driver: name,
            opts: options.clone(),
            vas,
            pvs,
            csinodes,
            fresh_vas: Fresh::default(),
            fresh_pvs: Fresh::default(),
            va_queue,
            pv_queue,
            force_sync: Mutex::new(HashSet::new()),
        });
        let (handler, csi, reconcile): (Arc<dyn Handler>, _, _) = match driver {
            Driver::Csi {
                channel,
                capabilities,
                ..
            } if capabilities.publish_unpublish => {
                let csi = CsiClient::new(channel, options.timeout, metrics.clone());
                (
                    Arc::new(CsiHandler::new(ctx.clone(), csi.clone(), capabilities)),
                    Some(csi),
                    capabilities.list_published_nodes,
                )
            }
            _ => (Arc::new(TrivialHandler::new(ctx.clone())), None, false),
        };
        Self {
            ctx,
            handler,
            csi,
            reconcile,
            writers: Some(watch::Writers {
                vas: va_writer,
                pvs: pv_writer,
                csinodes: csinode_writer,
            }),
        }
    }

    /// "csi" or "trivial".
    pub fn handler_kind(&self) -> &'static str {
        self.handler.kind()
    }

    /// The finalizer this controller uses.
    pub fn finalizer(&self) -> &str {
        &self.ctx.finalizer
    }

    /// Runs until `shutdown` is cancelled: watches, waits for the caches, then works the queues.
    /// On shutdown no new keys are taken; keys in progress finish (each CSI call is bounded by
    /// `--timeout`), so nothing is left half-written.
    pub async fn run(mut self, shutdown: CancellationToken) -> Result<(), Error> {
        let ctx = self.ctx.clone();
        let writers = self
            .writers
            .take()
            .ok_or_else(|| Error::Watch("Controller::run called twice".into()))?;
        tracing::info!(driver = %ctx.driver, handler = self.handler.kind(), "starting the attacher");
        let stop_watches = CancellationToken::new();
        let mut watches = JoinSet::new();
        watch::spawn(&mut watches, ctx.clone(), writers, stop_watches.clone());

        let ready = async {
            let (a, b, c) = tokio::join!(
                ctx.vas.wait_until_ready(),
                ctx.pvs.wait_until_ready(),
                ctx.csinodes.wait_until_ready()
            );
            a.and(b).and(c)
        };
        tokio::select! {
            () = shutdown.cancelled() => {
                stop_watches.cancel();
                while watches.join_next().await.is_some() {}
                return Ok(());
            }
            r = ready => r.map_err(|e| Error::Watch(format!("caches never filled: {e}")))?,
        }
        tracing::info!(
            volumeattachments = ctx.vas.len(),
            persistentvolumes = ctx.pvs.len(),
            csinodes = ctx.csinodes.len(),
            "caches filled; starting workers"
        );

        let mut workers = JoinSet::new();
        for _ in 0..ctx.opts.workers {
            for lane in [ATTACH, DETACH] {
                workers.spawn(workers::va_worker(ctx.clone(), self.handler.clone(), lane));
            }
            workers.spawn(workers::pv_worker(ctx.clone()));
        }
        let mut background = JoinSet::new();
        background.spawn(workers::resync(ctx.clone(), shutdown.clone()));
        if let (true, Some(csi)) = (self.reconcile, self.csi.clone()) {
            background.spawn(reconciler::run(ctx.clone(), csi, shutdown.clone()));
        }

        shutdown.cancelled().await;
        tracing::info!("shutting down: finishing the keys in progress");
        ctx.va_queue.shut_down();
        ctx.pv_queue.shut_down();
        while workers.join_next().await.is_some() {}
        background.abort_all();
        while background.join_next().await.is_some() {}
        stop_watches.cancel();
        while watches.join_next().await.is_some() {}
        tracing::info!("attacher stopped");
        Ok(())
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
