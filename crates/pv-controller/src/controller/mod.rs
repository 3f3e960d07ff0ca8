//! The persistentvolume controller on one client: watch caches of claims, volumes, classes and
//! pods; a pass syncs every volume, then every claim, whenever any of them changes, when an
//! operation ends, and every `--pvclaimbinder-sync-period`. A pass does the quick writes of
//! binding itself, one object after the other, as kcm's single claim and volume workers do;
//! provisioning and deletion, which wait for a cloud, run as operations beside it (at most
//! `--concurrent-operations`, one per claim or volume at a time).
//!
//! Writes are remembered (kcm's `storeObjectUpdate`): a pass that starts before the watch
//! delivered the controller's own last write reads the newer object it wrote, so it neither
//! repeats the write nor acts on a stale view.

pub(crate) mod bind;
mod changed;
pub(crate) mod index;
mod provision;
mod reclaim;
mod sync_claim;
mod sync_volume;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use component_runtime::workqueue::{Backoff, Failures};
use component_runtime::{ObjectCache, SharedCaches};
use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::{Api, Client, Resource};
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::config::Options;
use crate::events::Recorder;
use crate::metrics::{Counts, Metrics};
use crate::{Error, protection};

/// The reflectors (client-go informers) of the four kinds the controller reads. Nodes are read
/// on demand (only a WaitForFirstConsumer claim's selected node is ever needed).
#[derive(Debug, Clone)]
pub(crate) struct Caches {
    pub claims: ObjectCache<PersistentVolumeClaim>,
    pub volumes: ObjectCache<PersistentVolume>,
    pub classes: ObjectCache<StorageClass>,
    pub pods: ObjectCache<Pod>,
}

impl Caches {
    fn spawn(source: &SharedCaches) -> Self {
        Self {
            claims: source.all(),
            volumes: source.all(),
            classes: source.all(),
            pods: source.all(),
        }
    }

    async fn wait_until_ready(&self, timeout: Duration) -> Result<(), Error> {
        component_runtime::wait_all_ready(
            [
                self.claims.readiness(),
                self.volumes.readiness(),
                self.classes.readiness(),
                self.pods.readiness(),
            ],
            timeout,
        )
        .await?;
        Ok(())
    }
}

/// Objects the controller wrote, by key, until the watch delivers them (or something newer).
#[derive(Debug)]
struct Written<K>(Mutex<HashMap<String, Arc<K>>>);

impl<K> Default for Written<K> {
    fn default() -> Self {
        Self(Mutex::new(HashMap::new()))
    }
}

/// A resourceVersion as a number (etcd's revision); kcm compares them the same way to tell
/// which of two copies is newer.
fn rv_number<K: Resource>(obj: &K) -> Option<u64> {
    obj.meta().resource_version.as_deref()?.parse().ok()
}

impl<K: Resource + Clone> Written<K> {
    /// Forgets the writes of objects `exists` says are gone.
    fn prune(&self, mut exists: impl FnMut(&str) -> bool) {
        self.map().retain(|k, _| exists(k));
    }

    fn map(&self) -> MutexGuard<'_, HashMap<String, Arc<K>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn remember(&self, key: String, obj: K) -> Arc<K> {
        let obj = Arc::new(obj);
        self.map().insert(key, obj.clone());
        obj
    }

    /// The newer of the cached copy and the written one (none when the cache has none: the
    /// object is gone, or not seen yet, which the callers treat alike).
    fn newest(&self, key: &str, cached: Option<Arc<K>>) -> Option<Arc<K>> {
        let mut map = self.map();
        let Some(cached) = cached else {
            map.remove(key);
            return None;
        };
        if let Some(written) = map.get(key) {
            if rv_number(written.as_ref()) > rv_number(cached.as_ref()) {
                return Some(written.clone());
            }
            map.remove(key);
        }
        Some(cached)
    }
}

fn claim_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// Everything the syncs and operations need.
pub(crate) struct Ctx {
    pub client: Client,
    pub caches: Caches,
    pub options: Options,
    pub cloud: Option<Arc<dyn ebs_cloud::Cloud>>,
    pub events: Recorder,
    pub metrics: Arc<Metrics>,
    written_claims: Written<PersistentVolumeClaim>,
    written_volumes: Written<PersistentVolume>,
    /// Provisions and deletes in flight, by operation name (kcm's goroutinemap).
    running: Mutex<HashSet<String>>,
    /// Syncs and operations that failed, waiting out their backoff.
    failures: Failures,
    operations: Semaphore,
    /// Woken when an operation ends: its result wants a pass.
    wake: Notify,
    /// Selected nodes read lately, with when (a pass may ask for the same node per claim).
    nodes: Mutex<HashMap<String, (Instant, index::NodeInfo)>>,
}

/// How long a node read on demand is trusted.
const NODE_TTL: Duration = Duration::from_secs(5);

impl Ctx {
    pub(crate) fn claims_api(&self, namespace: &str) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client.clone(), namespace)
    }

    pub(crate) fn volumes_api(&self) -> Api<PersistentVolume> {
        Api::all(self.client.clone())
    }

    /// A claim, the newest copy known.
    pub(crate) fn claim(&self, namespace: &str, name: &str) -> Option<Arc<PersistentVolumeClaim>> {
        let key = claim_key(namespace, name);
        self.written_claims
            .newest(&key, self.caches.claims.get_namespaced(namespace, name))
    }

    /// A volume, the newest copy known.
    pub(crate) fn volume(&self, name: &str) -> Option<Arc<PersistentVolume>> {
        self.written_volumes
            .newest(name, self.caches.volumes.get(name))
    }

    /// Every volume, the newest copies known.
    pub(crate) fn volumes(&self) -> Vec<Arc<PersistentVolume>> {
        self.caches
            .volumes
            .list()
            .into_iter()
            .map(|v| {
                let name = v.metadata.name.clone().unwrap_or_default();
                self.written_volumes
                    .newest(&name, Some(v.clone()))
                    .unwrap_or(v)
            })
            .collect()
    }

    pub(crate) fn remember_claim(
        &self,
        claim: PersistentVolumeClaim,
    ) -> Arc<PersistentVolumeClaim> {
        let key = claim_key(
            claim.metadata.namespace.as_deref().unwrap_or_default(),
            claim.metadata.name.as_deref().unwrap_or_default(),
        );
        self.written_claims.remember(key, claim)
    }

    pub(crate) fn remember_volume(&self, volume: PersistentVolume) -> Arc<PersistentVolume> {
        let key = volume.metadata.name.clone().unwrap_or_default();
        self.written_volumes.remember(key, volume)
    }

    pub(crate) fn cached_node(&self, name: &str) -> Option<index::NodeInfo> {
        let nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        nodes
            .get(name)
            .filter(|(at, _)| at.elapsed() < NODE_TTL)
            .map(|(_, n)| n.clone())
    }

    pub(crate) fn cache_node(&self, node: index::NodeInfo) {
        let mut nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        if nodes.len() >= 4096 {
            nodes.retain(|_, (at, _)| at.elapsed() < NODE_TTL);
        }
        nodes.insert(node.name.clone(), (Instant::now(), node));
    }

    /// Starts `operation` unless one of the same name runs or backs off; it ends by waking a
    /// pass.
    pub(crate) fn start_operation<F>(self: &Arc<Self>, name: String, operation: F)
    where
        F: std::future::Future<Output = Result<(), Error>> + Send + 'static,
    {
        if self.failures.backing_off(&name, &()) {
            return;
        }
        {
            let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
            if !running.insert(name.clone()) {
                return;
            }
        }
        let ctx = self.clone();
        let span = tracing::info_span!("operation", operation = %name);
        tokio::spawn(async move {
            let result = {
                let _permit = ctx.operations.acquire().await;
                operation.instrument(span).await
            };
            if let Err(e) = &result {
                tracing::warn!(operation = %name, error = %e, "operation failed; retried with backoff");
            }
            ctx.failures.record(&name, (), result.is_ok());
            ctx.running
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&name);
            ctx.wake.notify_one();
        });
    }
}

/// The persistentvolume, pvc-protection and pv-protection controllers on one client.
pub(crate) struct Controller {
    client: Client,
    options: Options,
    cloud: Option<Arc<dyn ebs_cloud::Cloud>>,
    metrics: Arc<Metrics>,
    /// `None`: watch caches of its own, stopped with the controller.
    shared_caches: Option<SharedCaches>,
}

impl Controller {
    pub(crate) fn new(
        client: Client,
        options: Options,
        cloud: Option<Arc<dyn ebs_cloud::Cloud>>,
        metrics: Arc<Metrics>,
        shared_caches: Option<SharedCaches>,
    ) -> Self {
        Self {
            client,
            options,
            cloud,
            metrics,
            shared_caches,
        }
    }

    /// Runs until `shutdown`. Operations in flight are abandoned: each step is idempotent and
    /// the next leader finds their results in the API server and the cloud.
    pub(crate) async fn run(self, shutdown: CancellationToken) -> Result<(), Error> {
        let stop = shutdown.child_token();
        let _stop_caches = stop.clone().drop_guard();
        let source = self
            .shared_caches
            .clone()
            .unwrap_or_else(|| SharedCaches::private(self.client.clone(), stop.clone()));
        let caches = Caches::spawn(&source);
        // Before the first pass, which syncs everything: no change falls between the two.
        let changed = changed::Changed::subscribe(&caches);
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            r = caches.wait_until_ready(self.options.cache_sync_timeout) => r?,
        }
        let failures = Failures::new(Backoff {
            start: self.options.backoff_initial,
            max: self.options.backoff_max,
        });
        let ctx = Arc::new(Ctx {
            events: Recorder::new(self.client.clone()),
            client: self.client,
            caches,
            operations: Semaphore::new(self.options.concurrent_operations.max(1)),
            options: self.options,
            cloud: self.cloud,
            metrics: self.metrics,
            written_claims: Written::default(),
            written_volumes: Written::default(),
            running: Mutex::new(HashSet::new()),
            failures,
            wake: Notify::new(),
            nodes: Mutex::new(HashMap::new()),
        });
        tracing::info!(
            migrated = %ctx.options.migrated,
            cloud = ctx.cloud.is_some(),
            "persistentvolume controller started"
        );
        let mut changes = [
            ctx.caches.claims.changed(),
            ctx.caches.volumes.changed(),
            ctx.caches.classes.changed(),
            ctx.caches.pods.changed(),
        ];
        // Everything at start, every sync period (kcm's resync) and after an operation ended
        // (its outcome may concern any object); otherwise what changed and what is due a retry.
        let mut next_full = Instant::now();
        let mut operation_ended = false;
        loop {
            for rx in &mut changes {
                rx.borrow_and_update();
            }
            let dirty = changed.take();
            let due = ctx.failures.due();
            // An operation's retry is started by the sync of its object, which its name does
            // not say: those take a full pass, as every pass was before.
            let operation_due = due
                .iter()
                .any(|k| !k.starts_with("pv/") && !k.starts_with("pvc/"));
            if dirty.everything || operation_ended || operation_due || Instant::now() >= next_full {
                next_full = Instant::now() + ctx.options.sync_period;
                pass(&ctx, None).await;
            } else if !dirty.is_empty() || !due.is_empty() {
                pass(&ctx, Some((dirty, due))).await;
            }
            operation_ended = false;
            let now = Instant::now();
            let wait = ctx
                .failures
                .next_retry()
                .map_or(next_full, |at| at.min(next_full))
                .saturating_duration_since(now);
            let [a, b, c, d] = &mut changes;
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(wait.max(Duration::from_millis(10))) => {}
                () = ctx.wake.notified() => operation_ended = true,
                _ = a.changed() => {}
                _ = b.changed() => {}
                _ = c.changed() => {}
                _ = d.changed() => {}
            }
            // Let a burst of watch events land before the next pass.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    }
}

/// Objects synced side by side within a pass. kcm runs one volume and one claim worker, but
/// its workers see only objects that changed; a pass here visits every object, and one at a
/// time a burst of claims waited for each other's API round trips (a 1,000-claim burst spent
/// ~10 s between "PV created" and "claim Bound", docs/benchmarks.md). Two syncs never share
/// an object: each visits a different one, and the volume index hands a volume to one claim.
const SYNCS_IN_FLIGHT: usize = 16;

/// What a pass's claim syncs read, built once per pass.
pub(crate) struct PassView {
    /// The volumes, matched against claims; binds of this pass mark theirs.
    pub volumes: Mutex<index::VolumeIndex>,
    /// Unscheduled pods by the claim they use.
    pub unscheduled: HashMap<(String, String), Vec<String>>,
}

/// One pass: protection and sync of the volumes, then of the claims (`None`: every one; else
/// those `changed` names or concerns, and the keys due a retry with it); then the gauges.
async fn pass(ctx: &Arc<Ctx>, changed: Option<(changed::Dirty, Vec<String>)>) {
    let pods = ctx.caches.pods.list();
    let in_use = protection::pvc::claims_in_use(&pods);
    let mut counts = Counts::default();
    let all_volumes = ctx.volumes();
    let scope = changed.map(|(dirty, due)| Scope::of(dirty, due, &all_volumes));
    let volumes: Vec<_> = match &scope {
        None => all_volumes,
        Some(scope) => all_volumes
            .into_iter()
            .filter(|v| {
                scope
                    .volumes
                    .contains(v.metadata.name.as_deref().unwrap_or_default())
            })
            .collect(),
    };
    stream::iter(volumes)
        .for_each_concurrent(SYNCS_IN_FLIGHT, |volume| async move {
            let name = volume.metadata.name.clone().unwrap_or_default();
            let key = format!("pv/{name}");
            if ctx.failures.backing_off(&key, &()) {
                return;
            }
            let result = async {
                protection::pv::sync(&**ctx, &volume).await?;
                match ctx.volume(&name) {
                    Some(v) => sync_volume::sync_volume(ctx, v).await,
                    None => Ok(()),
                }
            }
            .instrument(tracing::debug_span!("sync_volume", volume = %name))
            .await;
            report(ctx, &key, result);
        })
        .await;
    // Built once, after the volumes' sync set their phases.
    let view = PassView {
        volumes: Mutex::new(index::VolumeIndex::new(&ctx.volumes())),
        unscheduled: protection::pvc::unscheduled_pods_by_claim(&pods),
    };
    drop(pods);
    let (view, in_use) = (&view, &in_use);
    let mut claims = ctx.caches.claims.list();
    if let Some(scope) = &scope {
        claims.retain(|c| scope.has_claim(c));
    }
    stream::iter(claims)
        .for_each_concurrent(SYNCS_IN_FLIGHT, |claim| async move {
            let namespace = claim.metadata.namespace.clone().unwrap_or_default();
            let name = claim.metadata.name.clone().unwrap_or_default();
            let key = format!("pvc/{namespace}/{name}");
            if ctx.failures.backing_off(&key, &()) {
                return;
            }
            let Some(claim) = ctx.claim(&namespace, &name) else {
                return;
            };
            let result = async {
                protection::pvc::sync(&**ctx, &claim, in_use).await?;
                match ctx.claim(&namespace, &name) {
                    Some(c) => sync_claim::sync_claim(ctx, c, view).await,
                    None => Ok(()),
                }
            }
            .instrument(tracing::debug_span!("sync_claim", claim = %format!("{namespace}/{name}")))
            .await;
            report(ctx, &key, result);
        })
        .await;
    for volume in ctx.volumes() {
        let class = index::volume_class(&volume);
        let bound = volume.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
        let map = if bound {
            &mut counts.bound_pv
        } else {
            &mut counts.unbound_pv
        };
        *map.entry(class).or_default() += 1;
    }
    for cached in ctx.caches.claims.list() {
        let namespace = cached.metadata.namespace.clone().unwrap_or_default();
        let name = cached.metadata.name.clone().unwrap_or_default();
        let claim = ctx.claim(&namespace, &name).unwrap_or(cached);
        let bound = claim.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
        let map = if bound {
            &mut counts.bound_pvc
        } else {
            &mut counts.unbound_pvc
        };
        *map.entry(namespace).or_default() += 1;
    }
    ctx.metrics.set_counts(&counts);
    ctx.written_volumes
        .prune(|name| ctx.caches.volumes.get(name).is_some());
    ctx.written_claims.prune(|key| {
        let (namespace, name) = key.split_once('/').unwrap_or_default();
        ctx.caches.claims.get_namespaced(namespace, name).is_some()
    });
}

/// The objects an incremental pass syncs.
struct Scope {
    volumes: HashSet<String>,
    claims: HashSet<(String, String)>,
    /// Every claim not bound yet, too.
    pending_claims: bool,
}

impl Scope {
    /// What `dirty` names or concerns, and the keys whose retry is `due`.
    fn of(dirty: changed::Dirty, due: Vec<String>, volumes: &[Arc<PersistentVolume>]) -> Self {
        let mut scope = Scope {
            volumes: dirty.volumes,
            claims: dirty.claims,
            pending_claims: dirty.unbound_volume,
        };
        for key in due {
            if let Some(name) = key.strip_prefix("pv/") {
                scope.volumes.insert(name.to_string());
            } else if let Some((namespace, name)) =
                key.strip_prefix("pvc/").and_then(|k| k.split_once('/'))
            {
                scope
                    .claims
                    .insert((namespace.to_string(), name.to_string()));
            }
        }
        // A claim's change concerns the volumes that name it (one pre-bound by a provisioner
        // is released when the claim goes before binding).
        for v in volumes {
            if let Some(r) = v.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) {
                let key = (
                    r.namespace.clone().unwrap_or_default(),
                    r.name.clone().unwrap_or_default(),
                );
                if scope.claims.contains(&key) {
                    scope
                        .volumes
                        .insert(v.metadata.name.clone().unwrap_or_default());
                }
            }
        }
        scope
    }

    fn has_claim(&self, claim: &PersistentVolumeClaim) -> bool {
        let key = (
            claim.metadata.namespace.clone().unwrap_or_default(),
            claim.metadata.name.clone().unwrap_or_default(),
        );
        if self.claims.contains(&key) {
            return true;
        }
        self.pending_claims
            && claim
                .spec
                .as_ref()
                .and_then(|s| s.volume_name.as_deref())
                .is_none_or(str::is_empty)
    }
}

fn report(ctx: &Ctx, key: &str, result: Result<(), Error>) {
    match &result {
        Ok(()) => {}
        Err(e) if e.is_conflict() => {
            tracing::debug!(object = %key, error = %e, "conflict; synced again after backoff");
        }
        Err(e) => tracing::warn!(object = %key, error = %e, "sync failed; retried with backoff"),
    }
    ctx.failures.record(key, (), result.is_ok());
}

/// A claim as the logs name it: `namespace/name`.
pub(crate) fn claim_name(claim: &PersistentVolumeClaim) -> String {
    format!(
        "{}/{}",
        claim.metadata.namespace.as_deref().unwrap_or_default(),
        claim.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The selected node, read on demand and kept for a few seconds (a node that is gone has no
/// labels: volumes with node affinity then do not match it).
pub(crate) async fn selected_node(ctx: &Ctx, name: &str) -> Result<index::NodeInfo, Error> {
    if let Some(node) = ctx.cached_node(name) {
        return Ok(node);
    }
    let api: Api<k8s_openapi::api::core::v1::Node> = Api::all(ctx.client.clone());
    let node = api
        .get_opt(name)
        .await
        .map_err(|e| Error::kube(format!("reading the selected node {name}"), e))?;
    let node = index::NodeInfo {
        name: name.to_string(),
        labels: node.and_then(|n| n.metadata.labels).unwrap_or_default(),
    };
    ctx.cache_node(node.clone());
    Ok(node)
}

/// The protection controllers write through the controller's client and hand it what they
/// wrote.
impl protection::Writer for Ctx {
    fn client(&self) -> &Client {
        &self.client
    }

    fn remember_volume(&self, volume: PersistentVolume) -> Arc<PersistentVolume> {
        Ctx::remember_volume(self, volume)
    }

    fn remember_claim(&self, claim: PersistentVolumeClaim) -> Arc<PersistentVolumeClaim> {
        Ctx::remember_claim(self, claim)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn pv(rv: &str) -> PersistentVolume {
        let mut v = PersistentVolume::default();
        v.metadata.name = Some("v".into());
        v.metadata.resource_version = Some(rv.into());
        v
    }

    #[test]
    fn the_newer_copy_wins_and_gone_objects_are_forgotten() {
        let written = Written::<PersistentVolume>::default();
        written.remember("v".into(), pv("10"));
        let rv = |o: Option<Arc<PersistentVolume>>| {
            o.unwrap().metadata.resource_version.clone().unwrap()
        };
        // The cache is behind: our write.
        assert_eq!(rv(written.newest("v", Some(Arc::new(pv("9"))))), "10");
        // The cache caught up (or went past): the cache, and the write is dropped.
        assert_eq!(rv(written.newest("v", Some(Arc::new(pv("11"))))), "11");
        assert!(written.map().is_empty());
        written.remember("v".into(), pv("12"));
        assert!(written.newest("v", None).is_none());
        assert!(written.map().is_empty());
        written.remember("v".into(), pv("13"));
        written.prune(|_| false);
        assert!(written.map().is_empty());
    }
}
