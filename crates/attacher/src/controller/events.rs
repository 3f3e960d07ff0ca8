//! Warning Events on VolumeAttachments (core/v1, what `kubectl describe volumeattachment`
//! shows). A repeat of the same reason and message for the same object bumps `count` and
//! `lastTimestamp` of the first Event instead of creating another one, as client-go's recorder
//! does, so a failing attach retried for hours leaves one Event, not hundreds.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::objects::Va;
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

/// Cluster-scoped objects get their Events in `default`, as client-go does.
const EVENT_NAMESPACE: &str = "default";
/// Bound on remembered Events (a cluster with more distinct failures just creates new ones).
const MAX_REMEMBERED: usize = 4096;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    uid: String,
    reason: String,
    message: String,
}

pub(crate) struct EventRecorder {
    api: Api<Event>,
    component: String,
    seen: Mutex<HashMap<Key, (String, i32)>>,
}

impl EventRecorder {
    pub(crate) fn new(client: Client, component: String) -> Self {
        Self {
            api: Api::namespaced(client, EVENT_NAMESPACE),
            component,
            seen: Mutex::new(HashMap::new()),
        }
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, HashMap<Key, (String, i32)>> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a Warning on `va`. Failures are logged, never returned: an Event is a courtesy.
    pub(crate) async fn warn(&self, va: &Va, reason: &str, message: &str) {
        let name = va.metadata.name.clone().unwrap_or_default();
        let key = Key {
            uid: va.metadata.uid.clone().unwrap_or_default(),
            reason: reason.to_string(),
            message: message.to_string(),
        };
        let now = Time(jiff::Timestamp::now());
        let repeat = self.seen().get(&key).cloned();
        if let Some((event_name, count)) = repeat {
            let patch = json!({"count": count + 1, "lastTimestamp": now});
            match self
                .api
                .patch(&event_name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    self.seen().insert(key, (event_name, count + 1));
                    return;
                }
                Err(e) => {
                    tracing::debug!(event = %event_name, error = %e, "updating the Event failed; creating a new one");
                }
            }
        }
        let event_name = format!("{name}.{:x}", now.0.as_nanosecond());
        let event = Event {
            metadata: ObjectMeta {
                name: Some(event_name.clone()),
                namespace: Some(EVENT_NAMESPACE.into()),
                ..Default::default()
            },
            involved_object: ObjectReference {
                api_version: Some("storage.k8s.io/v1".into()),
                kind: Some("VolumeAttachment".into()),
                name: Some(name.clone()),
                uid: va.metadata.uid.clone(),
                resource_version: va.metadata.resource_version.clone(),
                ..Default::default()
            },
            reason: Some(reason.into()),
            message: Some(message.into()),
            type_: Some("Warning".into()),
            count: Some(1),
            first_timestamp: Some(now.clone()),
            last_timestamp: Some(now),
            source: Some(EventSource {
                component: Some(self.component.clone()),
                host: None,
            }),
            reporting_component: Some(self.component.clone()),
            reporting_instance: Some(self.component.clone()),
            ..Default::default()
        };
        match self.api.create(&PostParams::default(), &event).await {
            Ok(_) => {
                let mut seen = self.seen();
                if seen.len() >= MAX_REMEMBERED {
                    seen.clear();
                }
                seen.insert(key, (event_name, 1));
            }
            Err(e) => {
                tracing::warn!(volumeattachment = %name, reason, error = %e, "recording an Event failed");
            }
        }
    }

    /// The object is gone: forget its Events.
    pub(crate) fn forget(&self, uid: &str) {
        self.seen().retain(|k, _| k.uid != uid);
    }
}
