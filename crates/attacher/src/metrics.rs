//! Prometheus metrics: work queues (`component_runtime::workqueue`'s client-go `workqueue_*` names, plus
//! the age of the oldest queued item and the keys waiting out a backoff, which the Go sidecar
//! does not expose) and `csi_sidecar_operations_seconds` for every CSI call.

use std::sync::Arc;
use std::time::Duration;

use component_runtime::workqueue::{QueueGauges, QueueMetrics, register_queue_gauges};
use prometheus_client::registry::Registry;

/// Records one CSI call: full gRPC method path, status code, duration, migrated volume.
/// `lib::run` plugs in `component_runtime::OperationMetrics` (`csi_sidecar_operations_seconds`).
pub type CsiCallObserver = Arc<dyn Fn(&str, tonic::Code, Duration, bool) + Send + Sync>;

/// Everything the controller records.
pub(crate) struct Metrics {
    pub queue: Arc<QueueMetrics>,
    pub gauges: Arc<QueueGauges>,
    pub operations: Option<CsiCallObserver>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    pub(crate) fn register(registry: &mut Registry, operations: Option<CsiCallObserver>) -> Self {
        let queue = Arc::new(QueueMetrics::register(registry));
        let gauges = register_queue_gauges(registry);
        Self {
            queue,
            gauges,
            operations,
        }
    }

    /// Records one CSI call (method is the full gRPC path).
    pub(crate) fn csi_call(&self, method: &str, code: tonic::Code, took: Duration, migrated: bool) {
        if let Some(ops) = &self.operations {
            ops(method, code, took, migrated);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use component_runtime::workqueue::{Backoff, WorkQueue};

    #[test]
    fn queue_metrics_carry_the_attacher_queue_names() {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry, None);
        let q = Arc::new(WorkQueue::new(
            &["csi-attacher-va-attach", "csi-attacher-va-detach"],
            Backoff {
                start: Duration::from_millis(10),
                max: Duration::from_secs(1),
            },
            Some(metrics.queue.clone()),
        ));
        metrics.gauges.watch(&q);
        q.add("a", 0);
        q.add("b", 0);
        q.add("c", 1);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        for sample in [
            "workqueue_depth{name=\"csi-attacher-va-attach\"} 2",
            "workqueue_depth{name=\"csi-attacher-va-detach\"} 1",
            "workqueue_adds_total{name=\"csi-attacher-va-attach\"} 2",
            "workqueue_oldest_item_age_seconds{name=\"csi-attacher-va-attach\"}",
        ] {
            assert!(text.contains(sample), "{sample} missing in\n{text}");
        }
    }
}
