//! The volume manager (the kubelet's `volumemanager`): desired state from the pods bound to
//! this node, actual state from what was staged and published (rebuilt from disk at start),
//! and the reconciler between them; plus `node.status.volumesInUse`, pod Ready once the
//! volumes are there, the confirmation of a pod's deletion once they are gone, and volume
//! stats.

pub mod cache;
mod in_use;
pub mod operations;
pub mod paths;
mod pod_events;
mod populator;
mod reconciler;
pub mod reconstruct;
mod stats;
pub mod volume_spec;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use component_runtime::EventRecorder;
use component_runtime::{ObjectCache, ScopedPolicy};
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};
use kube::Client;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use volume_plugins::CsiPlugin;

use crate::config::Options;
use crate::drivers::DriverRegistry;
use crate::metrics::{Metrics, PvcLabels};
use crate::podstatus;
use operations::OpContext;
use paths::Paths;
use reconciler::{OpOutcome, PassInput, Reconciler, ReconcilerOptions};
use stats::StatsTarget;

/// The watch caches the volume manager reads.
#[derive(Clone)]
pub struct Caches {
    /// Pods bound to this node (field selector `spec.nodeName`).
    pub pods: ObjectCache<Pod>,
    pub pvcs: ObjectCache<PersistentVolumeClaim>,
    pub pvs: ObjectCache<PersistentVolume>,
    /// This node only (field selector `metadata.name`).
    pub node: ObjectCache<Node>,
    pub csidrivers: ObjectCache<CSIDriver>,
    pub vas: ObjectCache<VolumeAttachment>,
}

/// A scoped cache of a cluster-scoped kind: only the objects asked for, read with GETs (what
/// the Node authorizer lets a node read).
pub(crate) fn scoped_cluster_cache<K>(client: &Client, stop: &CancellationToken) -> ObjectCache<K>
where
    K: component_runtime::CachedKind,
{
    let c = client.clone();
    ObjectCache::spawn_scoped(
        move |_| kube::Api::all(c.clone()),
        ScopedPolicy::default(),
        stop.clone(),
    )
}

impl Caches {
    /// Starts the watches for node `node_name`.
    pub fn spawn(client: &Client, node_name: &str, stop: &CancellationToken) -> Self {
        use kube::Api;
        use kube::runtime::watcher;
        let all = watcher::Config::default;
        Self {
            pods: ObjectCache::spawn(
                Api::all(client.clone()),
                all().fields(&format!("spec.nodeName={node_name}")),
                stop.clone(),
            ),
            // The claims and volumes of this node's pods only, fetched as they are asked for
            // (the kubelet's GETs, all the Node authorizer lets a node read): memory follows
            // the node's pods, not the cluster. A new pod's claim and volume are used only as
            // read after the pod was first seen (`volume_spec::unread_claim`), never from an
            // older copy.
            pvcs: {
                let c = client.clone();
                ObjectCache::spawn_scoped(
                    move |ns| Api::namespaced(c.clone(), ns.unwrap_or("default")),
                    ScopedPolicy::default(),
                    stop.clone(),
                )
            },
            pvs: scoped_cluster_cache(client, stop),
            node: ObjectCache::spawn(
                Api::all(client.clone()),
                all().fields(&format!("metadata.name={node_name}")),
                stop.clone(),
            ),
            csidrivers: ObjectCache::spawn(Api::all(client.clone()), all(), stop.clone()),
            // This node's VolumeAttachments only, fetched as they are asked for; the wait for
            // attach reads one fresh before a mount relies on it (`ObjectCache::refresh`).
            vas: scoped_cluster_cache(client, stop),
        }
    }

    /// Waits for every cache's first list.
    pub async fn wait_until_ready(&self, timeout: Duration) -> Result<(), crate::Error> {
        component_runtime::wait_all_ready(
            [
                self.pods.readiness(),
                self.pvcs.readiness(),
                self.pvs.readiness(),
                self.node.readiness(),
                self.csidrivers.readiness(),
                self.vas.readiness(),
            ],
            timeout,
        )
        .await?;
        Ok(())
    }
}

/// The volume manager of one node.
pub struct VolumeManager {
    client: Client,
    options: Options,
    drivers: DriverRegistry,
    caches: Caches,
    recorder: Arc<EventRecorder>,
    metrics: Metrics,
    dev_root: std::path::PathBuf,
    stuck_event_after: Duration,
    stats_period: Duration,
}

impl VolumeManager {
    pub fn new(
        client: Client,
        options: Options,
        drivers: DriverRegistry,
        caches: Caches,
        recorder: Arc<EventRecorder>,
        metrics: Metrics,
    ) -> Self {
        Self {
            dev_root: options.dev_root.clone(),
            stuck_event_after: options.stuck_event_after,
            stats_period: options.volume_stats_period,
            client,
            options,
            drivers,
            caches,
            recorder,
            metrics,
        }
    }

    /// Runs until `stop`.
    pub async fn run(self, stop: CancellationToken) {
        let paths = Paths::new(&self.options.root_dir);
        let (asw, found) = reconstruct::reconstruct(&paths).await;
        tracing::info!(
            staged = found.staged,
            published = found.published,
            uncertain = found.uncertain,
            "reconstructed the actual state from {}",
            paths.root().display()
        );
        let node_name = self.options.node_name.clone();
        let csi = CsiPlugin::new(
            self.client.clone(),
            self.caches.csidrivers.clone(),
            self.caches.vas.clone(),
            self.options.skip_attach,
        );
        let ctx = Arc::new(OpContext {
            client: self.client.clone(),
            node_name: node_name.clone(),
            paths: paths.clone(),
            csi,
            csidrivers: self.caches.csidrivers.clone(),
            drivers: self.drivers.clone(),
            csi_timeout: self.options.csi_timeout,
            attach_timeout: self.options.attach_timeout,
            dev_root: self.dev_root.clone(),
            running: Arc::new(tokio::sync::Semaphore::new(
                operations::DEFAULT_MAX_CONCURRENT_OPERATIONS,
            )),
            tokens: operations::sa_tokens::TokenCache::default(),
        });
        let (results_tx, mut results) = mpsc::unbounded_channel();
        let mut reconciler = Reconciler::new(
            ctx,
            ReconcilerOptions {
                backoff_initial: self.options.backoff_initial,
                backoff_max: self.options.backoff_max,
                stuck_event_after: self.stuck_event_after,
                republish_period: self.options.sync_frequency,
            },
            asw,
            results_tx,
            pod_events::PodEvents::new(self.recorder.clone()),
            self.metrics.clone(),
            self.caches.vas.clone(),
        );

        let (in_use_tx, in_use_rx) = watch::channel(BTreeSet::new());
        let (reported_tx, mut reported_rx) = watch::channel(BTreeSet::new());
        tokio::spawn(in_use::report_in_use(
            self.client.clone(),
            node_name.clone(),
            in_use_rx,
            reported_tx,
            stop.clone(),
        ));
        let (stats_tx, stats_rx) = watch::channel(BTreeMap::new());
        tokio::spawn(stats::collect(
            self.drivers.clone(),
            self.metrics.clone(),
            stats_rx,
            self.stats_period,
            stop.clone(),
        ));

        let mut statuses = podstatus::StatusManager::new(self.client.clone());

        let mut pods_changed = self.caches.pods.changed();
        let mut pvcs_changed = self.caches.pvcs.changed();
        let mut pvs_changed = self.caches.pvs.changed();
        let mut node_changed = self.caches.node.changed();
        let mut csidrivers_changed = self.caches.csidrivers.changed();
        let mut drivers_changed = self.drivers.subscribe();
        let period = self.options.reconciler_sync_period;
        // Outcomes received while waiting, applied at the top of the next pass.
        let mut early: Vec<OpOutcome> = Vec::new();
        let mut first_pass = true;
        // Orphaned pod dirs are looked for at start and then now and then (the kubelet's
        // cleanupOrphanedPodDirs): a pod whose last volume was torn down just before a crash
        // left its empty dirs behind, and nothing else would ever remove them.
        let mut next_orphan_sweep = std::time::Instant::now();
        // When each pod was first seen: its claims are used only as read since then.
        let mut first_seen: std::collections::HashMap<String, std::time::Instant> =
            std::collections::HashMap::new();

        loop {
            // One snapshot of the pod cache per pass: the desired state, the deletions to
            // confirm and the orphan sweep all read the same pods.
            let cached = self.caches.pods.list();
            let now = std::time::Instant::now();
            for uid in cached.iter().filter_map(|p| p.metadata.uid.as_ref()) {
                if !first_seen.contains_key(uid) {
                    first_seen.insert(uid.clone(), now);
                }
            }
            let dsw = {
                let ctx = volume_spec::SpecContext {
                    pvcs: &self.caches.pvcs,
                    pvs: &self.caches.pvs,
                    csidrivers: &self.caches.csidrivers,
                    migrated: &self.options.migrated,
                    first_seen: Some(&first_seen),
                };
                populator::populate(&ctx, cached.iter())
            };
            while let Some(outcome) = early.pop().or_else(|| results.try_recv().ok()) {
                let finished_pod = match &outcome {
                    OpOutcome::Unpublish { volume, result, .. } if result.is_ok() => {
                        Some(volume.pod_uid.clone())
                    }
                    _ => None,
                };
                reconciler.finished(outcome, &dsw);
                if let Some(uid) = finished_pod
                    && dsw.pod(&uid).is_none()
                    && reconciler.pod_torn_down(&uid)
                {
                    remove_empty_tree(&paths.pod_dir(&uid)).await;
                }
            }
            statuses.collect_done();
            let want = reconciler.volumes_in_use(&dsw);
            if first_pass {
                // Always notifies: the reporter waits for this first value.
                in_use_tx.send_replace(want);
                first_pass = false;
            } else {
                in_use_tx.send_if_modified(|cur| {
                    if *cur == want {
                        false
                    } else {
                        *cur = want;
                        true
                    }
                });
            }
            let reported = reported_rx.borrow_and_update().clone();
            let node = self.caches.node.get(&node_name);
            reconciler.pass(&PassInput {
                dsw: &dsw,
                node,
                reported_in_use: &reported,
            });

            // Pods whose volumes are all there become Ready.
            for pod in dsw.pods() {
                if reconciler.pod_volumes_ready(pod) {
                    statuses.post_ready(&pod.pod, &pod.uid, reconciler.pod_volume_paths(pod));
                }
            }
            // Pods being deleted whose volumes are gone: confirm the deletion.
            for pod in &cached {
                let Some(uid) = pod.metadata.uid.as_deref() else {
                    continue;
                };
                if pod.metadata.deletion_timestamp.is_some() && reconciler.pod_torn_down(uid) {
                    statuses.confirm_deletion(pod.clone(), uid);
                }
            }
            let alive: std::collections::HashSet<String> = cached
                .iter()
                .filter_map(|p| p.metadata.uid.clone())
                .collect();
            statuses.retain(&alive);
            first_seen.retain(|uid, _| alive.contains(uid));
            if std::time::Instant::now() >= next_orphan_sweep {
                next_orphan_sweep = std::time::Instant::now() + ORPHAN_SWEEP_PERIOD;
                for uid in orphaned_pod_dirs(&paths, &alive, &reconciler).await {
                    tracing::info!(pod_uid = %uid, "removing the empty dirs of a pod that is gone");
                    remove_empty_tree(&paths.pod_dir(&uid)).await;
                }
            }

            stats_tx.send_if_modified(|cur| {
                let want = stats_targets(&dsw, &reconciler);
                if *cur == want {
                    false
                } else {
                    *cur = want;
                    true
                }
            });

            let retry = reconciler
                .next_retry()
                .map(|t| t.saturating_duration_since(std::time::Instant::now()))
                .unwrap_or(period)
                .min(period.max(Duration::from_millis(1)));
            tokio::select! {
                () = stop.cancelled() => break,
                Some(outcome) = results.recv() => early.push(outcome),
                Some((uid, ok)) = statuses.next_done() => statuses.done(&uid, ok),
                _ = pods_changed.changed() => {}
                _ = pvcs_changed.changed() => {}
                _ = pvs_changed.changed() => {}
                _ = node_changed.changed() => {}
                _ = csidrivers_changed.changed() => {}
                _ = drivers_changed.changed() => {}
                _ = reported_rx.changed() => {}
                () = tokio::time::sleep(retry) => {}
            }
        }
    }
}

/// How often orphaned pod dirs are looked for.
const ORPHAN_SWEEP_PERIOD: Duration = Duration::from_secs(5);

/// Pod dirs of pods that are not in the cache and have nothing published here.
async fn orphaned_pod_dirs(
    paths: &Paths,
    alive: &std::collections::HashSet<String>,
    reconciler: &Reconciler,
) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(mut rd) = tokio::fs::read_dir(paths.pods_dir()).await else {
        return out;
    };
    while let Ok(Some(e)) = rd.next_entry().await {
        let Some(uid) = e.file_name().to_str().map(str::to_string) else {
            continue;
        };
        if !alive.contains(&uid) && reconciler.pod_torn_down(&uid) {
            out.push(uid);
        }
    }
    out
}

/// PVC volumes published into pods, to measure.
fn stats_targets(
    dsw: &cache::DesiredStateOfWorld,
    reconciler: &Reconciler,
) -> BTreeMap<PvcLabels, StatsTarget> {
    let mut out = BTreeMap::new();
    for pod in dsw.pods() {
        let claims: BTreeMap<&str, &str> = pod
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.volumes.as_ref())
            .map(|vs| {
                vs.iter()
                    .filter_map(|v| {
                        v.persistent_volume_claim
                            .as_ref()
                            .map(|c| (v.name.as_str(), c.claim_name.as_str()))
                    })
                    .collect()
            })
            .unwrap_or_default();
        for v in &pod.volumes {
            let (Some(claim), Some(c)) = (claims.get(v.outer_name.as_str()), v.csi()) else {
                continue;
            };
            if c.block {
                continue;
            }
            let Some(mounted) = reconciler.asw.mounted(&v.unique_name, &pod.uid) else {
                continue;
            };
            out.insert(
                PvcLabels {
                    namespace: pod.namespace().to_string(),
                    persistentvolumeclaim: claim.to_string(),
                },
                StatsTarget {
                    driver: c.driver.clone(),
                    volume_handle: c.handle.clone(),
                    path: mounted.host_path.display().to_string(),
                },
            );
        }
    }
    out
}

/// Removes `dir` and everything below it that is an empty directory; stops at anything
/// else (a file, a mount point that is not empty), so nothing mounted is ever touched.
async fn remove_empty_tree(dir: &std::path::Path) {
    fn walk(dir: &std::path::Path) -> bool {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return false;
        };
        let mut empty = true;
        for e in entries.flatten() {
            let is_dir = e.file_type().map(|t| t.is_dir()).unwrap_or(false);
            if !(is_dir && walk(&e.path())) {
                empty = false;
            }
        }
        empty && std::fs::remove_dir(dir).is_ok()
    }
    let dir = dir.to_path_buf();
    let _ = tokio::task::spawn_blocking(move || walk(&dir)).await;
}
