//! The queue's metrics under client-go's `workqueue_*` names (plus the age of the oldest queued
//! item and the keys waiting out a backoff, which client-go does not expose), labelled by lane
//! name (`name`): [`QueueMetrics`] is updated as keys move through a queue, [`QueueGauges`] reads
//! the queues at scrape time. The names, labels, help texts and buckets are what dashboards and
//! the sidecars' tests rely on: change none of them.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::WorkQueue;

/// What the metrics collector reads at scrape time.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LaneSnapshot {
    /// Keys ready for a worker.
    pub depth: usize,
    /// Age of the oldest ready key (zero when none).
    pub oldest_age: Duration,
    /// Keys waiting out a backoff.
    pub in_backoff: usize,
    /// Keys held by a worker.
    pub processing: usize,
    /// How long the longest-running worker has held its key.
    pub longest_running: Duration,
}

impl WorkQueue {
    /// Per-lane numbers for the metrics collector, by lane index.
    pub fn snapshot(&self) -> Vec<LaneSnapshot> {
        let st = self.lock();
        let now = Instant::now();
        let mut out = vec![LaneSnapshot::default(); self.lanes.len()];
        for (lane, snap) in out.iter_mut().enumerate() {
            snap.depth = st.ready[lane].len();
        }
        for (lane, since) in st.queued.values() {
            let age = now.saturating_duration_since(*since);
            let snap = &mut out[*lane];
            snap.oldest_age = snap.oldest_age.max(age);
        }
        for (_, _, lane) in st.waiting_index.values() {
            out[*lane].in_backoff += 1;
        }
        for (lane, started) in st.processing.values() {
            let snap = &mut out[*lane];
            snap.processing += 1;
            snap.longest_running = snap
                .longest_running
                .max(now.saturating_duration_since(*started));
        }
        out
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabels {
    name: String,
}

/// Counters and histograms updated by the queue as keys move through it.
#[derive(Debug)]
pub struct QueueMetrics {
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
    /// Registers `workqueue_adds`, `workqueue_retries`, `workqueue_queue_duration_seconds` and
    /// `workqueue_work_duration_seconds` in `registry`; register once per registry and share the
    /// result (an `Arc`) between the queues.
    pub fn register(registry: &mut Registry) -> Self {
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

    pub(super) fn added(&self, name: &str) {
        self.adds.get_or_create(&Self::labels(name)).inc();
    }

    pub(super) fn retried(&self, name: &str) {
        self.retries.get_or_create(&Self::labels(name)).inc();
    }

    pub(super) fn started(&self, name: &str, waited: Duration) {
        self.queue_duration
            .get_or_create(&Self::labels(name))
            .observe(waited.as_secs_f64());
    }

    pub(super) fn finished(&self, name: &str, took: Duration) {
        self.work_duration
            .get_or_create(&Self::labels(name))
            .observe(took.as_secs_f64());
    }
}

/// Gauges read from the queues at scrape time (so the age of the oldest item is exact).
#[derive(Debug, Default)]
pub struct QueueGauges {
    queues: std::sync::Mutex<Vec<Weak<WorkQueue>>>,
}

impl QueueGauges {
    /// Reports `queue`'s lanes at every scrape while the queue lives.
    pub fn watch(&self, queue: &Arc<WorkQueue>) {
        if let Ok(mut q) = self.queues.lock() {
            q.push(Arc::downgrade(queue));
        }
    }

    fn rows(&self) -> Vec<(String, LaneSnapshot)> {
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
pub fn register_queue_gauges(registry: &mut Registry) -> Arc<QueueGauges> {
    let gauges = Arc::new(QueueGauges::default());
    registry.register_collector(Box::new(GaugeCollector(gauges.clone())));
    gauges
}

#[derive(Debug)]
struct GaugeCollector(Arc<QueueGauges>);

impl Collector for GaugeCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let rows = self.0.rows();
        type Pick = fn(&LaneSnapshot) -> f64;
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

#[cfg(test)]
mod tests {
    use super::super::{Backoff, Outcome};
    use super::*;

    fn encode(registry: &Registry) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).expect("encode");
        text
    }

    /// Dashboards and the sidecars' tests read these: names, types, help texts and buckets are
    /// fixed (the attacher's exposition before the queue moved here).
    #[tokio::test]
    async fn the_exposition_keeps_its_names_help_texts_and_buckets() {
        let mut registry = Registry::default();
        let qm = Arc::new(QueueMetrics::register(&mut registry));
        let gauges = register_queue_gauges(&mut registry);
        let q = Arc::new(WorkQueue::single_lane(
            "q",
            Backoff {
                start: Duration::from_secs(600),
                max: Duration::from_secs(600),
            },
            Some(qm),
        ));
        gauges.watch(&q);
        q.add("a", 0);
        let item = q.next(0).await.expect("a");
        q.done(&item, Outcome::Retry);
        let text = encode(&registry);
        let descriptors: Vec<&str> = text.lines().filter(|l| l.starts_with('#')).collect();
        assert_eq!(
            descriptors,
            [
                "# HELP workqueue_adds Keys queued, per queue.",
                "# TYPE workqueue_adds counter",
                "# HELP workqueue_retries Keys that failed and were scheduled for a retry after their backoff, per queue.",
                "# TYPE workqueue_retries counter",
                "# HELP workqueue_queue_duration_seconds How long a key waited in the queue before a worker took it.",
                "# TYPE workqueue_queue_duration_seconds histogram",
                "# HELP workqueue_work_duration_seconds How long a worker spent on a key.",
                "# TYPE workqueue_work_duration_seconds histogram",
                "# HELP workqueue_depth Keys ready for a worker",
                "# TYPE workqueue_depth gauge",
                "# HELP workqueue_oldest_item_age_seconds Age of the oldest key ready for a worker (0 when none)",
                "# TYPE workqueue_oldest_item_age_seconds gauge",
                "# HELP workqueue_backoff_items Keys waiting out their retry backoff",
                "# TYPE workqueue_backoff_items gauge",
                "# HELP workqueue_unfinished_work_items Keys held by a worker right now",
                "# TYPE workqueue_unfinished_work_items gauge",
                "# HELP workqueue_longest_running_processor_seconds How long the longest-running worker has held its key",
                "# TYPE workqueue_longest_running_processor_seconds gauge",
                "# EOF",
            ],
            "{text}"
        );
        for sample in [
            "workqueue_adds_total{name=\"q\"} 1",
            "workqueue_retries_total{name=\"q\"} 1",
            "workqueue_queue_duration_seconds_count{name=\"q\"} 1",
            "workqueue_work_duration_seconds_count{name=\"q\"} 1",
            "workqueue_depth{name=\"q\"} 0",
            "workqueue_oldest_item_age_seconds{name=\"q\"} 0",
            "workqueue_backoff_items{name=\"q\"} 1",
            "workqueue_unfinished_work_items{name=\"q\"} 0",
            "workqueue_longest_running_processor_seconds{name=\"q\"} 0",
        ] {
            assert!(text.contains(sample), "{sample} missing in\n{text}");
        }
        let buckets: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("workqueue_work_duration_seconds_bucket"))
            .filter_map(|l| l.split('"').nth(1))
            .collect();
        assert_eq!(
            buckets,
            [
                "1e-8", "1e-7", "0.000001", "0.00001", "0.0001", "0.001", "0.01", "0.1", "1.0",
                "10.0", "+Inf"
            ]
        );
    }

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
        let text = encode(&registry);
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

    #[tokio::test]
    async fn snapshot_reports_the_oldest_queued_item() {
        let q = WorkQueue::single_lane(
            "a",
            Backoff {
                start: Duration::from_millis(20),
                max: Duration::from_millis(200),
            },
            None,
        );
        q.add("x", 0);
        tokio::time::sleep(Duration::from_millis(30)).await;
        q.add("y", 0);
        let snap = q.snapshot()[0];
        assert_eq!(snap.depth, 2);
        assert!(snap.oldest_age >= Duration::from_millis(30));
    }
}
