//! Prometheus metrics: work queues (client-go's `workqueue_*` names, plus the age of the oldest
//! queued item and the keys waiting out a backoff, which the Go sidecar does not expose) and
//! `csi_sidecar_operations_seconds` for every CSI call.

use std::sync::{Arc, Weak};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::queue::WorkQueue;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct QueueLabels {
    pub name: String,
}

/// Counters and histograms updated by the queue as keys move through it.
#[derive(Debug)]
pub(crate) struct QueueMetrics {
    adds: Family<QueueLabels, Counter>,
    retries: Family<QueueLabels, Counter>,
    queue_duration: Family<QueueLabels, Histogram>,
    work_duration: Family<QueueLabels, Histogram>,
}

fn duration_histogram() -> Histogram {
    // client-go's workqueue buckets: 1e-8 s .. 10 s by factors of 10.
    Histogram::new(exponential_buckets(1e-8, 10.0, 10))
}

impl QueueMetrics {
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let adds = Family::<QueueLabels, Counter>::default();
        let retries = Family::<QueueLabels, Counter>::default();
        let queue_duration =
            Family::<QueueLabels, Histogram>::new_with_constructor(duration_histogram as fn() -> _);
        let work_duration =
            Family::<QueueLabels, Histogram>::new_with_constructor(duration_histogram as fn() -> _);
        registry.register("workqueue_adds", "Keys queued, per queue", adds.clone());
        registry.register(
            "workqueue_retries",
            "Keys that failed and were scheduled for a retry after their backoff, per queue",
            retries.clone(),
        );
        registry.register(
            "workqueue_queue_duration_seconds",
            "How long a key waited in the queue before a worker took it",
            queue_duration.clone(),
        );
        registry.register(
            "workqueue_work_duration_seconds",
            "How long a worker spent on a key",
            work_duration.clone(),
        );
        Self {
            adds,
            retries,
            queue_duration,
            work_duration,
        }
    }

    fn labels(name: &str) -> QueueLabels {
        QueueLabels {
            name: name.to_string(),
        }
    }

    pub(crate) fn added(&self, name: &str) {
        self.adds.get_or_create(&Self::labels(name)).inc();
    }

    pub(crate) fn retried(&self, name: &str) {
        self.retries.get_or_create(&Self::labels(name)).inc();
    }

    pub(crate) fn started(&self, name: &str, waited: Duration) {
        self.queue_duration
            .get_or_create(&Self::labels(name))
            .observe(waited.as_secs_f64());
    }

    pub(crate) fn finished(&self, name: &str, took: Duration) {
        self.work_duration
            .get_or_create(&Self::labels(name))
            .observe(took.as_secs_f64());
    }
}

/// Gauges read from the queues at scrape time (so the age of the oldest item is exact).
#[derive(Debug, Default)]
pub(crate) struct QueueGauges {
    queues: std::sync::Mutex<Vec<Weak<WorkQueue>>>,
}

impl QueueGauges {
    pub(crate) fn watch(&self, queue: &Arc<WorkQueue>) {
        if let Ok(mut q) = self.queues.lock() {
            q.push(Arc::downgrade(queue));
        }
    }

    fn rows(&self) -> Vec<(String, crate::queue::LaneSnapshot)> {
        let queues: Vec<Arc<WorkQueue>> = self
            .queues
            .lock()
            .map(|q| q.iter().filter_map(Weak::upgrade).collect())
            .unwrap_or_default();
        let mut rows = Vec::new();
        for q in queues {
            for (name, snap) in q.lane_names().iter().zip(q.snapshot()) {
                rows.push((name.clone(), snap));
            }
        }
        rows
    }
}

/// Registers [`QueueGauges`] as a collector; the returned handle adds queues to it.
pub(crate) fn register_queue_gauges(registry: &mut Registry) -> Arc<QueueGauges> {
    let gauges = Arc::new(QueueGauges::default());
    registry.register_collector(Box::new(GaugeCollector(gauges.clone())));
    gauges
}

#[derive(Debug)]
struct GaugeCollector(Arc<QueueGauges>);

impl Collector for GaugeCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let rows = self.0.rows();
        type Pick = fn(&crate::queue::LaneSnapshot) -> f64;
        let gauges: [(&str, &str, Pick); 5] = [
            ("workqueue_depth", "Keys ready for a worker", |s| {
                s.depth as f64
            }),
            (
                "workqueue_oldest_item_age_seconds",
                "Age of the oldest key ready for a worker (0 when none)",
                |s| s.oldest_age.as_secs_f64(),
            ),
            (
                "workqueue_backoff_items",
                "Keys waiting out their retry backoff",
                |s| s.in_backoff as f64,
            ),
            (
                "workqueue_unfinished_work_items",
                "Keys held by a worker right now",
                |s| s.processing as f64,
            ),
            (
                "workqueue_longest_running_processor_seconds",
                "How long the longest-running worker has held its key",
                |s| s.longest_running.as_secs_f64(),
            ),
        ];
        for (name, help, pick) in gauges {
            let mut metric = encoder.encode_descriptor(
                name,
                help,
                None,
                prometheus_client::metrics::MetricType::Gauge,
            )?;
            for (queue, snap) in &rows {
                let labels = QueueLabels {
                    name: queue.clone(),
                };
                ConstGauge::new(pick(snap)).encode(metric.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// Records one CSI call: full gRPC method path, status code, duration, migrated volume.
/// `lib::run` plugs in `sidecar::OperationMetrics` (`csi_sidecar_operations_seconds`).
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
    use crate::queue::{Backoff, WorkQueue};

    #[test]
    fn queue_gauges_are_read_at_scrape_time() {
        let mut registry = Registry::default();
        let qm = Arc::new(QueueMetrics::register(&mut registry));
        let gauges = register_queue_gauges(&mut registry);
        let q = Arc::new(WorkQueue::new(
            &["csi-attacher-va-attach", "csi-attacher-va-detach"],
            Backoff {
                start: Duration::from_millis(10),
                max: Duration::from_secs(1),
            },
            Some(qm),
        ));
        gauges.watch(&q);
        q.add("a", 0);
        q.add("b", 0);
        q.add("c", 1);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        assert!(
            text.contains("workqueue_depth{name=\"csi-attacher-va-attach\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("workqueue_depth{name=\"csi-attacher-va-detach\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("workqueue_adds_total{name=\"csi-attacher-va-attach\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("workqueue_oldest_item_age_seconds{name=\"csi-attacher-va-attach\"}"),
            "{text}"
        );
    }
}
