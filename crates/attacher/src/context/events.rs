//! Warning Events on VolumeAttachments (core/v1, what `kubectl describe volumeattachment`
//! shows), through the shared [`component_runtime::EventRecorder`]: a failing attach retried for hours
//! leaves one Event whose count grows, not hundreds.

use crate::slim_objects::Va;
use component_runtime::{EventRecorder, EventType};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;

/// Cluster-scoped objects get their Events in `default`, as client-go does.
const EVENT_NAMESPACE: &str = "default";

pub(crate) struct VaEvents {
    recorder: EventRecorder,
}

impl VaEvents {
    pub(crate) fn new(client: Client, component: String) -> Self {
        Self {
            recorder: EventRecorder::new(client, component),
        }
    }

    /// Records a Warning on `va`. Failures are logged by the recorder, never returned: an
    /// Event is a courtesy.
    pub(crate) async fn warn(&self, va: &Va, reason: &str, message: &str) {
        let involved = ObjectReference {
            api_version: Some("storage.k8s.io/v1".into()),
            kind: Some("VolumeAttachment".into()),
            name: Some(va.metadata.name.clone().unwrap_or_default()),
            uid: va.metadata.uid.clone(),
            resource_version: va.metadata.resource_version.clone(),
            ..Default::default()
        };
        self.recorder
            .record(
                EVENT_NAMESPACE,
                involved,
                EventType::Warning,
                reason,
                message,
            )
            .await;
    }

    /// The VolumeAttachment is gone: forget its Events.
    pub(crate) fn forget(&self, uid: &str) {
        self.recorder.forget(uid);
    }
}
