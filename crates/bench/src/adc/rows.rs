//! The table's rows as numbers: each row takes a scenario's report to one value, so that several
//! runs of a scenario print as "median (min–max)" and one run as its value.

use super::report::ScenarioReport;
use crate::harness::table::{Row, Unit};

fn per(n: u64, pods: usize) -> Option<f64> {
    (pods > 0).then(|| n as f64 / pods as f64)
}

/// The rows of the table, in order.
pub(crate) const ROWS: &[Row<ScenarioReport>] = &[
    Row {
        label: "setup",
        unit: Unit::Seconds,
        value: |s, _| Some(s.setup_seconds),
    },
    Row {
        label: "processes ready",
        unit: Unit::Seconds,
        value: |s, _| Some(s.startup_seconds),
    },
    Row {
        label: "pods created",
        unit: Unit::Seconds,
        value: |s, _| Some(s.pods_created_seconds),
    },
    Row {
        label: "first in volumesAttached",
        unit: Unit::Seconds,
        value: |s, _| s.first_listed_seconds,
    },
    Row {
        label: "all in volumesAttached",
        unit: Unit::Seconds,
        value: |s, _| s.all_listed_seconds,
    },
    Row {
        label: "listed at end",
        unit: Unit::Count,
        value: |s, _| Some(s.volumes_listed as f64),
    },
    Row {
        label: "  other entries",
        unit: Unit::Count,
        value: |s, _| Some(s.unexpected_listed as f64),
    },
    Row {
        label: "VolumeAttachments at end",
        unit: Unit::Count,
        value: |s, _| Some(s.volume_attachments as f64),
    },
    Row {
        label: "  attached",
        unit: Unit::Count,
        value: |s, _| Some(s.volume_attachments_attached as f64),
    },
    Row {
        label: "ADC writes / volume",
        unit: Unit::Ratio,
        value: |s, n| per(s.adc.writes.total, n),
    },
    Row {
        label: "  VolumeAttachment",
        unit: Unit::Ratio,
        value: |s, n| per(s.adc.writes.to_resource("volumeattachments"), n),
    },
    Row {
        label: "  Node (status)",
        unit: Unit::Ratio,
        value: |s, n| per(s.adc.writes.to_resource("nodes"), n),
    },
    Row {
        label: "  Event",
        unit: Unit::Ratio,
        value: |s, n| per(s.adc.writes.to_resource("events"), n),
    },
    Row {
        label: "  failed",
        unit: Unit::Count,
        value: |s, _| Some(s.adc.writes.failed as f64),
    },
    Row {
        label: "ADC peak RSS",
        unit: Unit::Bytes,
        value: |s, _| s.adc.peak_rss_bytes.map(|b| b as f64),
    },
    Row {
        label: "ADC CPU",
        unit: Unit::Seconds,
        value: |s, _| s.adc.cpu_seconds,
    },
    Row {
        label: "attacher writes / volume",
        unit: Unit::Ratio,
        value: |s, n| s.attacher.as_ref().and_then(|a| per(a.writes.total, n)),
    },
    Row {
        label: "attacher peak RSS",
        unit: Unit::Bytes,
        value: |s, _| {
            s.attacher
                .as_ref()
                .and_then(|a| a.peak_rss_bytes)
                .map(|b| b as f64)
        },
    },
    Row {
        label: "attacher CPU",
        unit: Unit::Seconds,
        value: |s, _| s.attacher.as_ref().and_then(|a| a.cpu_seconds),
    },
];
