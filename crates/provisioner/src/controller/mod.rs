//! The controller: caches (reflector stores) of claims, volumes, classes, CSINodes and Nodes;
//! one queue of keys (`claim/<ns>/<name>`, `volume/<name>`); `--worker-threads` workers.

mod data_source;
mod delete_volume;
mod informers;
mod kube_io;
mod provision;
mod remembered;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use csi_spec::v1::CreateVolumeRequest;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, SecretReference};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass};
use kube::Client;
use kube::runtime::reflector::{ObjectRef, Store};
use prometheus_client::registry::Registry;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::Options;
use crate::csi::{Driver, Observer};
use crate::metrics::ControllerMetrics;
use crate::{Error, claim};
use component_runtime::object_cache::Change;
use component_runtime::workqueue::{Backoff, Outcome, SINGLE_LANE, WorkQueue};
pub use informers::Informers;
use remembered::Remembered;

const CLAIM_PREFIX: &str = "claim/";
const VOLUME_PREFIX: &str = "volume/";

/// A CreateVolume that may have made a volume we have no PV for yet: repeated (same name,
/// idempotent) until it gives a final answer, and the volume deleted if its claim is gone.
#[derive(Debug, Clone)]
pub(crate) struct InProgress {
    pub request: CreateVolumeRequest,
    pub claim_uid: String,
    pub deletion_secret: Option<SecretReference>,
    pub migrated: bool,
}

pub(crate) struct Ctx {
    pub client: Client,
    pub driver: Driver,
    pub options: Options,
    pub recorder: component_runtime::EventRecorder,
    pub metrics: ControllerMetrics,
    pub observer: Option<Observer>,
    pub queue: Arc<WorkQueue>,
    pub pvcs: Store<PersistentVolumeClaim>,
    pub pvs: Store<PersistentVolume>,
    pub classes: Store<StorageClass>,
    pub csinodes: Store<CSINode>,
    pub nodes: Store<Node>,
    /// `storage.kubernetes.io/csiProvisionerIdentity` of the volumes made by this run.
    pub identity: String,
    in_progress: Mutex<HashMap<String, InProgress>>,
    /// UIDs of PVs whose volume we deleted: the watch events of our own finalizer removal and
    /// delete must not call DeleteVolume again.
    pub deleted: Remembered,
    /// UIDs of PVs whose delete the API server accepted.
    pub pv_delete_accepted: Remembered,
    /// Names of PVs we created that the PV watch has not shown yet: a claim event arriving
    /// before the PV's (our own Event, a label change) must not call CreateVolume again.
    pub created_not_seen: Remembered,
    /// Claims handed back to the scheduler, with the resourceVersion they had: until the watch
    /// shows the claim without its selected node, the cached copy is stale and not acted on.
    rescheduled: Mutex<HashMap<String, String>>,
}

impl Ctx {
    /// Whether `key` at `resource_version` is the copy we already handed back to the scheduler.
    pub(crate) fn is_stale_rescheduled(&self, key: &str, resource_version: Option<&str>) -> bool {
        let mut r = self.rescheduled.lock().unwrap_or_else(|e| e.into_inner());
        match r.get(key) {
            Some(v) if Some(v.as_str()) == resource_version => true,
            Some(_) => {
                r.remove(key);
                false
            }
            None => false,
        }
    }

    pub(crate) fn remember_rescheduled(&self, key: &str, resource_version: Option<&str>) {
        if let Some(v) = resource_version {
            self.rescheduled
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(key.to_string(), v.to_string());
        }
    }

    pub(crate) fn in_progress(&self) -> MutexGuard<'_, HashMap<String, InProgress>> {
        // Plain map operations only: a panicking holder leaves it usable.
        self.in_progress.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The provisioning controller on a given client and driver.
pub struct Controller {
    client: Client,
    driver: Driver,
    options: Options,
    metrics: ControllerMetrics,
    observer: Option<Observer>,
    queue: Arc<WorkQueue>,
    /// Watch caches shared with other provisioners of this process; `None`: its own, started
    /// by `run`.
    informers: Option<Informers>,
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("driver", &self.driver.name)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl Controller {
    /// Registers the controller and work queue metrics in `registry`; `operations` (when
    /// given) records each CSI call in `csi_sidecar_operations_seconds`.
    pub fn new(
        client: Client,
        driver: Driver,
        options: Options,
        registry: &mut Registry,
        operations: Option<component_runtime::OperationMetrics>,
    ) -> Self {
        let metrics = ControllerMetrics::register(registry);
        let queue = crate::metrics::work_queue(
            registry,
            Backoff {
                start: options.retry_interval_start,
                max: options.retry_interval_max,
            },
        );
        let observer: Option<Observer> = operations.map(|ops| {
            Arc::new(move |method: &str, code, took, migrated| {
                ops.observe(method, code, took, migrated);
            }) as Observer
        });
        Self {
            informers: None,
            client,
            driver,
            options,
            metrics,
            observer,
            queue,
        }
    }

    /// Reads the claims, volumes, classes, CSINodes and Nodes from `informers`, shared with
    /// the other provisioners of this process, instead of watching them itself.
    pub fn with_informers(mut self, informers: Informers) -> Self {
        self.informers = Some(informers);
        self
    }

    /// The driver's name.
    pub fn driver_name(&self) -> &str {
        &self.driver.name
    }

    /// Watches and works until `shutdown`; operations in flight finish first.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), Error> {
        if !self.driver.capabilities.create_delete_volume {
            return Err(Error::Driver {
                driver: self.driver.name.clone(),
                reason: "it does not announce the CREATE_DELETE_VOLUME controller capability; there is nothing to provision".into(),
            });
        }
        // Everything this run starts stops with it, also when it returns early with an error.
        let stop = shutdown.child_token();
        let _stop_on_return = stop.clone().drop_guard();
        // A provisioner run alone watches for itself: the same informers, with one subscriber.
        let informers = match self.informers {
            Some(shared) => shared,
            None => Informers::spawn(&self.client, &tokio::runtime::Handle::current(), &stop),
        };
        let component = format!(
            "{}_{}",
            self.driver.name,
            component_runtime::default_identity()
        );
        let identity = crate::pv::identity(&self.driver.name);
        let ctx = Arc::new(Ctx {
            recorder: component_runtime::EventRecorder::new(self.client.clone(), component),
            queue: self.queue,
            client: self.client,
            driver: self.driver,
            options: self.options,
            metrics: self.metrics,
            observer: self.observer,
            pvcs: informers.pvcs.store(),
            pvs: informers.pvs.store(),
            classes: informers.classes.store(),
            csinodes: informers.csinodes.store(),
            nodes: informers.nodes.store(),
            identity,
            in_progress: Mutex::new(HashMap::new()),
            deleted: Remembered::default(),
            pv_delete_accepted: Remembered::default(),
            created_not_seen: Remembered::default(),
            rescheduled: Mutex::default(),
        });
        let c = ctx.clone();
        let on_claim = move |change: Change<'_, PersistentVolumeClaim>| match change {
            Change::Applied(pvc) | Change::Deleted(pvc) => {
                c.queue.add(&claim_key(pvc), SINGLE_LANE);
            }
            Change::Relisted => requeue_all(&c),
        };
        let c = ctx.clone();
        let on_volume = move |change: Change<'_, PersistentVolume>| match change {
            Change::Applied(pv) | Change::Deleted(pv) => volume_changed(&c, pv),
            Change::Relisted => requeue_all(&c),
        };
        let c = ctx.clone();
        let on_class = move |change: Change<'_, StorageClass>| match change {
            Change::Applied(class) | Change::Deleted(class) => requeue_claims_of(&c, class),
            Change::Relisted => requeue_all(&c),
        };
        // Held until this run ends: dropping them unsubscribes. Subscribed before the wait,
        // so no change after the first lists is missed; what they held is queued below.
        let _subscriptions = [
            informers.pvcs.subscribe(on_claim),
            informers.pvs.subscribe(on_volume),
            informers.classes.subscribe(on_class),
        ];
        let ready = informers.wait_until_ready();
        tokio::select! {
            () = stop.cancelled() => {}
            r = ready => {
                r.map_err(|e| Error::Watch(format!("the caches never filled: {e}")))?;
                requeue_all(&ctx);
                tracing::info!(driver = %ctx.driver.name, workers = ctx.options.workers, "caches filled; provisioning");
            }
        }
        let mut workers = JoinSet::new();
        for _ in 0..ctx.options.workers {
            let c = ctx.clone();
            let stop = stop.clone();
            workers.spawn(async move {
                while let Some(item) = c.queue.next(SINGLE_LANE).await {
                    // Shutdown abandons the operation in hand, as the Go sidecar's exit does:
                    // every step is idempotent and is repeated by the next run.
                    let outcome = tokio::select! {
                        o = process(&c, &item.key) => o,
                        () = stop.cancelled() => break,
                    };
                    c.queue.done(&item, outcome);
                    if outcome == Outcome::Done && is_gone(&c, &item.key) {
                        // The queue remembers every key it handed out; drop a deleted object's.
                        c.queue.forget_if_idle(&item.key);
                    }
                }
            });
        }
        stop.cancelled().await;
        ctx.queue.shut_down();
        while workers.join_next().await.is_some() {}
        Ok(())
    }
}

pub(crate) fn claim_key(pvc: &PersistentVolumeClaim) -> String {
    format!(
        "{CLAIM_PREFIX}{}/{}",
        pvc.metadata.namespace.as_deref().unwrap_or_default(),
        pvc.metadata.name.as_deref().unwrap_or_default()
    )
}

/// A volume was added, changed or deleted: the store has it now (claim syncs find it there).
fn volume_changed(ctx: &Ctx, pv: &PersistentVolume) {
    let name = pv.metadata.name.as_deref().unwrap_or_default();
    ctx.created_not_seen.remove(name);
    ctx.queue
        .add(&format!("{VOLUME_PREFIX}{name}"), SINGLE_LANE);
}

/// Everything may have changed (the first lists, or a re-list after a watch error): every
/// claim and volume in the caches is looked at again, and so is every claim with a CreateVolume
/// in flight, since one deleted while the watch was down is no longer in the cache to say so
/// (its sync finds it gone and deletes the volume made for it).
fn requeue_all(ctx: &Ctx) {
    for pvc in ctx.pvcs.state() {
        ctx.queue.add(&claim_key(&pvc), SINGLE_LANE);
    }
    for pv in ctx.pvs.state() {
        volume_changed(ctx, &pv);
    }
    let in_flight: Vec<String> = ctx.in_progress().keys().cloned().collect();
    for key in in_flight {
        ctx.queue.add(&key, SINGLE_LANE);
    }
}

/// A class appeared or changed: its pending claims may be provisionable now.
fn requeue_claims_of(ctx: &Ctx, class: &StorageClass) {
    let name = class.metadata.name.as_deref();
    for pvc in ctx.pvcs.state() {
        let unbound = pvc
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.as_deref())
            .is_none_or(str::is_empty);
        if unbound && claim::class_name(&pvc) == name {
            ctx.queue.add(&claim_key(&pvc), SINGLE_LANE);
        }
    }
}

/// Is `key`'s object absent from the cache (deleted, as far as the watch knows)?
fn is_gone(ctx: &Ctx, key: &str) -> bool {
    if let Some(rest) = key.strip_prefix(CLAIM_PREFIX) {
        let (ns, name) = rest.split_once('/').unwrap_or(("", rest));
        ctx.pvcs.get(&ObjectRef::new(name).within(ns)).is_none()
    } else if let Some(name) = key.strip_prefix(VOLUME_PREFIX) {
        ctx.pvs.get(&ObjectRef::new(name)).is_none()
    } else {
        true
    }
}

async fn process(ctx: &Arc<Ctx>, key: &str) -> Outcome {
    if let Some(rest) = key.strip_prefix(CLAIM_PREFIX) {
        let (ns, name) = rest.split_once('/').unwrap_or(("", rest));
        provision::sync_claim(ctx, key, ns, name).await
    } else if let Some(name) = key.strip_prefix(VOLUME_PREFIX) {
        delete_volume::sync_volume(ctx, key, name).await
    } else {
        Outcome::Done
    }
}
