//! Events on claims and volumes, reported by `persistentvolume-controller` with
//! kube-controller-manager's reasons (operators grep for them). The shared
//! [`component_runtime::EventRecorder`] folds a repeat of the same reason and message into the first
//! Event's `count`, as client-go does, so a claim retried every sync period leaves one Event.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use component_runtime::EventType;
use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume, PersistentVolumeClaim};
use kube::Client;

use crate::COMPONENT;

pub(crate) const FAILED_BINDING: &str = "FailedBinding";
pub(crate) const VOLUME_MISMATCH: &str = "VolumeMismatch";
pub(crate) const CLAIM_LOST: &str = "ClaimLost";
pub(crate) const CLAIM_MISBOUND: &str = "ClaimMisbound";
pub(crate) const EXTERNAL_PROVISIONING: &str = "ExternalProvisioning";
pub(crate) const WAIT_FOR_FIRST_CONSUMER: &str = "WaitForFirstConsumer";
pub(crate) const WAIT_FOR_POD_SCHEDULED: &str = "WaitForPodScheduled";
pub(crate) const PROVISIONING_FAILED: &str = "ProvisioningFailed";
pub(crate) const PROVISIONING_SUCCEEDED: &str = "ProvisioningSucceeded";
pub(crate) const VOLUME_FAILED_DELETE: &str = "VolumeFailedDelete";
pub(crate) const VOLUME_FAILED_RECYCLE: &str = "VolumeFailedRecycle";

/// Cluster-scoped objects (PVs) get their Events in `default`, as client-go does.
const CLUSTER_EVENT_NAMESPACE: &str = "default";

/// `ExternalProvisioning`'s message: who is expected to make the volume.
pub(crate) fn external_provisioning(provisioner: &str) -> String {
    format!(
        "Waiting for a volume to be created either by the external provisioner '{provisioner}' or manually by the system administrator. If volume creation is delayed, please verify that the provisioner is running and correctly registered."
    )
}

/// `WaitForPodScheduled`'s message: the pods that name the claim and have no node yet
/// (sorted; kcm lists them in its index's order).
pub(crate) fn waiting_for_pods_scheduled(pods: &[String]) -> String {
    match pods {
        [one] => format!("waiting for pod {one} to be scheduled"),
        many => format!("waiting for pods {} to be scheduled", many.join(",")),
    }
}

pub(crate) const WAITING_FOR_FIRST_CONSUMER: &str =
    "waiting for first consumer to be created before binding";
pub(crate) const NO_VOLUME_NO_CLASS: &str =
    "no persistent volumes available for this claim and no storage class is set";

/// The same Event on the same object is written at most this often (client-go's spam filter
/// lets one through per 5 minutes once an object's burst is spent): a pass runs on every change
/// of any claim or volume, and a thousand claims waiting for a provisioner would otherwise
/// bump their Events' counts with a PATCH each, on the same rate-limited client as the binds.
const REPEAT_INTERVAL: Duration = Duration::from_secs(300);

/// Events of this controller.
pub(crate) struct Recorder {
    recorder: component_runtime::EventRecorder,
    last: Mutex<HashMap<(String, String, String), Instant>>,
}

impl Recorder {
    pub(crate) fn new(client: Client) -> Self {
        Self {
            recorder: component_runtime::EventRecorder::new(client, COMPONENT),
            last: Mutex::new(HashMap::new()),
        }
    }

    /// Whether this Event was written less than [`REPEAT_INTERVAL`] ago (else it is noted as
    /// written now).
    fn recently(&self, uid: Option<&String>, reason: &str, message: &str) -> bool {
        let key = (
            uid.cloned().unwrap_or_default(),
            reason.to_string(),
            message.to_string(),
        );
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if last
            .get(&key)
            .is_some_and(|t| now.duration_since(*t) < REPEAT_INTERVAL)
        {
            return true;
        }
        if last.len() >= 4096 {
            last.retain(|_, t| now.duration_since(*t) < REPEAT_INTERVAL);
        }
        last.insert(key, now);
        false
    }

    pub(crate) async fn claim(
        &self,
        claim: &PersistentVolumeClaim,
        warning: bool,
        reason: &str,
        message: &str,
    ) {
        if self.recently(claim.metadata.uid.as_ref(), reason, message) {
            return;
        }
        let namespace = claim.metadata.namespace.clone().unwrap_or_default();
        let involved = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("PersistentVolumeClaim".into()),
            namespace: Some(namespace.clone()),
            name: claim.metadata.name.clone(),
            uid: claim.metadata.uid.clone(),
            resource_version: claim.metadata.resource_version.clone(),
            ..Default::default()
        };
        self.recorder
            .record(&namespace, involved, event_type(warning), reason, message)
            .await;
    }

    pub(crate) async fn volume(
        &self,
        volume: &PersistentVolume,
        warning: bool,
        reason: &str,
        message: &str,
    ) {
        if self.recently(volume.metadata.uid.as_ref(), reason, message) {
            return;
        }
        let involved = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("PersistentVolume".into()),
            name: volume.metadata.name.clone(),
            uid: volume.metadata.uid.clone(),
            resource_version: volume.metadata.resource_version.clone(),
            ..Default::default()
        };
        self.recorder
            .record(
                CLUSTER_EVENT_NAMESPACE,
                involved,
                event_type(warning),
                reason,
                message,
            )
            .await;
    }
}

fn event_type(warning: bool) -> EventType {
    if warning {
        EventType::Warning
    } else {
        EventType::Normal
    }
}
