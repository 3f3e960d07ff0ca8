//! What a pass, the orphan collection and the controller share: the watch caches, the
//! options, the claims created but not cached yet and the backoff of failed pods. A leaf below
//! all of them, as kube-controller-manager passes its listers and queue into its controllers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use component_runtime::ObjectCache;
use component_runtime::workqueue::Failures;
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
    /// Failed pods and orphan deletions, keyed `namespace/name` and `orphan/namespace/name`,
    /// with a fingerprint of what they looked like: a change retries at once.
    pub(crate) failures: Failures<String, String>,
}

/// How long a created claim is trusted without the cache showing it.
pub(crate) const CREATED_TTL: Duration = Duration::from_secs(30);

pub(crate) fn key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

impl Ctx {
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
