//! Events on pods (core/v1, what `kubectl describe pod` shows), reported by
//! `attachdetach-controller` with Kubernetes' reasons and wording. A repeat of the same reason
//! and message for the same pod bumps `count` and `lastTimestamp` of the first Event, as
//! client-go's recorder does, so an attach retried for hours leaves one Event.

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use crate::COMPONENT;
use crate::cache::PodRef;
use crate::metrics::Metrics;

pub(crate) const SUCCESSFUL_ATTACH: &str = "SuccessfulAttachVolume";
pub(crate) const FAILED_ATTACH: &str = "FailedAttachVolume";
/// Reason of the Warning on a node whose volume was detached while it still reported it in
/// use (Kubernetes only logs this; an Event makes it visible to `kubectl describe node`).
pub(crate) const FORCED_DETACH: &str = "ForcedDetachVolume";

/// Cluster-scoped objects (nodes) get their Events in `default`, as client-go does.
const CLUSTER_EVENT_NAMESPACE: &str = "default";

/// Bound on remembered Events (more distinct ones just create new Events).
const MAX_REMEMBERED: usize = 4096;

/// `AttachVolume.Attach succeeded for volume "<name>" `: with the trailing space Kubernetes'
/// message has (its prefix, volume and an empty suffix joined by spaces), so the two compare
/// equal.
pub(crate) fn attach_succeeded(spec_name: &str) -> String {
    format!("AttachVolume.Attach succeeded for volume {spec_name:?} ")
}

/// `AttachVolume.Attach failed for volume "<name>" : <error>`.
pub(crate) fn attach_failed(spec_name: &str, error: &str) -> String {
    format!("AttachVolume.Attach failed for volume {spec_name:?} : {error}")
}

/// Kubernetes' Multi-Attach message for `pod`, given the pods on other nodes that use the
/// volume (`others`; none known: the volume is attached elsewhere without a pod).
pub(crate) fn multi_attach(spec_name: &str, pod: &PodRef, others: &[PodRef]) -> String {
    let detail = if others.is_empty() {
        "Volume is already exclusively attached to one node and can't be attached to another"
            .to_string()
    } else {
        let local: Vec<&str> = others
            .iter()
            .filter(|o| o.namespace == pod.namespace)
            .map(|o| o.name.as_str())
            .collect();
        let elsewhere = others.len() - local.len();
        match (local.is_empty(), elsewhere) {
            (true, n) => format!("Volume is already used by {n} pod(s) in different namespaces"),
            (false, 0) => format!("Volume is already used by pod(s) {}", local.join(", ")),
            (false, n) => format!(
                "Volume is already used by pod(s) {} and {n} pod(s) in different namespaces",
                local.join(", ")
            ),
        }
    };
    format!("Multi-Attach error for volume {spec_name:?} {detail}")
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    uid: String,
    reason: String,
    message: String,
}

pub(crate) struct EventRecorder {
    client: Client,
    seen: Mutex<HashMap<Key, (String, String, i32)>>,
    metrics: std::sync::Arc<Metrics>,
}

impl EventRecorder {
    pub(crate) fn new(client: Client, metrics: std::sync::Arc<Metrics>) -> Self {
        Self {
            client,
            seen: Mutex::new(HashMap::new()),
            metrics,
        }
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, HashMap<Key, (String, String, i32)>> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records an Event on `pod`.
    pub(crate) async fn pod_event(&self, pod: &PodRef, warning: bool, reason: &str, message: &str) {
        let involved = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            namespace: Some(pod.namespace.clone()),
            name: Some(pod.name.clone()),
            uid: Some(pod.uid.clone()).filter(|u| !u.is_empty()),
            ..Default::default()
        };
        self.record(&pod.namespace, involved, warning, reason, message)
            .await;
    }

    /// Records a Warning on node `name`.
    pub(crate) async fn node_warning(
        &self,
        name: &str,
        uid: Option<String>,
        reason: &str,
        message: &str,
    ) {
        let involved = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(name.into()),
            uid,
            ..Default::default()
        };
        self.record(CLUSTER_EVENT_NAMESPACE, involved, true, reason, message)
            .await;
    }

    /// Creates or bumps the Event. Failures are logged, never returned: an Event is a courtesy.
    async fn record(
        &self,
        namespace: &str,
        involved: ObjectReference,
        warning: bool,
        reason: &str,
        message: &str,
    ) {
        let object_name = involved.name.clone().unwrap_or_default();
        let key = Key {
            uid: involved.uid.clone().unwrap_or_else(|| object_name.clone()),
            reason: reason.to_string(),
            message: message.to_string(),
        };
        let now = Time(jiff::Timestamp::now());
        let repeat = self.seen().get(&key).cloned();
        if let Some((namespace, event_name, count)) = repeat {
            let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
            let patch = json!({"count": count + 1, "lastTimestamp": now});
            self.metrics.api_write("patch", "events");
            match api
                .patch(&event_name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    self.seen().insert(key, (namespace, event_name, count + 1));
                    return;
                }
                Err(e) => {
                    tracing::debug!(event = %event_name, error = %e, "updating the Event failed; creating a new one");
                }
            }
        }
        let event_name = format!("{object_name}.{:x}", now.0.as_nanosecond());
        let event = Event {
            metadata: ObjectMeta {
                name: Some(event_name.clone()),
                namespace: Some(namespace.to_string()),
                ..Default::default()
            },
            involved_object: involved,
            reason: Some(reason.into()),
            message: Some(message.into()),
            type_: Some(if warning { "Warning" } else { "Normal" }.into()),
            count: Some(1),
            first_timestamp: Some(now.clone()),
            last_timestamp: Some(now),
            source: Some(EventSource {
                component: Some(COMPONENT.into()),
                host: None,
            }),
            reporting_component: Some(COMPONENT.into()),
            reporting_instance: Some(COMPONENT.into()),
            ..Default::default()
        };
        let api: Api<Event> = Api::namespaced(self.client.clone(), namespace);
        self.metrics.api_write("create", "events");
        match api.create(&PostParams::default(), &event).await {
            Ok(_) => {
                let mut seen = self.seen();
                if seen.len() >= MAX_REMEMBERED {
                    seen.clear();
                }
                seen.insert(key, (namespace.to_string(), event_name, 1));
            }
            Err(e) => {
                tracing::warn!(object = %format!("{namespace}/{object_name}"), reason, error = %e, "recording an Event failed");
            }
        }
    }

    /// Forgets the Events of objects (by UID, or name when they have none) not in `live`.
    pub(crate) fn retain(&self, live: &std::collections::HashSet<String>) {
        self.seen().retain(|k, _| live.contains(&k.uid));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ns: &str, name: &str) -> PodRef {
        PodRef {
            namespace: ns.into(),
            name: name.into(),
            uid: format!("uid-{name}"),
        }
    }

    #[test]
    fn kubernetes_wording() {
        assert_eq!(
            attach_succeeded("pv-1"),
            "AttachVolume.Attach succeeded for volume \"pv-1\" "
        );
        assert_eq!(
            attach_failed("pv-1", "rpc error: boom"),
            "AttachVolume.Attach failed for volume \"pv-1\" : rpc error: boom"
        );
        let me = pod("default", "web-2");
        assert_eq!(
            multi_attach("pv-1", &me, &[]),
            "Multi-Attach error for volume \"pv-1\" Volume is already exclusively attached to one node and can't be attached to another"
        );
        assert_eq!(
            multi_attach(
                "pv-1",
                &me,
                &[pod("default", "web-1"), pod("default", "web-0")]
            ),
            "Multi-Attach error for volume \"pv-1\" Volume is already used by pod(s) web-1, web-0"
        );
        assert_eq!(
            multi_attach("pv-1", &me, &[pod("default", "web-1"), pod("other", "x")]),
            "Multi-Attach error for volume \"pv-1\" Volume is already used by pod(s) web-1 and 1 pod(s) in different namespaces"
        );
        assert_eq!(
            multi_attach("pv-1", &me, &[pod("other", "x")]),
            "Multi-Attach error for volume \"pv-1\" Volume is already used by 1 pod(s) in different namespaces"
        );
    }
}
