//! What a pass, the orphan collection and the controller share: the watch caches, the
//! options, the claims created but not cached yet and the backoff of failed pods. A leaf below
//! all of them, as kube-controller-manager passes its listers and queue into its controllers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use component_runtime::ObjectCache;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::Client;
use kube::Resource as _;

use crate::config::Options;
use crate::metrics::Metrics;

/// The reflectors of the two kinds the controller reads.
#[derive(Debug, Clone)]
pub(crate) struct Caches {
    pub pods: ObjectCache<Pod>,
    pub claims: ObjectCache<PersistentVolumeClaim>,
}

/// A failed pod (or orphan deletion), and when it may be tried again.
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    attempts: u32,
    retry_at: Instant,
    /// What the object and its claims looked like when it failed: a change retries at once.
    fingerprint: String,
}

/// Everything a pass needs.
pub(crate) struct Ctx {
    pub client: Client,
    pub caches: Caches,
    pub options: Options,
    pub metrics: Metrics,
    pub(crate) events: component_runtime::EventRecorder,
    /// Claims this controller created that the claim cache has not shown yet, by
    /// `namespace/name`, with when: a pass before the watch delivers them must not create
    /// them again. An entry goes when the cache has the claim, when this controller deletes
    /// it, or after [`CREATED_TTL`] (the claim was deleted before a pass saw it cached).
    pub(crate) created: Mutex<HashMap<String, (Instant, Arc<PersistentVolumeClaim>)>>,
    pub(crate) failures: Mutex<HashMap<String, Failure>>,
}

/// How long a created claim is trusted without the cache showing it.
pub(crate) const CREATED_TTL: Duration = Duration::from_secs(30);

pub(crate) fn key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

impl Ctx {
    pub(crate) fn failures(&self) -> MutexGuard<'_, HashMap<String, Failure>> {
        self.failures.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn created(
        &self,
    ) -> MutexGuard<'_, HashMap<String, (Instant, Arc<PersistentVolumeClaim>)>> {
        self.created.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A claim: the cached copy, or the one this controller created if the cache has none yet.
    pub(crate) fn claim(&self, namespace: &str, name: &str) -> Option<Arc<PersistentVolumeClaim>> {
        self.caches
            .claims
            .get_namespaced(namespace, name)
            .or_else(|| {
                self.created()
                    .get(&key(namespace, name))
                    .filter(|(at, _)| at.elapsed() < CREATED_TTL)
                    .map(|(_, c)| c.clone())
            })
    }

    pub(crate) fn remember(&self, namespace: &str, claim: PersistentVolumeClaim) {
        let name = claim.metadata.name.clone().unwrap_or_default();
        self.created()
            .insert(key(namespace, &name), (Instant::now(), Arc::new(claim)));
    }

    /// Forgets a claim this controller created (it deleted it).
    pub(crate) fn forget(&self, namespace: &str, name: &str) {
        self.created().remove(&key(namespace, name));
    }

    /// Whether `key` failed, its backoff has not passed and nothing changed since.
    pub(crate) fn backing_off(&self, key: &str, fingerprint: &str) -> bool {
        self.failures()
            .get(key)
            .is_some_and(|f| f.retry_at > Instant::now() && f.fingerprint == fingerprint)
    }

    /// Records the outcome of `key`: a failure doubles its backoff.
    pub(crate) fn record_outcome(&self, key: &str, fingerprint: String, ok: bool) {
        let mut failures = self.failures();
        if ok {
            failures.remove(key);
            return;
        }
        let attempts = failures.get(key).map_or(0, |f| f.attempts);
        let delay = component_runtime::workqueue::Backoff {
            start: self.options.backoff_initial,
            max: self.options.backoff_max,
        }
        .delay(attempts.saturating_add(1));
        failures.insert(
            key.to_string(),
            Failure {
                attempts: attempts.saturating_add(1),
                retry_at: Instant::now() + delay,
                fingerprint,
            },
        );
    }

    pub(crate) fn next_retry(&self) -> Option<Instant> {
        self.failures().values().map(|f| f.retry_at).min()
    }

    /// A Warning Event on `pod`, from `ephemeral_volume` as kcm's.
    pub(crate) async fn warn(&self, pod: &Pod, reason: &str, message: &str) {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let involved = pod.object_ref(&());
        self.events
            .record(
                &namespace,
                involved,
                component_runtime::EventType::Warning,
                reason,
                message,
            )
            .await;
    }
}
