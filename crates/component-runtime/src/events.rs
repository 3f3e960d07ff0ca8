//! core/v1 Events (what `kubectl describe` shows), recorded as client-go's recorder does: a
//! repeat of the same reason and message for the same object bumps `count` and
//! `lastTimestamp` of the first Event instead of creating another one, so an operation retried
//! for hours leaves one Event, not hundreds.
//!
//! The recorder knows nothing of the objects: callers build the involved [`ObjectReference`]
//! and choose the namespace (the object's own; `default` for cluster-scoped objects, as
//! client-go does).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

/// Bound on remembered Events: past it the memory starts over, and a repeat of a forgotten
/// Event creates a new one (what a cluster with that many distinct failures gets anyway).
const MAX_REMEMBERED: usize = 4096;

/// An Event's `type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "Normal",
            Self::Warning => "Warning",
        }
    }
}

/// What [`EventRecorder::record`] wrote. Every outcome has been logged already; callers that
/// count their API writes use [`Recorded::writes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// A repeat: the first Event's `count` and `lastTimestamp` were bumped.
    Patched,
    /// A new Event. `after_failed_patch`: it was a repeat, but bumping the earlier Event
    /// failed (someone deleted it, say).
    Created { after_failed_patch: bool },
    /// Creating the Event failed (`after_failed_patch` as for [`Recorded::Created`]).
    Failed { after_failed_patch: bool },
}

impl Recorded {
    /// The API requests sent, in order, by verb: `"patch"` and/or `"create"`.
    pub fn writes(self) -> &'static [&'static str] {
        match self {
            Self::Patched => &["patch"],
            Self::Created {
                after_failed_patch: true,
            }
            | Self::Failed {
                after_failed_patch: true,
            } => &["patch", "create"],
            Self::Created {
                after_failed_patch: false,
            }
            | Self::Failed {
                after_failed_patch: false,
            } => &["create"],
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    /// The involved object's UID, or its name when it has none.
    uid: String,
    reason: String,
    message: String,
}

/// Where the first Event of a [`Key`] is and how often it was recorded.
#[derive(Debug, Clone)]
struct Seen {
    namespace: String,
    name: String,
    count: i32,
}

/// Records Events as `component` (their `source.component`, `reportingComponent` and
/// `reportingInstance`). Failures are logged, never returned as errors: an Event is a
/// courtesy, and the work it reports on goes on without it.
pub struct EventRecorder {
    client: Client,
    component: String,
    seen: Mutex<HashMap<Key, Seen>>,
}

impl std::fmt::Debug for EventRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventRecorder")
            .field("component", &self.component)
            .field("remembered", &self.seen().len())
            .finish()
    }
}

impl EventRecorder {
    pub fn new(client: Client, component: impl Into<String>) -> Self {
        Self {
            client,
            component: component.into(),
            seen: Mutex::new(HashMap::new()),
        }
    }

    fn seen(&self) -> MutexGuard<'_, HashMap<Key, Seen>> {
        // The map holds no invariant a panicking holder could break halfway.
        self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records an Event on `involved` in `namespace`: creates it, or bumps the first one of
    /// the same object, reason and message.
    pub async fn record(
        &self,
        namespace: &str,
        involved: ObjectReference,
        type_: EventType,
        reason: &str,
        message: &str,
    ) -> Recorded {
        let object_name = involved.name.clone().unwrap_or_default();
        let key = Key {
            uid: involved.uid.clone().unwrap_or_else(|| object_name.clone()),
            reason: reason.to_string(),
            message: message.to_string(),
        };
        let now = Time(jiff::Timestamp::now());
        let repeat = self.seen().get(&key).cloned();
        let after_failed_patch = repeat.is_some();
        if let Some(seen) = repeat {
            let api: Api<Event> = Api::namespaced(self.client.clone(), &seen.namespace);
            let patch = json!({"count": seen.count + 1, "lastTimestamp": now});
            match api
                .patch(&seen.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    let count = seen.count + 1;
                    self.seen().insert(key, Seen { count, ..seen });
                    return Recorded::Patched;
                }
                Err(e) => {
                    tracing::debug!(
                        event = %format!("{}/{}", seen.namespace, seen.name),
                        error = %e,
                        "updating the Event failed; creating a new one"
                    );
                }
            }
        }
        // client-go's name: the object's, then the time in hex, unique per object and instant.
        let event_name = format!("{object_name}.{:x}", now.0.as_nanosecond());
        let kind = involved.kind.clone().unwrap_or_default();
        let event = Event {
            metadata: ObjectMeta {
                name: Some(event_name.clone()),
                namespace: Some(namespace.to_string()),
                ..Default::default()
            },
            involved_object: involved,
            reason: Some(reason.into()),
            message: Some(message.into()),
            type_: Some(type_.as_str().into()),
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
        let api: Api<Event> = Api::namespaced(self.client.clone(), namespace);
        match api.create(&PostParams::default(), &event).await {
            Ok(_) => {
                let mut seen = self.seen();
                if seen.len() >= MAX_REMEMBERED {
                    seen.clear();
                }
                seen.insert(
                    key,
                    Seen {
                        namespace: namespace.to_string(),
                        name: event_name,
                        count: 1,
                    },
                );
                Recorded::Created { after_failed_patch }
            }
            Err(e) => {
                tracing::warn!(
                    %kind,
                    object = %object_name,
                    event_namespace = %namespace,
                    reason,
                    error = %e,
                    "recording an Event failed"
                );
                Recorded::Failed { after_failed_patch }
            }
        }
    }

    /// The object with this UID is gone: forget its Events.
    pub fn forget(&self, uid: &str) {
        self.seen().retain(|k, _| k.uid != uid);
    }

    /// Forgets the Events of every object whose UID (or name, for objects recorded without
    /// one) `keep` refuses.
    pub fn retain(&self, mut keep: impl FnMut(&str) -> bool) {
        self.seen().retain(|k, _| keep(&k.uid));
    }
}

#[cfg(test)]
mod tests;
