//! The scheduling loop: watch caches of pods, nodes, claims, volumes, classes and CSINodes; a
//! pass over the pending pods whenever one of them changes, when a backoff ends, and every
//! resync period. Each pod is tried against a snapshot taken at the start of the pass; the
//! fitting node with the fewest pods wins (ties: the first name), and the pod is bound through
//! `pods/binding`.
//!
//! A pod with WaitForFirstConsumer claims is not bound at once: the chosen node is written to
//! each claim's `volume.kubernetes.io/selected-node` (the provisioner creates the volume
//! there) and the pod waits, counted on that node, until every claim is Bound; then it is
//! bound. If the provisioner gives the node back (it removes the annotation) or the claims
//! are not bound within the bind timeout, the pod is tried again from the start.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use component_runtime::{EventRecorder, EventType};
use component_runtime::{ObjectCache, SharedCaches};
use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource as _};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::config::Config;
use crate::filters::{self, Snapshot, claim_names, limits, node, pod_key, volumes};
use crate::message;
use crate::metrics::{Metrics, Outcome, Pending};
use crate::{ANN_SELECTED_NODE, Error};

struct Caches {
    pods: ObjectCache<Pod>,
    nodes: ObjectCache<Node>,
    claims: ObjectCache<PersistentVolumeClaim>,
    volumes: ObjectCache<PersistentVolume>,
    classes: ObjectCache<StorageClass>,
    csinodes: ObjectCache<CSINode>,
}

impl Caches {
    fn spawn(source: &SharedCaches) -> Self {
        Self {
            pods: source.all(),
            nodes: source.all(),
            claims: source.all(),
            volumes: source.all(),
            classes: source.all(),
            csinodes: source.all(),
        }
    }

    async fn wait_until_ready(&self, timeout: Duration) -> Result<(), Error> {
        component_runtime::wait_all_ready(
            [
                self.pods.readiness(),
                self.nodes.readiness(),
                self.claims.readiness(),
                self.volumes.readiness(),
                self.classes.readiness(),
                self.csinodes.readiness(),
            ],
            timeout,
        )
        .await?;
        Ok(())
    }
}

/// A pod that failed, and when it may be tried again.
struct Backoff {
    uid: String,
    attempts: u32,
    retry_at: Instant,
}

/// The binding cycle's writes for one pod, decided in the scheduling cycle. kube-scheduler
/// binds asynchronously while it goes on scheduling; here a pass decides for every pending pod
/// first (against one snapshot that counts each decision), then sends the writes side by side:
/// one at a time, a burst of 1,000 pods waited ~3 s for its node to be chosen.
enum Binding {
    /// `pods/binding` to the node.
    Bind { pod: Arc<Pod>, node: String },
    /// The node handed to the provisioner on each claim, then the pod waits for them.
    SelectNode {
        pod: Arc<Pod>,
        node: String,
        claims: Vec<Arc<PersistentVolumeClaim>>,
    },
}

/// How a [`Binding`]'s writes went.
enum Bound {
    Done {
        pod: Arc<Pod>,
        node: String,
    },
    /// Bound by someone else, or deleted: the watch brings the news.
    Refused {
        pod: Arc<Pod>,
    },
    BindFailed {
        pod: Arc<Pod>,
    },
    Selected {
        pod: Arc<Pod>,
        node: String,
    },
    SelectFailed {
        pod: Arc<Pod>,
    },
}

/// Bindings sent at once.
const BINDINGS_IN_FLIGHT: usize = 16;

/// A pod whose node is chosen and whose WaitForFirstConsumer claims are being provisioned.
struct Waiting {
    uid: String,
    node: String,
    since: Instant,
}

pub(crate) struct Scheduler {
    client: Client,
    config: Config,
    caches: Caches,
    events: EventRecorder,
    metrics: Arc<Metrics>,
    backoff: HashMap<String, Backoff>,
    waiting: HashMap<String, Waiting>,
    /// Pods bound by us that the pod cache does not show bound yet, with their node.
    assumed: HashMap<String, (String, Arc<Pod>)>,
    /// Active pods on nodes at the last pass: fewer now means room was freed.
    last_bound_count: usize,
}

fn uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

fn node_name_of(pod: &Pod) -> Option<&str> {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
}

fn selected_node(claim: &PersistentVolumeClaim) -> Option<&str> {
    claim
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANN_SELECTED_NODE))
        .map(String::as_str)
}

impl Scheduler {
    pub(crate) async fn start(
        client: Client,
        config: Config,
        metrics: Arc<Metrics>,
        shutdown: &CancellationToken,
    ) -> Result<Option<Self>, Error> {
        let source = config
            .shared_caches
            .clone()
            .unwrap_or_else(|| SharedCaches::private(client.clone(), shutdown.clone()));
        let caches = Caches::spawn(&source);
        tokio::select! {
            () = shutdown.cancelled() => return Ok(None),
            r = caches.wait_until_ready(config.cache_sync_timeout) => r?,
        }
        Ok(Some(Self {
            events: EventRecorder::new(client.clone(), config.scheduler_name.clone()),
            client,
            config,
            caches,
            metrics,
            backoff: HashMap::new(),
            waiting: HashMap::new(),
            assumed: HashMap::new(),
            last_bound_count: 0,
        }))
    }

    /// Runs passes until `shutdown`.
    pub(crate) async fn run(mut self, shutdown: CancellationToken) -> Result<(), Error> {
        tracing::info!(scheduler = %self.config.scheduler_name, "scheduler started");
        let mut pods = self.caches.pods.changed();
        let mut others = [
            self.caches.nodes.changed(),
            self.caches.claims.changed(),
            self.caches.volumes.changed(),
            self.caches.classes.changed(),
            self.caches.csinodes.changed(),
        ];
        loop {
            pods.borrow_and_update();
            for rx in &mut others {
                rx.borrow_and_update();
            }
            self.pass().await;
            let now = Instant::now();
            let next = self
                .backoff
                .values()
                .filter(|b| b.retry_at > now)
                .map(|b| b.retry_at.saturating_duration_since(now))
                .min()
                .unwrap_or(self.config.resync_period)
                .min(self.config.resync_period)
                .max(Duration::from_millis(10));
            let [a, b, c, d, e] = &mut others;
            let world_changed = tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(next) => false,
                _ = pods.changed() => false,
                _ = a.changed() => true,
                _ = b.changed() => true,
                _ = c.changed() => true,
                _ = d.changed() => true,
                _ = e.changed() => true,
            };
            if world_changed {
                // kube-scheduler moves unschedulable pods back to the active queue on a cluster
                // event that may make them fit; the attempts (and so the next backoff) stay.
                self.flush_backoff();
            }
            // Let a burst of watch events land before the next pass.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    }

    fn flush_backoff(&mut self) {
        let now = Instant::now();
        for b in self.backoff.values_mut() {
            b.retry_at = b.retry_at.min(now);
        }
    }

    fn is_pending_for_us(&self, pod: &Pod) -> bool {
        let Some(spec) = pod.spec.as_ref() else {
            return false;
        };
        let ours = spec
            .scheduler_name
            .as_deref()
            .filter(|n| !n.is_empty())
            .unwrap_or(crate::DEFAULT_SCHEDULER_NAME)
            == self.config.scheduler_name;
        ours && node_name_of(pod).is_none()
            && pod.metadata.deletion_timestamp.is_none()
            && filters::is_active(pod)
    }

    async fn pass(&mut self) {
        let pods = self.caches.pods.list();
        // Assumed pods leave once the cache shows them bound (or gone).
        let by_key: HashMap<String, &Arc<Pod>> = pods.iter().map(|p| (pod_key(p), p)).collect();
        self.assumed.retain(|key, (_, pod)| {
            by_key
                .get(key)
                .is_some_and(|p| uid(p) == uid(pod) && node_name_of(p).is_none())
        });
        let bound_count = pods
            .iter()
            .filter(|p| node_name_of(p).is_some() && filters::is_active(p))
            .count();
        if bound_count < self.last_bound_count {
            self.flush_backoff();
        }
        self.last_bound_count = bound_count;

        let mut pending: Vec<Arc<Pod>> = pods
            .iter()
            .filter(|p| self.is_pending_for_us(p))
            .cloned()
            .collect();
        pending.sort_by(|a, b| {
            let t = |p: &Pod| p.metadata.creation_timestamp.as_ref().map(|t| t.0);
            t(a.as_ref())
                .cmp(&t(b.as_ref()))
                .then_with(|| pod_key(a).cmp(&pod_key(b)))
        });
        let pending_keys: HashMap<String, String> =
            pending.iter().map(|p| (pod_key(p), uid(p))).collect();
        let still_pending = |key: &String, u: &String| pending_keys.get(key) == Some(u);
        self.backoff.retain(|k, b| still_pending(k, &b.uid));
        self.waiting.retain(|k, w| still_pending(k, &w.uid));

        let mut snapshot = Snapshot::new(
            self.caches.nodes.list(),
            self.caches.claims.list(),
            self.caches.volumes.list(),
            self.caches.classes.list(),
            self.caches.csinodes.list(),
            &pods,
        );
        for (node, pod) in self.assumed.values() {
            snapshot.assume(pod.clone(), node);
        }
        for pod in &pending {
            if let Some(w) = self.waiting.get(&pod_key(pod)) {
                snapshot.assume(pod.clone(), &w.node);
            }
        }

        let now = Instant::now();
        let mut counts = Pending::default();
        let mut bindings = Vec::new();
        for pod in &pending {
            let key = pod_key(pod);
            let gated = pod
                .spec
                .as_ref()
                .and_then(|s| s.scheduling_gates.as_ref())
                .is_some_and(|g| !g.is_empty());
            if gated {
                counts.gated += 1;
                continue;
            }
            if self.assumed.contains_key(&key) {
                continue;
            }
            if self.waiting.contains_key(&key) {
                if let Some(b) = self.continue_waiting(pod, &snapshot).await {
                    bindings.push(b);
                }
                continue;
            }
            if self.backoff.get(&key).is_some_and(|b| b.retry_at > now) {
                counts.backoff += 1;
                continue;
            }
            counts.active += 1;
            let span = tracing::debug_span!("schedule", pod = %key);
            if let Some(b) = self.schedule_one(pod, &mut snapshot).instrument(span).await {
                bindings.push(b);
            }
        }
        let this = &*self;
        let outcomes: Vec<Bound> = stream::iter(bindings)
            .map(|b| this.send(b))
            .buffer_unordered(BINDINGS_IN_FLIGHT)
            .collect()
            .await;
        for outcome in outcomes {
            self.settle(outcome);
        }
        self.metrics.set_pending(counts);
        let live: HashSet<String> = pods.iter().filter_map(|p| p.metadata.uid.clone()).collect();
        self.events.retain(|u| live.contains(u));
    }

    /// The scheduling cycle for one pod: its node, and the writes that follow (`None` when it
    /// fits nowhere: recorded as unschedulable).
    async fn schedule_one(&mut self, pod: &Arc<Pod>, snapshot: &mut Snapshot) -> Option<Binding> {
        let total = snapshot.nodes.len();
        let claims = match volumes::pre_filter(pod, snapshot) {
            Ok(c) => c,
            Err(msg) => {
                self.unschedulable(pod, &message::pre_filter_error(total, &msg))
                    .await;
                return None;
            }
        };
        let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
        let mut feasible: Vec<String> = Vec::new();
        for n in &snapshot.nodes {
            let reason = node::filter(pod, n)
                .or_else(|| volumes::filter(&claims, n, snapshot))
                .or_else(|| limits::filter(pod, n, snapshot));
            match reason {
                Some(r) => *reasons.entry(r).or_default() += 1,
                None => feasible.push(node::name(n).to_string()),
            }
        }
        // A node already handed to the provisioner for one of the claims stays the choice
        // while it fits: moving would leave a volume provisioned for the wrong node.
        let preferred = claims
            .delayed
            .iter()
            .filter_map(|(c, _)| selected_node(c))
            .find(|n| feasible.iter().any(|f| f.as_str() == *n))
            .map(str::to_string);
        let Some(chosen) = preferred.or_else(|| {
            feasible
                .iter()
                .min_by_key(|n| (snapshot.pod_count(n), (*n).clone()))
                .cloned()
        }) else {
            self.unschedulable(pod, &message::fit_error(total, &reasons))
                .await;
            return None;
        };
        snapshot.assume(pod.clone(), &chosen);
        if claims.delayed.is_empty() {
            return Some(Binding::Bind {
                pod: pod.clone(),
                node: chosen,
            });
        }
        let claims = claims
            .delayed
            .iter()
            .filter(|(claim, _)| selected_node(claim) != Some(chosen.as_str()))
            .map(|(claim, _)| claim.clone())
            .collect();
        Some(Binding::SelectNode {
            pod: pod.clone(),
            node: chosen,
            claims,
        })
    }

    /// The binding cycle's writes for one pod.
    async fn send(&self, binding: Binding) -> Bound {
        match binding {
            Binding::Bind { pod, node } => self.bind(pod, node).await,
            Binding::SelectNode { pod, node, claims } => {
                for claim in &claims {
                    if let Err(e) = self.select_node(claim, &node).await {
                        tracing::warn!(pod = %pod_key(&pod), error = %e, "writing the selected node failed; retried with backoff");
                        return Bound::SelectFailed { pod };
                    }
                }
                Bound::Selected { pod, node }
            }
        }
    }

    /// What a binding's outcome changes in the scheduler's own state.
    fn settle(&mut self, outcome: Bound) {
        match outcome {
            Bound::Done { pod, node } => {
                let key = pod_key(&pod);
                self.backoff.remove(&key);
                self.assumed.insert(key, (node, pod));
                self.metrics.attempt(Outcome::Scheduled);
            }
            Bound::Refused { pod } => {
                self.backoff.remove(&pod_key(&pod));
            }
            Bound::BindFailed { pod } | Bound::SelectFailed { pod } => {
                self.metrics.attempt(Outcome::Error);
                self.record_failure(&pod);
            }
            Bound::Selected { pod, node } => {
                tracing::info!(pod = %pod_key(&pod), %node, "node selected; waiting for the pod's WaitForFirstConsumer claims to be bound");
                self.waiting.insert(
                    pod_key(&pod),
                    Waiting {
                        uid: uid(&pod),
                        node,
                        since: Instant::now(),
                    },
                );
            }
        }
    }

    /// Writes `volume.kubernetes.io/selected-node` (the volume binder's hand-off to the
    /// provisioner), with a resourceVersion test: a claim bound meanwhile is not touched.
    async fn select_node(&self, claim: &PersistentVolumeClaim, node: &str) -> Result<(), Error> {
        let namespace = claim.metadata.namespace.as_deref().unwrap_or_default();
        let name = claim.metadata.name.as_deref().unwrap_or_default();
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), namespace);
        let patch = json!({"metadata": {
            "resourceVersion": claim.metadata.resource_version,
            "annotations": {ANN_SELECTED_NODE: node},
        }});
        api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| {
                Error::kube(
                    format!("annotating PersistentVolumeClaim {namespace}/{name} with {ANN_SELECTED_NODE}={node}"),
                    e,
                )
            })?;
        Ok(())
    }

    /// A pod waiting for its claims: bind once all are Bound, or start over.
    async fn continue_waiting(&mut self, pod: &Arc<Pod>, snapshot: &Snapshot) -> Option<Binding> {
        let key = pod_key(pod);
        let w = self.waiting.get(&key)?;
        let (node_name, since) = (w.node.clone(), w.since);
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let mut problem = None;
        let mut all_bound = true;
        for name in claim_names(pod) {
            let Some(claim) = snapshot.claim(namespace, &name) else {
                problem = Some(format!("persistentvolumeclaim \"{name}\" not found"));
                break;
            };
            if volumes::is_bound(claim) {
                continue;
            }
            all_bound = false;
            let volume_name = claim.spec.as_ref().and_then(|s| s.volume_name.as_deref());
            let delayed = volume_name.is_none_or(str::is_empty);
            if delayed && selected_node(claim) != Some(node_name.as_str()) {
                problem = Some(format!(
                    "claim {namespace}/{name} was given back by its provisioner ({ANN_SELECTED_NODE} no longer {node_name}): volume provisioning on that node failed"
                ));
                break;
            }
        }
        if problem.is_none() && !all_bound && since.elapsed() > self.config.bind_timeout {
            problem = Some(format!(
                "claims of the pod not bound within {:?} after node {node_name} was selected (is the provisioner of their class running?)",
                self.config.bind_timeout
            ));
        }
        if problem.is_none() && all_bound {
            let node = snapshot.nodes.iter().find(|n| node::name(n) == node_name);
            problem = match (node, volumes::pre_filter(pod, snapshot)) {
                (None, _) => Some(format!("node \"{node_name}\" not found")),
                (_, Err(msg)) => Some(msg),
                (Some(n), Ok(claims)) => volumes::filter(&claims, n, snapshot),
            };
            if problem.is_none() {
                self.waiting.remove(&key);
                return Some(Binding::Bind {
                    pod: pod.clone(),
                    node: node_name,
                });
            }
        }
        if let Some(problem) = problem {
            self.waiting.remove(&key);
            let msg =
                format!("running PreBind plugin \"VolumeBinding\": binding volumes: {problem}");
            self.event(pod, EventType::Warning, "FailedScheduling", &msg)
                .await;
            self.metrics.attempt(Outcome::Error);
            self.record_failure(pod);
        }
        None
    }

    async fn bind(&self, pod: Arc<Pod>, node: String) -> Bound {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let key = pod_key(&pod);
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let binding = json!({
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": pod.metadata.uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        });
        let result: Result<serde_json::Value, kube::Error> = api
            .create_subresource("binding", name, &PostParams::default(), &binding)
            .await;
        match result {
            Ok(_) => {
                tracing::info!(pod = %key, node, "bound");
                let msg = format!("Successfully assigned {namespace}/{name} to {node}");
                self.event(&pod, EventType::Normal, "Scheduled", &msg).await;
                Bound::Done { pod, node }
            }
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {
                tracing::debug!(pod = %key, code = s.code, message = %s.message, "binding refused");
                Bound::Refused { pod }
            }
            Err(e) => {
                let e = Error::kube(format!("binding pod {key} to node {node}"), e);
                tracing::warn!(error = %e, "binding failed; retried with backoff");
                let msg = format!("Binding rejected: {e}");
                self.event(&pod, EventType::Warning, "FailedScheduling", &msg)
                    .await;
                Bound::BindFailed { pod }
            }
        }
    }

    async fn unschedulable(&mut self, pod: &Arc<Pod>, message: &str) {
        tracing::info!(pod = %pod_key(pod), %message, "unschedulable");
        self.metrics.attempt(Outcome::Unschedulable);
        self.event(pod, EventType::Warning, "FailedScheduling", message)
            .await;
        self.record_failure(pod);
    }

    /// Backoff of a failed pod: initial, doubled per attempt, capped.
    fn record_failure(&mut self, pod: &Pod) {
        let entry = self.backoff.entry(pod_key(pod)).or_insert(Backoff {
            uid: uid(pod),
            attempts: 0,
            retry_at: Instant::now(),
        });
        let delay = component_runtime::workqueue::Backoff {
            start: self.config.initial_backoff,
            max: self.config.max_backoff,
        }
        .delay(entry.attempts.saturating_add(1));
        entry.attempts = entry.attempts.saturating_add(1);
        entry.retry_at = Instant::now() + delay;
    }

    async fn event(&self, pod: &Pod, type_: EventType, reason: &str, message: &str) {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let involved = pod.object_ref(&());
        self.events
            .record(&namespace, involved, type_, reason, message)
            .await;
    }
}
