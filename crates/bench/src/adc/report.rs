//! What a run measured, and the table it prints: one column per scenario.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::Scenario;
use crate::harness::writes::Writes;

/// One process under test.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Component {
    pub bin: String,
    /// Every argument it got, the benchmark's first.
    pub args: Vec<String>,
    /// User-Agents of its writes.
    pub user_agents: BTreeSet<String>,
    /// Its writes from its start until it was stopped (after the settle time).
    pub writes: Writes,
    /// Its writes from its start until every volume was listed (bypass-adc: until the last pod
    /// was created).
    pub writes_until_done: Writes,
    /// Peak resident set size (VmHWM).
    pub peak_rss_bytes: Option<u64>,
    /// User + system CPU time over its whole life (start-up and settle included).
    pub cpu_seconds: Option<f64>,
}

/// One scenario's numbers.
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioReport {
    pub scenario: Scenario,
    /// The CSIDriver's spec.attachRequired.
    pub attach_required: bool,
    /// The ADC's --skip-attach.
    pub skip_attach: String,
    /// Creating Nodes, CSINodes, the CSIDriver, PVCs and PVs (before any process starts).
    pub setup_seconds: f64,
    /// From starting the processes until they watch what they need (the clock has not started).
    pub startup_seconds: f64,
    /// From the first pod create until the last create was answered.
    pub pods_created_seconds: f64,
    /// From the first pod create until the first / every volume was in its node's
    /// status.volumesAttached; `None` when not expected (bypass-adc) or not reached.
    pub first_listed_seconds: Option<f64>,
    pub all_listed_seconds: Option<f64>,
    /// How long the processes ran on after that (or after the last pod create).
    pub settle_seconds: f64,
    /// At the end: expected volumes listed in volumesAttached, and other entries.
    pub volumes_listed: usize,
    pub unexpected_listed: usize,
    /// At the end: VolumeAttachments, those attached, and those named as Kubernetes names them
    /// for the run's volumes (csi-sha256(handle + driver + node)).
    pub volume_attachments: usize,
    pub volume_attachments_attached: usize,
    pub volume_attachments_named_right: usize,
    pub adc: Component,
    /// Only where VolumeAttachments must be fulfilled (attach-required).
    pub attacher: Option<Component>,
    /// attachdetach_controller_* and storage_operation_duration_seconds_count samples of the
    /// ADC's /metrics just before it was stopped (empty if the scrape failed).
    pub adc_metrics: BTreeMap<String, f64>,
    /// ControllerPublishVolume calls the built-in csi-mock answered (attach-required).
    pub csi_publish_calls: Option<u64>,
    /// the benchmark's own writes as it counted them, and as the API server saw them.
    pub own_writes: u64,
    pub own_writes_seen: u64,
}

/// Everything a run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub pods: usize,
    pub nodes: usize,
    pub driver: String,
    /// How often each scenario ran (the scenarios in turn, then again).
    pub runs: usize,
    /// Every scenario run, in the order they ran.
    pub scenarios: Vec<ScenarioReport>,
    /// Per run: attach-required's time to all listed / through-adc's (the target: ≥ 3).
    pub through_adc_speedups: Vec<f64>,
    /// Their median.
    pub through_adc_speedup: Option<f64>,
}

impl Report {
    pub fn new(
        pods: usize,
        nodes: usize,
        driver: String,
        runs: usize,
        scenarios: Vec<ScenarioReport>,
    ) -> Self {
        let times = |which: Scenario| -> Vec<Option<f64>> {
            scenarios
                .iter()
                .filter(|r| r.scenario == which)
                .map(|r| r.all_listed_seconds)
                .collect()
        };
        // The n-th run of one against the n-th run of the other.
        let through_adc_speedups: Vec<f64> = times(Scenario::AttachRequired)
            .into_iter()
            .zip(times(Scenario::ThroughAdc))
            .filter_map(|pair| match pair {
                (Some(a), Some(t)) if t > 0.0 => Some(a / t),
                _ => None,
            })
            .collect();
        let through_adc_speedup =
            crate::harness::table::spread(&through_adc_speedups).map(|(median, _, _)| median);
        Self {
            pods,
            nodes,
            driver,
            runs,
            scenarios,
            through_adc_speedups,
            through_adc_speedup,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writes(pairs: &[(&str, u64)]) -> Writes {
        Writes {
            total: pairs.iter().map(|p| p.1).sum(),
            failed: 0,
            by_request: pairs.iter().map(|(k, n)| ((*k).to_owned(), *n)).collect(),
        }
    }

    fn scenario(
        s: Scenario,
        all: Option<f64>,
        adc: Writes,
        attacher: Option<Writes>,
    ) -> ScenarioReport {
        ScenarioReport {
            scenario: s,
            attach_required: s.attach_required(),
            skip_attach: s.skip_attach().into(),
            setup_seconds: 0.5,
            startup_seconds: 0.2,
            pods_created_seconds: 0.4,
            first_listed_seconds: all.map(|a| a / 10.0),
            all_listed_seconds: all,
            settle_seconds: 3.0,
            volumes_listed: if all.is_some() { 10 } else { 0 },
            unexpected_listed: 0,
            volume_attachments: 0,
            volume_attachments_attached: 0,
            volume_attachments_named_right: 0,
            adc: Component {
                bin: "/t/attach-detach-controller".into(),
                user_agents: ["attach-detach-controller/0.1.0".to_owned()].into(),
                writes: adc.clone(),
                writes_until_done: adc,
                peak_rss_bytes: Some(20 * 1024 * 1024),
                cpu_seconds: Some(0.25),
                ..Component::default()
            },
            attacher: attacher.map(|w| Component {
                bin: "/t/csi-attacher".into(),
                args: vec![
                    "--kubeconfig=/tmp/x/kubeconfig".into(),
                    "--v=2".into(),
                    "--kube-api-qps=-1".into(),
                ],
                writes: w,
                ..Component::default()
            }),
            adc_metrics: BTreeMap::new(),
            csi_publish_calls: None,
            own_writes: 5,
            own_writes_seen: 5,
        }
    }

    #[test]
    fn table_has_a_column_per_scenario_and_the_speedup() {
        let report = Report::new(
            10,
            2,
            "mock.csi.rs".into(),
            1,
            vec![
                scenario(
                    Scenario::AttachRequired,
                    Some(2.0),
                    writes(&[
                        ("create volumeattachments", 10),
                        ("patch nodes/status", 4),
                        ("create events", 10),
                    ]),
                    Some(writes(&[
                        ("patch volumeattachments", 20),
                        ("patch persistentvolumes", 10),
                    ])),
                ),
                scenario(
                    Scenario::ThroughAdc,
                    Some(0.5),
                    writes(&[("patch nodes/status", 2)]),
                    None,
                ),
                scenario(Scenario::BypassAdc, None, Writes::default(), None),
            ],
        );
        assert_eq!(report.through_adc_speedup, Some(4.0));
        let t = report.table();
        assert!(
            t.contains("attacher: /t/csi-attacher --v=2 --kube-api-qps=-1\n"),
            "{t}"
        );
        let row = |label: &str| {
            t.lines()
                .find(|l| l.starts_with(label))
                .unwrap_or_else(|| panic!("no {label} row in\n{t}"))
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        };
        let header = t
            .lines()
            .find(|l| l.trim_start().starts_with("attach-required"));
        assert_eq!(
            header.map(|h| h.split_whitespace().collect::<Vec<_>>()),
            Some(vec!["attach-required", "through-adc", "bypass-adc"]),
            "{t}"
        );
        assert_eq!(
            row("all in volumesAttached"),
            "all in volumesAttached 2.00 s 0.50 s n/a"
        );
        assert_eq!(
            row("ADC writes / volume"),
            "ADC writes / volume 2.40 0.20 0.00"
        );
        assert_eq!(row("  VolumeAttachment"), "VolumeAttachment 1.00 0.00 0.00");
        assert_eq!(row("  Node (status)"), "Node (status) 0.40 0.20 0.00");
        assert_eq!(
            row("attacher writes / volume"),
            "attacher writes / volume 3.00 n/a n/a"
        );
        assert_eq!(
            row("ADC peak RSS"),
            "ADC peak RSS 20.0 MiB 20.0 MiB 20.0 MiB"
        );
        assert!(t.contains("4.00x as fast"), "{t}");
        assert!(t.contains("attacher  patch persistentvolumes"), "{t}");
        assert!(
            t.contains("ADC       user agents: attach-detach-controller/0.1.0"),
            "{t}"
        );
        assert!(!t.contains("warning"), "{t}");

        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["scenarios"][1]["scenario"], "through-adc");
        assert_eq!(json["scenarios"][0]["adc"]["writes"]["total"], 24);
        assert_eq!(
            json["scenarios"][2]["all_listed_seconds"],
            serde_json::Value::Null
        );
    }

    #[test]
    fn no_speedup_without_both_times() {
        let r = Report::new(
            1,
            1,
            "d".into(),
            1,
            vec![scenario(
                Scenario::ThroughAdc,
                Some(1.0),
                Writes::default(),
                None,
            )],
        );
        assert_eq!(r.through_adc_speedup, None);
        assert!(!r.table().contains("as fast"));
    }

    #[test]
    fn several_runs_show_median_and_range() {
        let run = |required: f64, through: f64, seen: u64| {
            let mut r = scenario(
                Scenario::AttachRequired,
                Some(required),
                Writes::default(),
                None,
            );
            r.own_writes_seen = seen;
            vec![
                r,
                scenario(Scenario::ThroughAdc, Some(through), Writes::default(), None),
            ]
        };
        let mut all = run(2.0, 0.5, 5);
        all.extend(run(3.0, 0.5, 5));
        all.extend(run(2.5, 0.25, 4));
        let report = Report::new(10, 2, "d".into(), 3, all);
        assert_eq!(report.through_adc_speedups, vec![4.0, 6.0, 10.0]);
        assert_eq!(report.through_adc_speedup, Some(6.0));
        let t = report.table();
        let line = t
            .lines()
            .find(|l| l.starts_with("all in volumesAttached"))
            .unwrap();
        assert!(line.contains("2.50 (2.00-3.00) s"), "{t}");
        assert!(line.contains("0.50 (0.25-0.50) s"), "{t}");
        let header = t
            .lines()
            .find(|l| l.trim_start().starts_with("attach-required"));
        assert_eq!(
            header.map(|h| h.split_whitespace().count()),
            Some(2),
            "one column per scenario: {t}"
        );
        assert!(t.contains("6.00x (4.00-10.00x) as fast"), "{t}");
        assert!(
            t.contains("attach-required writes by request (first run):"),
            "{t}"
        );
        assert!(
            t.contains(
                "warning: attach-required: the benchmark counted 5 own writes but the API server saw 4"
            ),
            "{t}"
        );
    }
}
