//! Prometheus metrics with kube-controller-manager's names:
//! `attachdetach_controller_total_volumes{plugin_name,state}`,
//! `attachdetach_controller_forced_detaches`,
//! `storage_operation_duration_seconds{operation_name,volume_plugin,status,migrated}`; and
//! `attachdetach_controller_api_writes_total{verb,resource}` (ours: the writes this controller
//! makes itself, VolumeAttachment creates and deletes counted per operation).

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct VolumeLabels {
    pub plugin_name: String,
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct OperationLabels {
    pub operation_name: String,
    pub volume_plugin: String,
    pub status: String,
    pub migrated: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct WriteLabels {
    pub verb: String,
    pub resource: String,
}

/// Kubernetes' buckets of `storage_operation_duration_seconds`.
const OPERATION_BUCKETS: [f64; 13] = [
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 25.0, 50.0, 120.0, 300.0, 600.0,
];

fn operation_histogram() -> Histogram {
    Histogram::new(OPERATION_BUCKETS)
}

/// Everything the controller records.
#[derive(Debug)]
pub struct Metrics {
    total_volumes: Family<VolumeLabels, Gauge>,
    /// A gauge that only goes up: OpenMetrics would append `_total` to a counter, and
    /// Kubernetes' name has no suffix (its Go client does not add one).
    forced_detaches: Gauge,
    operations: Family<OperationLabels, Histogram>,
    api_writes: Family<WriteLabels, Counter>,
}

/// The `state` label values of `attachdetach_controller_total_volumes`.
pub(crate) const DESIRED: &str = "desired_state_of_world";
pub(crate) const ACTUAL: &str = "actual_state_of_world";

impl Metrics {
    pub fn register(registry: &mut Registry) -> Self {
        let total_volumes = Family::<VolumeLabels, Gauge>::default();
        let forced_detaches = Gauge::default();
        let operations = Family::<OperationLabels, Histogram>::new_with_constructor(
            operation_histogram as fn() -> _,
        );
        let api_writes = Family::<WriteLabels, Counter>::default();
        registry.register(
            "attachdetach_controller_total_volumes",
            "Number of volumes in the attach/detach controller's desired and actual state, per plugin",
            total_volumes.clone(),
        );
        registry.register(
            "attachdetach_controller_forced_detaches",
            "Number of times the attach/detach controller detached a volume the node still reported in use (after --max-wait-for-unmount)",
            forced_detaches.clone(),
        );
        registry.register(
            "storage_operation_duration_seconds",
            "Storage operation duration, per operation, plugin, outcome and migration",
            operations.clone(),
        );
        registry.register(
            "attachdetach_controller_api_writes",
            "Kubernetes API writes of the attach/detach controller, per verb and resource",
            api_writes.clone(),
        );
        Self {
            total_volumes,
            forced_detaches,
            operations,
            api_writes,
        }
    }

    /// Replaces the volume counts: `(plugin, state) → count`.
    pub(crate) fn set_total_volumes(
        &self,
        counts: &std::collections::BTreeMap<(String, &'static str), i64>,
    ) {
        self.total_volumes.clear();
        for ((plugin, state), n) in counts {
            self.total_volumes
                .get_or_create(&VolumeLabels {
                    plugin_name: plugin.clone(),
                    state: (*state).to_string(),
                })
                .set(*n);
        }
    }

    pub(crate) fn forced_detach(&self) {
        self.forced_detaches.inc();
    }

    /// One attach or detach: `operation` is `volume_attach` or `volume_detach`.
    pub(crate) fn operation(
        &self,
        operation: &str,
        plugin: &str,
        success: bool,
        migrated: bool,
        took: Duration,
    ) {
        self.operations
            .get_or_create(&OperationLabels {
                operation_name: operation.into(),
                volume_plugin: plugin.into(),
                status: if success { "success" } else { "fail-unknown" }.into(),
                migrated: migrated.to_string(),
            })
            .observe(took.as_secs_f64());
    }

    pub(crate) fn api_write(&self, verb: &str, resource: &str) {
        self.api_writes
            .get_or_create(&WriteLabels {
                verb: verb.into(),
                resource: resource.into(),
            })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_labels_are_kubernetes() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        let mut counts = std::collections::BTreeMap::new();
        counts.insert(("kubernetes.io/csi:d".to_string(), DESIRED), 3);
        m.set_total_volumes(&counts);
        m.forced_detach();
        m.operation(
            "volume_attach",
            "kubernetes.io/csi:d",
            true,
            false,
            Duration::from_millis(300),
        );
        m.api_write("patch", "nodes");
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        for want in [
            "attachdetach_controller_total_volumes{plugin_name=\"kubernetes.io/csi:d\",state=\"desired_state_of_world\"} 3",
            "attachdetach_controller_forced_detaches 1",
            "storage_operation_duration_seconds_count{operation_name=\"volume_attach\",volume_plugin=\"kubernetes.io/csi:d\",status=\"success\",migrated=\"false\"} 1",
            "attachdetach_controller_api_writes_total{verb=\"patch\",resource=\"nodes\"} 1",
        ] {
            assert!(text.contains(want), "{want} missing in\n{text}");
        }
        // A plugin that left both states is no longer reported.
        m.set_total_volumes(&std::collections::BTreeMap::new());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        assert!(
            !text.contains("plugin_name=\"kubernetes.io/csi:d\""),
            "{text}"
        );
    }
}
