//! Prometheus metrics with the kubelet's names:
//! `volume_manager_total_volumes{plugin_name,state}`,
//! `storage_operation_duration_seconds{operation_name,volume_plugin,status,migrated}`, and the
//! per-PVC `kubelet_volume_stats_*` gauges from NodeGetVolumeStats (the kubelet's
//! `{namespace,persistentvolumeclaim}` labels).

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VolumeLabels {
    plugin_name: String,
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    operation_name: String,
    volume_plugin: String,
    status: String,
    migrated: String,
}

/// The labels of the `kubelet_volume_stats_*` gauges.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct PvcLabels {
    pub namespace: String,
    pub persistentvolumeclaim: String,
}

/// Kubernetes' buckets of `storage_operation_duration_seconds`.
const OPERATION_BUCKETS: [f64; 13] = [
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 25.0, 50.0, 120.0, 300.0, 600.0,
];

fn operation_histogram() -> Histogram {
    Histogram::new(OPERATION_BUCKETS)
}

/// `kubelet_volume_stats_*`, one family per gauge.
#[derive(Debug, Clone, Default)]
pub struct VolumeStatsGauges {
    pub capacity_bytes: Family<PvcLabels, Gauge>,
    pub available_bytes: Family<PvcLabels, Gauge>,
    pub used_bytes: Family<PvcLabels, Gauge>,
    pub inodes: Family<PvcLabels, Gauge>,
    pub inodes_free: Family<PvcLabels, Gauge>,
    pub inodes_used: Family<PvcLabels, Gauge>,
}

impl VolumeStatsGauges {
    /// Forgets a PVC that is no longer mounted here.
    pub fn remove(&self, labels: &PvcLabels) {
        for f in [
            &self.capacity_bytes,
            &self.available_bytes,
            &self.used_bytes,
            &self.inodes,
            &self.inodes_free,
            &self.inodes_used,
        ] {
            f.remove(labels);
        }
    }
}

/// Everything the node agent records; cheap to clone.
#[derive(Debug, Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    total_volumes: Family<VolumeLabels, Gauge>,
    operations: Family<OperationLabels, Histogram>,
    stats: VolumeStatsGauges,
}

impl Metrics {
    pub fn register(registry: &mut Registry) -> Self {
        let total_volumes = Family::<VolumeLabels, Gauge>::default();
        let operations = Family::<OperationLabels, Histogram>::new_with_constructor(
            operation_histogram as fn() -> _,
        );
        registry.register(
            "volume_manager_total_volumes",
            "Number of volumes in the volume manager's actual state of world",
            total_volumes.clone(),
        );
        registry.register(
            "storage_operation_duration_seconds",
            "Storage operation duration",
            operations.clone(),
        );
        let stats = VolumeStatsGauges::default();
        for (name, help, family) in [
            (
                "kubelet_volume_stats_capacity_bytes",
                "Capacity in bytes of the volume",
                &stats.capacity_bytes,
            ),
            (
                "kubelet_volume_stats_available_bytes",
                "Number of available bytes in the volume",
                &stats.available_bytes,
            ),
            (
                "kubelet_volume_stats_used_bytes",
                "Number of used bytes in the volume",
                &stats.used_bytes,
            ),
            (
                "kubelet_volume_stats_inodes",
                "Maximum number of inodes in the volume",
                &stats.inodes,
            ),
            (
                "kubelet_volume_stats_inodes_free",
                "Number of free inodes in the volume",
                &stats.inodes_free,
            ),
            (
                "kubelet_volume_stats_inodes_used",
                "Number of used inodes in the volume",
                &stats.inodes_used,
            ),
        ] {
            registry.register(name, help, family.clone());
        }
        Self {
            inner: Arc::new(Inner {
                total_volumes,
                operations,
                stats,
            }),
        }
    }

    /// Metrics that go nowhere (unit tests).
    pub fn unregistered() -> Self {
        Self::register(&mut Registry::default())
    }

    pub fn set_mounted(&self, n: usize) {
        self.inner
            .total_volumes
            .get_or_create(&VolumeLabels {
                plugin_name: "kubernetes.io/csi".into(),
                state: "actual_state_of_world".into(),
            })
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// One finished operation (`volume_mount`, `volume_unmount`, `unmount_device`).
    pub fn operation(&self, name: &str, took: Duration, ok: bool) {
        self.inner
            .operations
            .get_or_create(&OperationLabels {
                operation_name: name.into(),
                volume_plugin: "kubernetes.io/csi".into(),
                status: if ok { "success" } else { "fail-unknown" }.into(),
                migrated: "false".into(),
            })
            .observe(took.as_secs_f64());
    }

    pub fn volume_stats(&self) -> &VolumeStatsGauges {
        &self.inner.stats
    }
}
