//! The Go provisioner library's controller metrics (sig-storage-lib-external-provisioner), by
//! StorageClass: provision and delete counts, failures and durations. The work queue's
//! `workqueue_*` metrics are `component_runtime::workqueue`'s (the attacher's names), with the queue
//! named [`QUEUE_NAME`]. The CSI call histogram (`csi_sidecar_operations_seconds`) is
//! `component_runtime::OperationMetrics`.

use std::sync::Arc;
use std::time::Duration;

use component_runtime::workqueue::{Backoff, QueueMetrics, WorkQueue, register_queue_gauges};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The `name` label of the work queue's metrics (one queue for claims and volumes).
pub const QUEUE_NAME: &str = "csi-provisioner";

/// The controller's single-lane work queue, its `workqueue_*` metrics registered in `registry`.
pub(crate) fn work_queue(registry: &mut Registry, backoff: Backoff) -> Arc<WorkQueue> {
    let counters = Arc::new(QueueMetrics::register(registry));
    let gauges = register_queue_gauges(registry);
    let queue = Arc::new(WorkQueue::single_lane(QUEUE_NAME, backoff, Some(counters)));
    gauges.watch(&queue);
    queue
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClassLabel {
    class: String,
}

fn histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.1, 2.0, 12))
}

/// Counters and histograms of provisions and deletes.
#[derive(Clone, Debug)]
pub struct ControllerMetrics {
    provision_total: Family<ClassLabel, Counter>,
    provision_failed: Family<ClassLabel, Counter>,
    provision_seconds: Family<ClassLabel, Histogram, fn() -> Histogram>,
    delete_total: Family<ClassLabel, Counter>,
    delete_failed: Family<ClassLabel, Counter>,
    delete_seconds: Family<ClassLabel, Histogram, fn() -> Histogram>,
}

impl ControllerMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self {
            provision_total: Family::default(),
            provision_failed: Family::default(),
            provision_seconds: Family::new_with_constructor(histogram),
            delete_total: Family::default(),
            delete_failed: Family::default(),
            delete_seconds: Family::new_with_constructor(histogram),
        };
        // prometheus-client appends `_total` to counters.
        registry.register(
            "controller_persistentvolumeclaim_provision",
            "Total number of persistent volumes provisioned succesfully",
            m.provision_total.clone(),
        );
        registry.register(
            "controller_persistentvolumeclaim_provision_failed",
            "Total number of persistent volume provision failed attempts",
            m.provision_failed.clone(),
        );
        registry.register(
            "controller_persistentvolumeclaim_provision_duration_seconds",
            "Latency in seconds to provision persistent volumes",
            m.provision_seconds.clone(),
        );
        registry.register(
            "controller_persistentvolume_delete",
            "Total number of persistent volumes deleted succesfully",
            m.delete_total.clone(),
        );
        registry.register(
            "controller_persistentvolume_delete_failed",
            "Total number of persistent volume delete failed attempts",
            m.delete_failed.clone(),
        );
        registry.register(
            "controller_persistentvolume_delete_duration_seconds",
            "Latency in seconds to delete persistent volumes",
            m.delete_seconds.clone(),
        );
        m
    }

    fn label(class: &str) -> ClassLabel {
        ClassLabel {
            class: class.to_string(),
        }
    }

    pub(crate) fn provisioned(&self, class: &str, took: Duration) {
        self.provision_total
            .get_or_create(&Self::label(class))
            .inc();
        self.provision_seconds
            .get_or_create(&Self::label(class))
            .observe(took.as_secs_f64());
    }

    pub(crate) fn provision_failed(&self, class: &str) {
        self.provision_failed
            .get_or_create(&Self::label(class))
            .inc();
    }

    pub(crate) fn deleted(&self, class: &str, took: Duration) {
        self.delete_total.get_or_create(&Self::label(class)).inc();
        self.delete_seconds
            .get_or_create(&Self::label(class))
            .observe(took.as_secs_f64());
    }

    pub(crate) fn delete_failed(&self, class: &str) {
        self.delete_failed.get_or_create(&Self::label(class)).inc();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn names_are_the_go_librarys() {
        let mut r = Registry::default();
        let m = ControllerMetrics::register(&mut r);
        m.provisioned("fast", Duration::from_millis(300));
        m.provision_failed("fast");
        m.deleted("fast", Duration::from_secs(1));
        m.delete_failed("fast");
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).unwrap();
        for name in [
            "controller_persistentvolumeclaim_provision_total{class=\"fast\"} 1",
            "controller_persistentvolumeclaim_provision_failed_total{class=\"fast\"} 1",
            "controller_persistentvolumeclaim_provision_duration_seconds_count{class=\"fast\"} 1",
            "controller_persistentvolume_delete_total{class=\"fast\"} 1",
            "controller_persistentvolume_delete_failed_total{class=\"fast\"} 1",
            "controller_persistentvolume_delete_duration_seconds_count{class=\"fast\"} 1",
        ] {
            assert!(text.contains(name), "{name} missing in\n{text}");
        }
    }

    #[tokio::test]
    async fn the_work_queue_reports_under_the_attachers_metric_names() {
        let mut r = Registry::default();
        let backoff = Backoff {
            start: Duration::from_secs(600),
            max: Duration::from_secs(600),
        };
        let q = work_queue(&mut r, backoff);
        q.add("claim/default/a", component_runtime::workqueue::SINGLE_LANE);
        q.add("volume/pv-b", component_runtime::workqueue::SINGLE_LANE);
        let item = q
            .next(component_runtime::workqueue::SINGLE_LANE)
            .await
            .unwrap();
        q.done(&item, component_runtime::workqueue::Outcome::Retry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).unwrap();
        for name in [
            "workqueue_adds_total{name=\"csi-provisioner\"} 2",
            "workqueue_retries_total{name=\"csi-provisioner\"} 1",
            "workqueue_depth{name=\"csi-provisioner\"} 1",
            "workqueue_backoff_items{name=\"csi-provisioner\"} 1",
            "workqueue_unfinished_work_items{name=\"csi-provisioner\"} 0",
            "workqueue_queue_duration_seconds_count{name=\"csi-provisioner\"} 1",
            "workqueue_work_duration_seconds_count{name=\"csi-provisioner\"} 1",
            "workqueue_oldest_item_age_seconds{name=\"csi-provisioner\"}",
            "workqueue_longest_running_processor_seconds{name=\"csi-provisioner\"}",
        ] {
            assert!(text.contains(name), "{name} missing in\n{text}");
        }
    }
}
