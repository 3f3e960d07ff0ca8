//! Prometheus metrics with kube-controller-manager's names:
//! `pv_collector_bound_pv_count{storage_class}`, `pv_collector_unbound_pv_count{storage_class}`,
//! `pv_collector_bound_pvc_count{namespace}`, `pv_collector_unbound_pvc_count{namespace}`,
//! `volume_operation_total_errors{plugin_name,operation_name}` and
//! `storage_operation_duration_seconds{operation_name,volume_plugin,status,migrated}` (the
//! in-tree provisions and deletes: `volume_provision`, `volume_delete`).

use std::collections::BTreeMap;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ClassLabels {
    pub storage_class: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct NamespaceLabels {
    pub namespace: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ErrorLabels {
    pub plugin_name: String,
    pub operation_name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct OperationLabels {
    pub operation_name: String,
    pub volume_plugin: String,
    pub status: String,
    pub migrated: String,
}

/// Kubernetes' buckets of `storage_operation_duration_seconds`.
const OPERATION_BUCKETS: [f64; 13] = [
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 25.0, 50.0, 120.0, 300.0, 600.0,
];

fn operation_histogram() -> Histogram {
    Histogram::new(OPERATION_BUCKETS)
}

/// Counts of one pass, for the `pv_collector_*` gauges.
#[derive(Debug, Default)]
pub(crate) struct Counts {
    pub bound_pv: BTreeMap<String, i64>,
    pub unbound_pv: BTreeMap<String, i64>,
    pub bound_pvc: BTreeMap<String, i64>,
    pub unbound_pvc: BTreeMap<String, i64>,
}

/// Everything the controller records.
#[derive(Debug)]
pub struct Metrics {
    bound_pv: Family<ClassLabels, Gauge>,
    unbound_pv: Family<ClassLabels, Gauge>,
    bound_pvc: Family<NamespaceLabels, Gauge>,
    unbound_pvc: Family<NamespaceLabels, Gauge>,
    /// A gauge that only goes up: OpenMetrics would append `_total` to a counter, and
    /// Kubernetes' name already ends in `_errors`.
    errors: Family<ErrorLabels, Gauge>,
    operations: Family<OperationLabels, Histogram>,
}

impl Metrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self {
            bound_pv: Family::default(),
            unbound_pv: Family::default(),
            bound_pvc: Family::default(),
            unbound_pvc: Family::default(),
            errors: Family::default(),
            operations: Family::new_with_constructor(operation_histogram as fn() -> _),
        };
        registry.register(
            "pv_collector_bound_pv_count",
            "Gauge measuring number of persistent volume currently bound",
            m.bound_pv.clone(),
        );
        registry.register(
            "pv_collector_unbound_pv_count",
            "Gauge measuring number of persistent volume currently unbound",
            m.unbound_pv.clone(),
        );
        registry.register(
            "pv_collector_bound_pvc_count",
            "Gauge measuring number of persistent volume claim currently bound",
            m.bound_pvc.clone(),
        );
        registry.register(
            "pv_collector_unbound_pvc_count",
            "Gauge measuring number of persistent volume claim currently unbound",
            m.unbound_pvc.clone(),
        );
        registry.register(
            "volume_operation_total_errors",
            "Total volume operation errors",
            m.errors.clone(),
        );
        registry.register(
            "storage_operation_duration_seconds",
            "Storage operation duration, per operation, plugin, outcome and migration",
            m.operations.clone(),
        );
        m
    }

    pub(crate) fn set_counts(&self, counts: &Counts) {
        fn class(family: &Family<ClassLabels, Gauge>, values: &BTreeMap<String, i64>) {
            family.clear();
            for (k, v) in values {
                family
                    .get_or_create(&ClassLabels {
                        storage_class: k.clone(),
                    })
                    .set(*v);
            }
        }
        fn namespace(family: &Family<NamespaceLabels, Gauge>, values: &BTreeMap<String, i64>) {
            family.clear();
            for (k, v) in values {
                family
                    .get_or_create(&NamespaceLabels {
                        namespace: k.clone(),
                    })
                    .set(*v);
            }
        }
        class(&self.bound_pv, &counts.bound_pv);
        class(&self.unbound_pv, &counts.unbound_pv);
        namespace(&self.bound_pvc, &counts.bound_pvc);
        namespace(&self.unbound_pvc, &counts.unbound_pvc);
    }

    /// One provision or delete: `operation` is `volume_provision` or `volume_delete`.
    pub(crate) fn operation(&self, operation: &str, plugin: &str, success: bool, took: Duration) {
        self.operations
            .get_or_create(&OperationLabels {
                operation_name: operation.into(),
                volume_plugin: plugin.into(),
                status: if success { "success" } else { "fail-unknown" }.into(),
                migrated: "false".into(),
            })
            .observe(took.as_secs_f64());
        if !success {
            self.errors
                .get_or_create(&ErrorLabels {
                    plugin_name: plugin.into(),
                    operation_name: operation.into(),
                })
                .inc();
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn names_and_labels_are_kubernetes() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        let mut counts = Counts::default();
        counts.bound_pv.insert("fast".into(), 2);
        counts.unbound_pvc.insert("ns1".into(), 1);
        m.set_counts(&counts);
        m.operation(
            "volume_provision",
            "kubernetes.io/aws-ebs",
            false,
            Duration::from_millis(300),
        );
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        for want in [
            "pv_collector_bound_pv_count{storage_class=\"fast\"} 2",
            "pv_collector_unbound_pvc_count{namespace=\"ns1\"} 1",
            "volume_operation_total_errors{plugin_name=\"kubernetes.io/aws-ebs\",operation_name=\"volume_provision\"} 1",
            "storage_operation_duration_seconds_count{operation_name=\"volume_provision\",volume_plugin=\"kubernetes.io/aws-ebs\",status=\"fail-unknown\",migrated=\"false\"} 1",
        ] {
            assert!(text.contains(want), "{want} missing in\n{text}");
        }
    }
}
