//! Events on pods (core/v1, what `kubectl describe pod` shows), reported by
//! `attachdetach-controller` with Kubernetes' reasons and wording. The shared
//! [`component_runtime::EventRecorder`] makes a repeat of the same reason and message for the same pod
//! bump `count` and `lastTimestamp` of the first Event, as client-go's recorder does, so an
//! attach retried for hours leaves one Event.

use std::collections::HashSet;
use std::sync::Arc;

use component_runtime::EventType;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;

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

/// Events of this controller, through the shared [`component_runtime::EventRecorder`]; every request it
/// sends counts in `attachdetach_controller_api_writes_total{resource="events"}`.
pub(crate) struct EventRecorder {
    recorder: component_runtime::EventRecorder,
    metrics: Arc<Metrics>,
}

impl EventRecorder {
    pub(crate) fn new(client: Client, metrics: Arc<Metrics>) -> Self {
        Self {
            recorder: component_runtime::EventRecorder::new(client, COMPONENT),
            metrics,
        }
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

    /// Creates or bumps the Event and counts the requests it sent, failed ones too. Failures
    /// are logged by the recorder, never returned: an Event is a courtesy.
    async fn record(
        &self,
        namespace: &str,
        involved: ObjectReference,
        warning: bool,
        reason: &str,
        message: &str,
    ) {
        let type_ = if warning {
            EventType::Warning
        } else {
            EventType::Normal
        };
        let recorded = self
            .recorder
            .record(namespace, involved, type_, reason, message)
            .await;
        for verb in recorded.writes() {
            self.metrics.api_write(verb, "events");
        }
    }

    /// Forgets the Events of objects (by UID, or name when they have none) not in `live`.
    pub(crate) fn retain(&self, live: &HashSet<String>) {
        self.recorder.retain(|id| live.contains(id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Event;
    use kube::Api;
    use prometheus_client::registry::Registry;

    fn writes(registry: &Registry) -> Vec<String> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).expect("encode");
        let mut lines: Vec<String> = text
            .lines()
            .filter(|l| l.starts_with("attachdetach_controller_api_writes_total{"))
            .map(str::to_string)
            .collect();
        // The family's order is a hash map's.
        lines.sort();
        lines
    }

    /// Every request to the events API counts, the failed ones too, as before the recorder
    /// moved to `component-runtime`.
    #[tokio::test]
    async fn event_writes_count_in_the_api_writes_metric() {
        apiserver::install_crypto_provider();
        let server = apiserver::ApiServer::start(apiserver::Config::default())
            .await
            .expect("server");
        let client = server.client();
        let mut registry = Registry::default();
        let metrics = Arc::new(Metrics::register(&mut registry));
        let events = EventRecorder::new(client.clone(), metrics);
        let web = pod("default", "web-0");
        let line = |verb: &str, n: u32| {
            format!(
                "attachdetach_controller_api_writes_total{{verb=\"{verb}\",resource=\"events\"}} {n}"
            )
        };

        events.pod_event(&web, false, SUCCESSFUL_ATTACH, "m").await;
        events.pod_event(&web, false, SUCCESSFUL_ATTACH, "m").await;
        events
            .node_warning("node-1", None, FORCED_DETACH, "n")
            .await;
        assert_eq!(writes(&registry), [line("create", 2), line("patch", 1)]);
        let api: Api<Event> = Api::namespaced(client.clone(), "default");
        let list = api.list(&Default::default()).await.expect("list").items;
        let kinds: Vec<_> = list
            .iter()
            .map(|e| (e.involved_object.kind.clone(), e.type_.clone(), e.count))
            .collect();
        assert_eq!(list.len(), 2, "{list:?}");
        assert!(
            kinds.contains(&(Some("Pod".into()), Some("Normal".into()), Some(2))),
            "{kinds:?}"
        );
        assert!(
            kinds.contains(&(Some("Node".into()), Some("Warning".into()), Some(1))),
            "{kinds:?}"
        );
        assert_eq!(
            list.iter()
                .filter_map(|e| e.source.as_ref()?.component.as_deref())
                .collect::<Vec<_>>(),
            [COMPONENT, COMPONENT]
        );

        // A failed patch, then a failed create: both were sent, both count.
        server.shutdown().await.expect("shutdown");
        events.pod_event(&web, false, SUCCESSFUL_ATTACH, "m").await;
        assert_eq!(writes(&registry), [line("create", 3), line("patch", 2)]);
    }

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
