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

/// The `volume_plugin` label of an operation, as the kubelet writes it: `kubernetes.io/csi:`
/// and the driver for a CSI volume (`kubernetes.io/csi/<driver>^<handle>`), the plugin's name
/// for an in-tree one (`kubernetes.io/aws-ebs/aws://...`).
fn plugin_label(unique_name: &str) -> String {
    if let Some(rest) = unique_name.strip_prefix("kubernetes.io/csi/") {
        let driver = rest.split_once('^').map_or(rest, |(d, _)| d);
        return format!("kubernetes.io/csi:{driver}");
    }
    let mut parts = unique_name.splitn(3, '/');
    match (parts.next(), parts.next()) {
        (Some(domain), Some(plugin)) => format!("{domain}/{plugin}"),
        _ => unique_name.to_string(),
    }
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

    /// One finished operation (`volume_mount`, `volume_unmount`, `unmount_device`) on the
    /// volume `unique_name`; `migrated`: an in-tree volume served by its CSI driver.
    pub fn operation(
        &self,
        name: &str,
        unique_name: &str,
        migrated: bool,
        took: Duration,
        ok: bool,
    ) {
        self.inner
            .operations
            .get_or_create(&OperationLabels {
                operation_name: name.into(),
                volume_plugin: plugin_label(unique_name),
                status: if ok { "success" } else { "fail-unknown" }.into(),
                migrated: migrated.to_string(),
            })
            .observe(took.as_secs_f64());
    }

    pub fn volume_stats(&self) -> &VolumeStatsGauges {
        &self.inner.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_volume_plugin_label_names_the_csi_driver_or_the_in_tree_plugin() {
        assert_eq!(
            plugin_label("kubernetes.io/csi/ebs.csi.aws.com^vol-0abc"),
            "kubernetes.io/csi:ebs.csi.aws.com"
        );
        assert_eq!(
            plugin_label("kubernetes.io/aws-ebs/aws://us-east-1a/vol-0abc"),
            "kubernetes.io/aws-ebs"
        );
        assert_eq!(plugin_label("odd"), "odd");
    }

    #[test]
    fn operations_carry_their_plugin_and_migration() {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        let took = Duration::from_millis(5);
        metrics.operation(
            "volume_mount",
            "kubernetes.io/csi/ebs.csi.aws.com^vol-1",
            true,
            took,
            true,
        );
        metrics.operation(
            "unmount_device",
            "kubernetes.io/aws-ebs/aws://us-east-1a/vol-2",
            false,
            took,
            false,
        );
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap_or_default();
        assert!(
            text.contains(r#"storage_operation_duration_seconds_count{operation_name="volume_mount",volume_plugin="kubernetes.io/csi:ebs.csi.aws.com",status="success",migrated="true"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"storage_operation_duration_seconds_count{operation_name="unmount_device",volume_plugin="kubernetes.io/aws-ebs",status="fail-unknown",migrated="false"} 1"#),
            "{text}"
        );
    }
}
