//! The table's rows as numbers: each row takes a scenario's report to one value, so that several
//! runs of a scenario print as "median (min–max)" and one run as its value.

use crate::report::ScenarioReport;

/// How a row's value is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Seconds,
    Count,
    /// Per volume, two decimals.
    Ratio,
    Bytes,
}

pub(crate) struct Row {
    pub(crate) label: &'static str,
    pub(crate) unit: Unit,
    /// The value for one run of a scenario with `pods` pods; `None`: not applicable.
    pub(crate) value: fn(&ScenarioReport, usize) -> Option<f64>,
}

fn per(n: u64, pods: usize) -> Option<f64> {
    (pods > 0).then(|| n as f64 / pods as f64)
}

/// The rows of the table, in order.
pub(crate) const ROWS: &[Row] = &[
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

fn number(unit: Unit, v: f64) -> String {
    match unit {
        Unit::Seconds | Unit::Ratio => format!("{v:.2}"),
        Unit::Count => format!("{v:.0}"),
        Unit::Bytes => format!("{:.1}", v / (1024.0 * 1024.0)),
    }
}

fn suffix(unit: Unit) -> &'static str {
    match unit {
        Unit::Seconds => " s",
        Unit::Bytes => " MiB",
        Unit::Count | Unit::Ratio => "",
    }
}

/// The median (the mean of the middle two for an even count), min and max; `None` when empty.
pub fn spread(values: &[f64]) -> Option<(f64, f64, f64)> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    let median = if v.len() % 2 == 0 {
        (v[mid - 1] + v[mid]) / 2.0
    } else {
        v[mid]
    };
    Some((median, v[0], v[v.len() - 1]))
}

/// One cell: "n/a", a value, or "median (min-max)" when the runs differ.
pub fn cell(unit: Unit, values: &[f64]) -> String {
    match spread(values) {
        None => "n/a".to_owned(),
        Some((median, min, max)) => {
            let (lo, hi) = (number(unit, min), number(unit, max));
            if lo == hi {
                format!("{}{}", number(unit, median), suffix(unit))
            } else {
                format!("{} ({lo}-{hi}){}", number(unit, median), suffix(unit))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_takes_the_middle() {
        assert_eq!(spread(&[]), None);
        assert_eq!(spread(&[3.0, 1.0, 2.0]), Some((2.0, 1.0, 3.0)));
        assert_eq!(spread(&[4.0, 1.0, 2.0, 3.0]), Some((2.5, 1.0, 4.0)));
        assert_eq!(spread(&[f64::NAN, 1.0]), Some((1.0, 1.0, 1.0)));
    }

    #[test]
    fn cells_show_the_range_only_when_runs_differ() {
        assert_eq!(cell(Unit::Seconds, &[]), "n/a");
        assert_eq!(cell(Unit::Seconds, &[5.191]), "5.19 s");
        assert_eq!(
            cell(Unit::Seconds, &[5.19, 5.03, 5.66]),
            "5.19 (5.03-5.66) s"
        );
        assert_eq!(cell(Unit::Count, &[1000.0, 1000.0]), "1000");
        assert_eq!(cell(Unit::Ratio, &[1.0, 1.001]), "1.00");
        assert_eq!(
            cell(
                Unit::Bytes,
                &[70.0 * 1048576.0, 68.0 * 1048576.0, 73.0 * 1048576.0]
            ),
            "70.0 (68.0-73.0) MiB"
        );
    }
}
