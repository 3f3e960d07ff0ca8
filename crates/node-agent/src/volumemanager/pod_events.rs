//! Pod Events of the volume manager (`FailedMount`, ...), recorded in the background so a
//! slow API server never holds up the reconciler. The recorder folds repeats into one Event.

use std::sync::Arc;

use component_runtime::{EventRecorder, EventType};
use k8s_openapi::api::core::v1::{ObjectReference, Pod};

#[derive(Clone, Debug)]
pub struct PodEvents {
    recorder: Arc<EventRecorder>,
}

impl PodEvents {
    pub fn new(recorder: Arc<EventRecorder>) -> Self {
        Self { recorder }
    }

    fn record(&self, pod: &Pod, type_: EventType, reason: &'static str, message: String) {
        let namespace = pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let involved = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: pod.metadata.name.clone(),
            namespace: Some(namespace.clone()),
            uid: pod.metadata.uid.clone(),
            resource_version: pod.metadata.resource_version.clone(),
            ..Default::default()
        };
        let recorder = self.recorder.clone();
        tokio::spawn(async move {
            recorder
                .record(&namespace, involved, type_, reason, &message)
                .await;
        });
    }

    /// `Warning FailedMount`: a mount step failed, or a volume waits for something.
    pub fn failed_mount(&self, pod: &Pod, message: String) {
        self.record(pod, EventType::Warning, "FailedMount", message);
    }
}
