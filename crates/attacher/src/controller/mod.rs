//! The controller: caches (reflectors) of VolumeAttachments, PVs and CSINodes, the attach,
//! detach and PV queues with their workers, periodic resync and the reconciler.

mod watch;
mod workers;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use kube::runtime::reflector::{self};
use kube::{Api, Client};
use prometheus_client::registry::Registry;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::Options;
use crate::csi::CsiClient;
use crate::handler::{CsiHandler, Handler, TrivialHandler};
use crate::metrics::{CsiCallObserver, Metrics};
use crate::names::{DUMMY_DRIVER, finalizer_name};
use crate::{Error, reconciler};
use component_runtime::workqueue::{Backoff, WorkQueue};

use crate::context::events::VaEvents;
use crate::context::fresh::Fresh;
use crate::context::{ATTACH, Capabilities, Ctx, DETACH};

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
