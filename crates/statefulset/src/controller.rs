//! The controller on one client: watch caches of StatefulSets, pods and claims; a pass over
//! every set whenever a change concerns a StatefulSet, and every resync period. A pod or claim
//! concerns one when it has a StatefulSet owner or any StatefulSet exists: a cluster without
//! StatefulSets does not go over all its pods at each pod's change (at 5,000 pods that was
//! the burst's largest function after the allocator's, docs/benchmarks.md). A pass runs `plan` for each
//! set, does its writes (claims before the pod), writes `/status`, and deletes what a set that
//! is gone left behind (the garbage collector's part, which apiserver-lite lacks).
//!
//! Writes are remembered until the watch shows them ("expectations", as in kcm): a pass that
//! starts before the cache has the pod it just created does not create it again.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use component_runtime::object_cache::{Change, Subscription};
use component_runtime::{EventRecorder, EventType};
use component_runtime::{ObjectCache, SharedCaches};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Api, Client};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::plan::{self, Action, is_terminating};
use crate::set_members::{self, controller_set_uid, ordinal_of, set_name};
use crate::{COMPONENT, Error};

/// How long a write is trusted to show up in the watch before it is looked at again.
const EXPECTATION_TTL: Duration = Duration::from_secs(30);

struct Caches {
    sets: ObjectCache<StatefulSet>,
    pods: ObjectCache<Pod>,
    claims: ObjectCache<PersistentVolumeClaim>,
}

pub(crate) struct Controller {
    client: Client,
    config: Config,
    caches: Caches,
    events: EventRecorder,
    /// `namespace/name` of pods created / deleted (by uid) lately, until the cache agrees.
    created: HashMap<String, Instant>,
    deleted: HashMap<String, Instant>,
    /// Set by a change that concerns a StatefulSet since the last pass.
    concerned: Arc<AtomicBool>,
    _subscriptions: [Subscription; 3],
}

/// Whether a changed pod or claim may concern a StatefulSet.
fn concerns_a_set(sets: &ObjectCache<StatefulSet>, meta: &kube::api::ObjectMeta) -> bool {
    !sets.is_empty()
        || meta
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.kind == "StatefulSet")
}

/// A subscriber that sets `concerned` when a changed pod or claim concerns a StatefulSet.
fn mark_if_concerned<K: kube::Resource>(
    concerned: &Arc<AtomicBool>,
    sets: &ObjectCache<StatefulSet>,
) -> impl FnMut(Change<'_, K>) + Send + 'static {
    let (concerned, sets) = (concerned.clone(), sets.clone());
    move |change| match change {
        Change::Applied(obj) | Change::Deleted(obj) if !concerns_a_set(&sets, obj.meta()) => {}
        _ => concerned.store(true, Ordering::Release),
    }
}

fn key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

impl Controller {
    pub(crate) async fn start(
        client: Client,
        config: Config,
        shutdown: &CancellationToken,
    ) -> Result<Option<Self>, Error> {
        let source = config
            .shared_caches
            .clone()
            .unwrap_or_else(|| SharedCaches::private(client.clone(), shutdown.clone()));
        let caches = Caches {
            sets: source.all(),
            pods: source.all(),
            claims: source.all(),
        };
        let ready = component_runtime::wait_all_ready(
            [
                caches.sets.readiness(),
                caches.pods.readiness(),
                caches.claims.readiness(),
            ],
            config.cache_sync_timeout,
        );
        tokio::select! {
            () = shutdown.cancelled() => return Ok(None),
            r = ready => r?,
        }
        let concerned = Arc::new(AtomicBool::new(true));
        let c = concerned.clone();
        let on_set = caches.sets.subscribe(move |_: Change<'_, StatefulSet>| {
            c.store(true, Ordering::Release);
        });
        let on_pod = caches
            .pods
            .subscribe(mark_if_concerned(&concerned, &caches.sets));
        let on_claim = caches
            .claims
            .subscribe(mark_if_concerned(&concerned, &caches.sets));
        Ok(Some(Self {
            events: EventRecorder::new(client.clone(), COMPONENT),
            client,
            config,
            caches,
            created: HashMap::new(),
            deleted: HashMap::new(),
            concerned,
            _subscriptions: [on_set, on_pod, on_claim],
        }))
    }

    pub(crate) async fn run(mut self, shutdown: CancellationToken) -> Result<(), Error> {
        tracing::info!("statefulset controller started");
        let mut changes = [
            self.caches.sets.changed(),
            self.caches.pods.changed(),
            self.caches.claims.changed(),
        ];
        let mut next_resync = Instant::now();
        loop {
            for rx in &mut changes {
                rx.borrow_and_update();
            }
            let resync = Instant::now() >= next_resync;
            let concerned = self.concerned.swap(false, Ordering::AcqRel);
            // Writes not seen yet: the pass that sees them ends their expectations.
            let expecting = !self.created.is_empty() || !self.deleted.is_empty();
            if resync || concerned || expecting {
                if resync {
                    next_resync = Instant::now() + self.config.resync_period;
                }
                self.pass().await;
            }
            let [a, b, c] = &mut changes;
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep_until(next_resync.into()) => {}
                _ = a.changed() => {}
                _ = b.changed() => {}
                _ = c.changed() => {}
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    }

    async fn pass(&mut self) {
        let sets = self.caches.sets.list();
        let pods = self.caches.pods.list();
        // Expectations end when the cache agrees or they are too old.
        let cached: HashSet<String> = pods
            .iter()
            .map(|p| {
                key(
                    p.metadata.namespace.as_deref().unwrap_or_default(),
                    p.metadata.name.as_deref().unwrap_or_default(),
                )
            })
            .collect();
        let live_uids: HashSet<String> =
            pods.iter().filter_map(|p| p.metadata.uid.clone()).collect();
        self.created
            .retain(|k, at| !cached.contains(k) && at.elapsed() < EXPECTATION_TTL);
        self.deleted
            .retain(|uid, at| live_uids.contains(uid) && at.elapsed() < EXPECTATION_TTL);

        let set_uids: HashSet<&str> = sets
            .iter()
            .filter_map(|s| s.metadata.uid.as_deref())
            .collect();
        for set in &sets {
            if set.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let name = set_name(set).to_string();
            let result = self.sync_set(set, &pods).await;
            if let Err(e) = result {
                tracing::warn!(statefulset = %name, error = %e, "sync failed; tried again next pass");
            }
        }
        self.delete_orphans(&pods, &set_uids).await;
        let set_uids: HashSet<String> = set_uids.into_iter().map(str::to_string).collect();
        self.events.retain(|u| set_uids.contains(u));
    }

    async fn sync_set(&mut self, set: &Arc<StatefulSet>, pods: &[Arc<Pod>]) -> Result<(), Error> {
        let namespace = set.metadata.namespace.clone().unwrap_or_default();
        let name = set_name(set).to_string();
        let uid = set.metadata.uid.clone().unwrap_or_default();
        let spec = set.spec.clone().unwrap_or_default();
        let replicas = spec.replicas.unwrap_or(1);
        let parallel = spec.pod_management_policy.as_deref() == Some("Parallel");
        let owned: BTreeMap<i32, Arc<Pod>> = pods
            .iter()
            .filter(|p| p.metadata.namespace.as_deref() == Some(namespace.as_str()))
            .filter(|p| controller_set_uid(&p.metadata) == Some(uid.as_str()))
            .filter_map(|p| {
                let ordinal = ordinal_of(&name, p.metadata.name.as_deref()?)?;
                Some((ordinal, p.clone()))
            })
            .collect();
        // Pods deleted by us but still cached count as terminating; ones created but not yet
        // cached block like a pod that is not Ready.
        let mut view = owned.clone();
        for (ordinal, pod) in &owned {
            let deleted_by_us = pod
                .metadata
                .uid
                .as_ref()
                .is_some_and(|u| self.deleted.contains_key(u));
            if deleted_by_us && !is_terminating(pod) {
                let mut p = (**pod).clone();
                p.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::now()));
                view.insert(*ordinal, Arc::new(p));
            }
        }
        let pending_creates: Vec<i32> = (0..replicas.max(0))
            .filter(|i| !view.contains_key(i))
            .filter(|i| {
                self.created
                    .contains_key(&key(&namespace, &set_members::pod_name(set, *i)))
            })
            .collect();
        for i in pending_creates {
            // Stand in for the pod just created: present, not Ready yet.
            let mut p = Pod::default();
            p.metadata.name = Some(set_members::pod_name(set, i));
            view.insert(i, Arc::new(p));
        }
        for action in plan::plan(replicas, parallel, &view) {
            match action {
                Action::Create(ordinal) => self.create(set, ordinal).await,
                Action::Delete {
                    name: pod,
                    condemned,
                } => {
                    tracing::info!(statefulset = %name, pod = %pod, condemned, "deleting pod");
                    if let Some(p) = owned
                        .values()
                        .find(|p| p.metadata.name.as_deref() == Some(pod.as_str()))
                    {
                        self.delete_pod(set, p).await;
                    }
                }
            }
        }
        self.delete_scaled_down_claims(set, &owned).await;
        self.write_status(set, &owned).await
    }

    async fn create(&mut self, set: &StatefulSet, ordinal: i32) {
        let namespace = set.metadata.namespace.clone().unwrap_or_default();
        let pod_name = set_members::pod_name(set, ordinal);
        let set_name = set_name(set).to_string();
        let owned_claims = retention(set, "whenDeleted") == "Delete";
        let claims = match set_members::claims(set, ordinal, owned_claims) {
            Ok(c) => c,
            Err(e) => {
                let msg =
                    format!("create Pod {pod_name} in StatefulSet {set_name} failed error: {e}");
                self.event(set, EventType::Warning, "FailedCreate", &msg)
                    .await;
                return;
            }
        };
        let claims_api: Api<PersistentVolumeClaim> =
            Api::namespaced(self.client.clone(), &namespace);
        for claim in claims {
            let claim_name = claim.metadata.name.clone().unwrap_or_default();
            if let Some(existing) = self.caches.claims.get_namespaced(&namespace, &claim_name) {
                if existing.metadata.deletion_timestamp.is_some() {
                    let msg = format!(
                        "create Pod {pod_name} in StatefulSet {set_name} failed error: pvc {claim_name} is being deleted"
                    );
                    self.event(set, EventType::Warning, "FailedCreate", &msg)
                        .await;
                    return;
                }
                continue;
            }
            match claims_api.create(&PostParams::default(), &claim).await {
                Ok(_) => {
                    let msg = format!(
                        "create Claim {claim_name} Pod {pod_name} in StatefulSet {set_name} success"
                    );
                    self.event(set, EventType::Normal, "SuccessfulCreate", &msg)
                        .await;
                }
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => {
                    let msg = format!(
                        "create Claim {claim_name} for Pod {pod_name} in StatefulSet {set_name} failed error: {e}"
                    );
                    self.event(set, EventType::Warning, "FailedCreate", &msg)
                        .await;
                    return;
                }
            }
        }
        let pod = match set_members::pod(set, ordinal) {
            Ok(p) => p,
            Err(e) => {
                let msg =
                    format!("create Pod {pod_name} in StatefulSet {set_name} failed error: {e}");
                self.event(set, EventType::Warning, "FailedCreate", &msg)
                    .await;
                return;
            }
        };
        let pods_api: Api<Pod> = Api::namespaced(self.client.clone(), &namespace);
        match pods_api.create(&PostParams::default(), &pod).await {
            Ok(_) => {
                self.created
                    .insert(key(&namespace, &pod_name), Instant::now());
                let msg = format!("create Pod {pod_name} in StatefulSet {set_name} successful");
                self.event(set, EventType::Normal, "SuccessfulCreate", &msg)
                    .await;
            }
            Err(e) => {
                let msg =
                    format!("create Pod {pod_name} in StatefulSet {set_name} failed error: {e}");
                self.event(set, EventType::Warning, "FailedCreate", &msg)
                    .await;
            }
        }
    }

    async fn delete_pod(&mut self, set: &StatefulSet, pod: &Pod) {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let set_name = set_name(set).to_string();
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &namespace);
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid.clone()),
                resource_version: None,
            }),
            ..Default::default()
        };
        match api.delete(&name, &params).await {
            Ok(_) => {
                self.deleted.insert(uid, Instant::now());
                let msg = format!("delete Pod {name} in StatefulSet {set_name} successful");
                self.event(set, EventType::Normal, "SuccessfulDelete", &msg)
                    .await;
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                let msg = format!("delete Pod {name} in StatefulSet {set_name} failed error: {e}");
                self.event(set, EventType::Warning, "FailedDelete", &msg)
                    .await;
            }
        }
    }

    /// `whenScaled: Delete`: the claims of ordinals at or above `replicas` go once their pod
    /// is gone.
    async fn delete_scaled_down_claims(&self, set: &StatefulSet, owned: &BTreeMap<i32, Arc<Pod>>) {
        if retention(set, "whenScaled") != "Delete" {
            return;
        }
        let namespace = set.metadata.namespace.clone().unwrap_or_default();
        let replicas = set.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &namespace);
        for template in set_members::claim_templates(set) {
            let prefix = format!(
                "{}-{}",
                template.metadata.name.as_deref().unwrap_or_default(),
                set_name(set)
            );
            for claim in self.caches.claims.list() {
                if claim.metadata.namespace.as_deref() != Some(namespace.as_str())
                    || claim.metadata.deletion_timestamp.is_some()
                {
                    continue;
                }
                let Some(ordinal) =
                    ordinal_of(&prefix, claim.metadata.name.as_deref().unwrap_or_default())
                else {
                    continue;
                };
                if ordinal < replicas || owned.contains_key(&ordinal) {
                    continue;
                }
                let name = claim.metadata.name.clone().unwrap_or_default();
                if let Err(e) = api.delete(&name, &DeleteParams::default()).await {
                    tracing::warn!(claim = %name, error = %e, "deleting a scaled-down claim failed");
                }
            }
        }
    }

    /// Pods (and owned claims) whose controlling set is gone: what the garbage collector
    /// would delete.
    async fn delete_orphans(&mut self, pods: &[Arc<Pod>], set_uids: &HashSet<&str>) {
        for pod in pods {
            let Some(owner) = controller_set_uid(&pod.metadata) else {
                continue;
            };
            if set_uids.contains(owner) || is_terminating(pod) {
                continue;
            }
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            if self.deleted.contains_key(&uid) {
                continue;
            }
            let namespace = pod.metadata.namespace.clone().unwrap_or_default();
            let name = pod.metadata.name.clone().unwrap_or_default();
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &namespace);
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: Some(uid.clone()),
                    resource_version: None,
                }),
                ..Default::default()
            };
            match api.delete(&name, &params).await {
                Ok(_) => {
                    tracing::info!(pod = %key(&namespace, &name), "deleted: its StatefulSet is gone");
                    self.deleted.insert(uid, Instant::now());
                }
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                Err(e) => {
                    tracing::warn!(pod = %key(&namespace, &name), error = %e, "deleting an orphaned pod failed")
                }
            }
        }
        for claim in self.caches.claims.list() {
            let Some(owner) = controller_set_uid(&claim.metadata) else {
                continue;
            };
            if set_uids.contains(owner) || claim.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let namespace = claim.metadata.namespace.clone().unwrap_or_default();
            let name = claim.metadata.name.clone().unwrap_or_default();
            let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &namespace);
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) | Err(kube::Error::Api(_)) => {}
                Err(e) => {
                    tracing::warn!(claim = %key(&namespace, &name), error = %e, "deleting an orphaned claim failed")
                }
            }
        }
    }

    async fn write_status(
        &self,
        set: &StatefulSet,
        owned: &BTreeMap<i32, Arc<Pod>>,
    ) -> Result<(), Error> {
        let min_ready = set
            .spec
            .as_ref()
            .and_then(|s| s.min_ready_seconds)
            .unwrap_or(0);
        let now = jiff::Timestamp::now();
        let replicas = owned.len() as i32;
        let ready = owned
            .values()
            .filter(|p| plan::is_running_and_ready(p))
            .count() as i32;
        let available = owned
            .values()
            .filter(|p| plan::is_running_and_ready(p))
            .filter(|p| {
                min_ready <= 0
                    || plan::ready_since(p)
                        .flatten()
                        .is_some_and(|t| now.duration_since(t).as_secs() >= i64::from(min_ready))
            })
            .count() as i32;
        let current = owned.values().filter(|p| !is_terminating(p)).count() as i32;
        let want = json!({
            "observedGeneration": set.metadata.generation,
            "replicas": replicas,
            "readyReplicas": ready,
            "availableReplicas": available,
            "currentReplicas": current,
            "updatedReplicas": current,
        });
        let have = set.status.as_ref().map(|s| {
            json!({
                "observedGeneration": s.observed_generation,
                "replicas": s.replicas,
                "readyReplicas": s.ready_replicas.unwrap_or(0),
                "availableReplicas": s.available_replicas.unwrap_or(0),
                "currentReplicas": s.current_replicas.unwrap_or(0),
                "updatedReplicas": s.updated_replicas.unwrap_or(0),
            })
        });
        if have.as_ref() == Some(&want) {
            return Ok(());
        }
        let namespace = set.metadata.namespace.clone().unwrap_or_default();
        let name = set_name(set);
        let api: Api<StatefulSet> = Api::namespaced(self.client.clone(), &namespace);
        api.patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": want})),
        )
        .await
        .map_err(|e| {
            Error::kube(
                format!("writing the status of StatefulSet {namespace}/{name}"),
                e,
            )
        })?;
        Ok(())
    }

    async fn event(&self, set: &StatefulSet, type_: EventType, reason: &str, message: &str) {
        let namespace = set.metadata.namespace.clone().unwrap_or_default();
        let involved = ObjectReference {
            api_version: Some("apps/v1".into()),
            kind: Some("StatefulSet".into()),
            namespace: Some(namespace.clone()),
            name: set.metadata.name.clone(),
            uid: set.metadata.uid.clone(),
            resource_version: set.metadata.resource_version.clone(),
            ..Default::default()
        };
        self.events
            .record(&namespace, involved, type_, reason, message)
            .await;
    }
}

/// `spec.persistentVolumeClaimRetentionPolicy.<field>` (`Retain` when unset).
fn retention(set: &StatefulSet, field: &str) -> String {
    let policy = set
        .spec
        .as_ref()
        .and_then(|s| s.persistent_volume_claim_retention_policy.as_ref());
    let value = match field {
        "whenScaled" => policy.and_then(|p| p.when_scaled.clone()),
        _ => policy.and_then(|p| p.when_deleted.clone()),
    };
    value.unwrap_or_else(|| "Retain".into())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn meta(owner: Option<&str>) -> kube::api::ObjectMeta {
        serde_json::from_value(json!({
            "name": "p",
            "ownerReferences": owner.map(|kind| vec![json!({
                "apiVersion": "apps/v1", "kind": kind, "name": "o", "uid": "u", "controller": true
            })]).unwrap_or_default(),
        }))
        .unwrap()
    }

    #[test]
    fn without_statefulsets_only_what_one_owns_concerns_the_controller() {
        let none: ObjectCache<StatefulSet> = ObjectCache::from_objects([]);
        assert!(!concerns_a_set(&none, &meta(None)));
        assert!(!concerns_a_set(&none, &meta(Some("ReplicaSet"))));
        assert!(
            concerns_a_set(&none, &meta(Some("StatefulSet"))),
            "an orphan to delete"
        );
        let mut set = StatefulSet::default();
        set.metadata.name = Some("web".into());
        set.metadata.namespace = Some("default".into());
        let some = ObjectCache::from_objects([set]);
        assert!(
            concerns_a_set(&some, &meta(None)),
            "any pod may be a set's once one exists"
        );
    }
}
