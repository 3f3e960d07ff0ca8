//! The controller on one client: watch caches of pods and claims; a pass looks at every pod
//! that is not being deleted and makes the claims of its generic ephemeral volumes, whenever a
//! pod or a claim changes and when a failed pod's backoff ends. kcm's controller works per pod
//! from a workqueue; a pass over the cache does the same work and a pod waiting for its
//! backoff is skipped, unless the pod or one of its claims changed since it failed (kcm
//! queues the pod again on those changes too).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use component_runtime::SharedCaches;
use component_runtime::workqueue::{Backoff, Failures};
use k8s_openapi::api::core::v1::{EphemeralVolumeSource, PersistentVolumeClaim, Pod, Volume};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::PostParams;
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::config::Options;
use crate::context::{CREATED_TTL, Caches, Ctx, key};
use crate::metrics::Metrics;
use crate::{COMPONENT, Error, FAILED_BINDING, claim_name, orphans};

/// The controller: runs until its token is cancelled.
pub(crate) struct Controller {
    client: Client,
    options: Options,
    metrics: Metrics,
    /// `None`: watch caches of its own, stopped with the controller.
    shared_caches: Option<SharedCaches>,
}

impl Controller {
    pub(crate) fn new(
        client: Client,
        options: Options,
        metrics: Metrics,
        shared_caches: Option<SharedCaches>,
    ) -> Self {
        Self {
            client,
            options,
            metrics,
            shared_caches,
        }
    }

    /// Runs until `shutdown`. Every step is idempotent: a restart (or the next leader) finds
    /// the claims already made in the API server and makes only the missing ones.
    pub(crate) async fn run(self, shutdown: CancellationToken) -> Result<(), Error> {
        let stop = shutdown.child_token();
        let _stop_caches = stop.clone().drop_guard();
        let source = self
            .shared_caches
            .clone()
            .unwrap_or_else(|| SharedCaches::private(self.client.clone(), stop.clone()));
        let caches = Caches {
            pods: source.all(),
            claims: source.all(),
        };
        let ready = component_runtime::wait_all_ready(
            [caches.pods.readiness(), caches.claims.readiness()],
            self.options.cache_sync_timeout,
        );
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            r = ready => r?,
        }
        let backoff = Backoff {
            start: self.options.backoff_initial,
            max: self.options.backoff_max,
        };
        let ctx = Ctx {
            events: component_runtime::EventRecorder::new(self.client.clone(), COMPONENT),
            client: self.client,
            caches,
            options: self.options,
            metrics: self.metrics,
            created: Mutex::new(HashMap::new()),
            failures: Failures::new(backoff),
        };
        tracing::info!(
            delete_orphaned_claims = ctx.options.delete_orphaned_claims,
            "ephemeral volume controller started"
        );
        let mut pods = ctx.caches.pods.changed();
        let mut claims = ctx.caches.claims.changed();
        loop {
            pods.borrow_and_update();
            claims.borrow_and_update();
            pass(&ctx).await;
            let wait = ctx
                .failures
                .next_retry()
                .map(|at| at.saturating_duration_since(Instant::now()))
                .unwrap_or(ctx.options.resync_period)
                .min(ctx.options.resync_period);
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(wait.max(Duration::from_millis(10))) => {}
                _ = pods.changed() => {}
                _ = claims.changed() => {}
            }
            // Let a burst of watch events land before the next pass.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    }
}

/// The pod's generic ephemeral volumes.
fn ephemeral_volumes(pod: &Pod) -> Vec<(&Volume, &EphemeralVolumeSource)> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| v.ephemeral.as_ref().map(|e| (v, e)))
        .collect()
}

/// The pod's and its claims' resourceVersions (`-` for a claim not there).
fn fingerprint(ctx: &Ctx, pod: &Pod, namespace: &str, claims: &[String]) -> String {
    let mut out = pod.metadata.resource_version.clone().unwrap_or_default();
    for name in claims {
        out.push(' ');
        match ctx.claim(namespace, name) {
            Some(c) => out.push_str(c.metadata.resource_version.as_deref().unwrap_or_default()),
            None => out.push('-'),
        }
    }
    out
}

/// Whether `pod` is the controller of `claim` (kcm's `IsControlledBy`: the ownerReference
/// marked `controller` has the pod's UID).
pub(crate) fn controlled_by(claim: &PersistentVolumeClaim, pod_uid: &str) -> bool {
    claim
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
        .is_some_and(|r| r.uid == pod_uid)
}

/// The claim kcm makes for `volume` of `pod`: the template's labels, annotations and spec,
/// the pod as controlling owner that blocks the owner's foreground deletion.
pub(crate) fn claim_for(
    pod: &Pod,
    volume: &Volume,
    source: &EphemeralVolumeSource,
) -> PersistentVolumeClaim {
    let pod_name = pod.metadata.name.clone().unwrap_or_default();
    let template = source.volume_claim_template.as_ref();
    let meta = template.and_then(|t| t.metadata.as_ref());
    let non_empty = |m: Option<&BTreeMap<String, String>>| m.filter(|m| !m.is_empty()).cloned();
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(claim_name(&pod_name, &volume.name)),
            namespace: pod.metadata.namespace.clone(),
            labels: non_empty(meta.and_then(|m| m.labels.as_ref())),
            annotations: non_empty(meta.and_then(|m| m.annotations.as_ref())),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Pod".into(),
                name: pod_name,
                uid: pod.metadata.uid.clone().unwrap_or_default(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..ObjectMeta::default()
        },
        spec: template.map(|t| t.spec.clone()),
        status: None,
    }
}

/// kcm's error when the claim of that name is not the pod's.
fn not_owner(namespace: &str, claim: &str, pod: &str) -> Error {
    Error::NotOwner(format!(
        "PVC {namespace}/{claim} was not created for pod {namespace}/{pod} (pod is not owner)"
    ))
}

/// The error text client-go would print: the API server's Status message, else the error.
fn api_message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if !s.message.is_empty() => s.message.clone(),
        other => other.to_string(),
    }
}

/// One volume: the claim is there and the pod's, or it is created. `Err` carries the text that
/// follows `ephemeral volume <name>: ` in the Event.
async fn handle_volume(
    ctx: &Ctx,
    pod: &Pod,
    volume: &Volume,
    source: &EphemeralVolumeSource,
) -> Result<(), (String, Error)> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
    let pod_uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let name = claim_name(pod_name, &volume.name);
    if let Some(claim) = ctx.claim(namespace, &name) {
        if controlled_by(&claim, pod_uid) {
            tracing::trace!(claim = %name, "claim already created");
            return Ok(());
        }
        let e = not_owner(namespace, &name, pod_name);
        return Err((e.to_string(), e));
    }
    let claim = claim_for(pod, volume, source);
    let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), namespace);
    ctx.metrics.create_attempt();
    match api.create(&PostParams::default(), &claim).await {
        Ok(created) => {
            tracing::info!(claim = %format!("{namespace}/{name}"), "created the claim of an ephemeral volume");
            ctx.remember(namespace, created);
            Ok(())
        }
        Err(e) => {
            ctx.metrics.create_failure();
            // The cache was behind (another replica, or a restart, made it): the claim as it
            // is now decides, as it would on kcm's next try.
            if matches!(&e, kube::Error::Api(s) if s.code == 409) {
                if let Ok(Some(live)) = api.get_opt(&name).await {
                    if controlled_by(&live, pod_uid) {
                        ctx.remember(namespace, live);
                        return Ok(());
                    }
                }
            }
            let message = format!("create PVC {name}: {}", api_message(&e));
            Err((
                message,
                Error::kube(format!("creating claim {namespace}/{name}"), e),
            ))
        }
    }
}

/// One pod: every ephemeral volume in order; the first failure stops it with a Warning Event.
async fn sync_pod(ctx: &Ctx, pod: &Pod) -> Result<(), Error> {
    for (volume, source) in ephemeral_volumes(pod) {
        if let Err((message, e)) = handle_volume(ctx, pod, volume, source).await {
            ctx.warn(
                pod,
                FAILED_BINDING,
                &format!("ephemeral volume {}: {message}", volume.name),
            )
            .await;
            return Err(e);
        }
    }
    Ok(())
}

/// One pass over every pod, then (with `delete_orphaned_claims`) over every claim.
async fn pass(ctx: &Ctx) {
    let mut live_keys = HashSet::new();
    for pod in ctx.caches.pods.list() {
        // A pod on its way out gets no new claim (kcm skips it the same way).
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let volumes = ephemeral_volumes(&pod);
        if volumes.is_empty() {
            continue;
        }
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let pod_key = format!("pod/{}", key(namespace, name));
        live_keys.insert(pod_key.clone());
        let claims: Vec<String> = volumes
            .iter()
            .map(|(v, _)| claim_name(name, &v.name))
            .collect();
        let print = fingerprint(ctx, &pod, namespace, &claims);
        if ctx.failures.backing_off(&pod_key, &print) {
            continue;
        }
        let result = sync_pod(ctx, &pod)
            .instrument(tracing::debug_span!("sync_pod", pod = %key(namespace, name)))
            .await;
        if let Err(e) = &result {
            tracing::warn!(pod = %key(namespace, name), error = %e, "ephemeral volume not ready; retried with backoff");
        }
        ctx.failures.record(&pod_key, print, result.is_ok());
    }
    if ctx.options.delete_orphaned_claims {
        for (key, print, ok) in orphans::collect(ctx).await {
            live_keys.insert(key.clone());
            ctx.failures.record(&key, print, ok);
        }
    }
    // Forget what the caches caught up with and the failures of objects that are gone.
    ctx.created().retain(|k, (at, _)| {
        let (namespace, name) = k.split_once('/').unwrap_or_default();
        at.elapsed() < CREATED_TTL && ctx.caches.claims.get_namespaced(namespace, name).is_none()
    });
    ctx.failures.retain(|k| live_keys.contains(k));
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "u-1"},
            "spec": {"containers": [], "volumes": [
                {"name": "cache", "emptyDir": {}},
                {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {
                    "metadata": {"labels": {"a": "b"}, "annotations": {"c": "d"}, "name": "ignored"},
                    "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "fast",
                             "resources": {"requests": {"storage": "1Gi"}}}}}}
            ]}
        }))
        .unwrap()
    }

    #[test]
    fn the_claim_is_the_template_owned_by_the_pod() {
        let pod = pod();
        let vols = ephemeral_volumes(&pod);
        assert_eq!(vols.len(), 1);
        let c = claim_for(&pod, vols[0].0, vols[0].1);
        assert_eq!(c.metadata.name.as_deref(), Some("web-scratch"));
        assert_eq!(c.metadata.labels.unwrap()["a"], "b");
        assert_eq!(c.metadata.annotations.unwrap()["c"], "d");
        let spec = c.spec.unwrap();
        assert_eq!(spec.storage_class_name.as_deref(), Some("fast"));
        let owner = &c.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (
                owner.kind.as_str(),
                owner.api_version.as_str(),
                owner.uid.as_str()
            ),
            ("Pod", "v1", "u-1")
        );
        assert_eq!(
            (owner.controller, owner.block_owner_deletion),
            (Some(true), Some(true))
        );
    }

    #[test]
    fn only_the_controlling_reference_counts() {
        let pod = pod();
        let vols = ephemeral_volumes(&pod);
        let mut c = claim_for(&pod, vols[0].0, vols[0].1);
        assert!(controlled_by(&c, "u-1"));
        assert!(!controlled_by(&c, "u-2"));
        c.metadata.owner_references.as_mut().unwrap()[0].controller = None;
        assert!(!controlled_by(&c, "u-1"));
        c.metadata.owner_references = None;
        assert!(!controlled_by(&c, "u-1"));
    }
}
