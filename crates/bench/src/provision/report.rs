//! What a run measured, and the table it prints: one column per scenario, "median (min-max)"
//! over the runs.

use std::collections::{BTreeMap, BTreeSet};

use crate::harness::procfs::Memory;
use crate::harness::stats::Summary;
use serde::Serialize;

use super::Party;
use super::Scenario;
use crate::harness::writes::{Tally, Writes};

/// The writes of one phase, by party.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PhaseWrites {
    pub provisioner: Writes,
    pub pv_controller: Writes,
    /// Neither of the two nor the benchmark: should stay empty.
    pub other: Writes,
    pub other_agents: BTreeSet<String>,
    /// The benchmark's own (the claims' creates and deletes).
    pub own: Writes,
}

impl From<Tally<Party>> for PhaseWrites {
    fn from(t: Tally<Party>) -> Self {
        PhaseWrites {
            provisioner: t.of(Party::Provisioner),
            pv_controller: t.of(Party::PvController),
            other: t.of(Party::Other),
            other_agents: t.agents_of(Party::Other),
            own: t.own,
        }
    }
}

/// Memory of a process at one moment, from `/proc/PID/status`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct MemorySample {
    /// VmRSS: resident now.
    pub rss_bytes: u64,
    /// VmHWM: the peak so far (start-up included).
    pub hwm_bytes: u64,
}

impl From<Memory> for MemorySample {
    fn from(m: Memory) -> Self {
        Self {
            rss_bytes: m.rss,
            hwm_bytes: m.hwm,
        }
    }
}

/// One child process (the provisioner or the driver).
#[derive(Debug, Clone, Default, Serialize)]
pub struct ProcessReport {
    pub bin: String,
    /// Every argument it got.
    pub args: Vec<String>,
    /// When every claim was Bound, and after the deletes and the settle time.
    pub at_bound: Option<MemorySample>,
    pub at_end: Option<MemorySample>,
    /// User + system CPU (`/proc/PID/stat` utime + stime) from the first create until every
    /// claim was Bound, and from then until every volume was gone.
    pub cpu_bind_s: Option<f64>,
    pub cpu_delete_s: Option<f64>,
    /// Over its whole life (start-up included).
    pub cpu_total_s: Option<f64>,
}

/// One run of one scenario.
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioReport {
    pub scenario: Scenario,
    /// 1-based.
    pub run: usize,
    pub pvcs: usize,
    /// the benchmark's own creates/deletes in flight.
    pub parallelism: usize,
    /// The machine's 1-minute load average as the run started.
    pub load_average_1m: Option<f64>,
    /// API server, objects, processes started and watching (not timed below).
    pub setup_s: f64,
    /// From the first create until the last create was answered.
    pub pvcs_created_s: f64,
    /// Per claim: just before its create call → the watch sees it Bound.
    pub bound: Summary,
    /// From the first create until the first / last claim was Bound.
    pub first_bound_s: Option<f64>,
    pub all_bound_s: Option<f64>,
    /// PVs that existed when every claim was Bound (one per claim).
    pub volumes_at_bound: usize,
    /// API writes from the first create until every claim was Bound, plus the settle time.
    pub writes_bind: PhaseWrites,
    pub provisioner: ProcessReport,
    pub driver: ProcessReport,
    /// CPU of the benchmark's own process in the bind phase: the API server, the PV
    /// controller, ec2-sim and the run's client and watches.
    pub in_process_cpu_bind_s: Option<f64>,
    /// From the first delete until the last delete was answered.
    pub deletes_sent_s: f64,
    /// Per claim: just before its delete call → the watch sees its PV gone.
    pub delete: Summary,
    /// From the first delete until the last PV / the last claim was gone.
    pub all_volumes_gone_s: Option<f64>,
    pub all_claims_gone_s: Option<f64>,
    /// API writes from the first delete until every PV and claim was gone, plus the settle
    /// time.
    pub writes_delete: PhaseWrites,
    /// Volumes the driver lists (ListVolumes) when all were Bound / at the end (hostpath; the
    /// EBS driver has no ListVolumes: see `ec2_calls_*`).
    pub driver_volumes_at_bound: Option<usize>,
    pub driver_volumes_at_end: Option<usize>,
    /// EC2 calls ec2-sim answered in each phase, by action (ebs).
    pub ec2_calls_bind: BTreeMap<String, u64>,
    pub ec2_calls_delete: BTreeMap<String, u64>,
    /// Per claim Bound latency in seconds, in the order the creates were answered.
    pub latencies_s: Vec<f64>,
}

/// Everything a run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// How often each scenario ran.
    pub runs: usize,
    /// How long each phase's writes were counted past its end ([`super::LoadConfig::settle`]).
    pub settle_s: f64,
    /// Every scenario run, in the order they ran.
    pub scenarios: Vec<ScenarioReport>,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::harness::writes::Writes;

    fn writes(pairs: &[(&str, u64)]) -> Writes {
        Writes {
            total: pairs.iter().map(|p| p.1).sum(),
            failed: 0,
            by_request: pairs.iter().map(|(k, n)| ((*k).to_owned(), *n)).collect(),
        }
    }

    fn run(scenario: Scenario, run: usize, all_bound: f64, rss_mib: u64) -> ScenarioReport {
        let mib = rss_mib * 1024 * 1024;
        ScenarioReport {
            scenario,
            run,
            pvcs: 10,
            parallelism: 32,
            load_average_1m: Some(0.5),
            setup_s: 0.2,
            pvcs_created_s: 0.1,
            bound: crate::harness::stats::summarize(&[std::time::Duration::from_millis(300)]),
            first_bound_s: Some(0.1),
            all_bound_s: Some(all_bound),
            volumes_at_bound: 10,
            writes_bind: PhaseWrites {
                provisioner: writes(&[("create persistentvolumes", 10), ("create events", 20)]),
                pv_controller: writes(&[("patch persistentvolumeclaims/status", 10)]),
                ..PhaseWrites::default()
            },
            provisioner: ProcessReport {
                bin: "/r/csi-provisioner".into(),
                args: vec!["--kubeconfig=/tmp/x".into(), "--worker-threads=100".into()],
                at_bound: Some(MemorySample {
                    rss_bytes: mib,
                    hwm_bytes: mib,
                }),
                at_end: Some(MemorySample {
                    rss_bytes: mib,
                    hwm_bytes: mib,
                }),
                cpu_bind_s: Some(0.5),
                ..ProcessReport::default()
            },
            driver: ProcessReport::default(),
            in_process_cpu_bind_s: None,
            deletes_sent_s: 0.1,
            delete: crate::harness::stats::summarize(&[]),
            all_volumes_gone_s: None,
            all_claims_gone_s: None,
            writes_delete: PhaseWrites::default(),
            driver_volumes_at_bound: Some(10),
            driver_volumes_at_end: Some(0),
            ec2_calls_bind: BTreeMap::new(),
            ec2_calls_delete: BTreeMap::new(),
            latencies_s: vec![0.3],
        }
    }

    #[test]
    fn table_shows_median_and_range_per_scenario() {
        let report = Report {
            runs: 3,
            settle_s: 3.0,
            scenarios: vec![
                run(Scenario::Hostpath, 1, 2.0, 30),
                run(Scenario::Hostpath, 2, 3.0, 30),
                run(Scenario::Hostpath, 3, 2.5, 32),
            ],
        };
        let t = report.table();
        let row = |label: &str| {
            t.lines()
                .find(|l| l.starts_with(label))
                .unwrap_or_else(|| panic!("no {label} row in\n{t}"))
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        };
        assert_eq!(row("all Bound"), "all Bound 2.50 (2.00-3.00) s");
        assert_eq!(
            row("writes / PVC: provisioner"),
            "writes / PVC: provisioner 3.00"
        );
        assert_eq!(row("  create PV"), "create PV 1.00");
        assert_eq!(
            row("provisioner VmRSS at all Bound"),
            "provisioner VmRSS at all Bound 30.0 (30.0-32.0) MiB"
        );
        assert_eq!(row("all PVs gone"), "all PVs gone n/a");
        assert!(
            t.contains("hostpath: 10 PVCs; provisioner: /r/csi-provisioner --worker-threads=100\n"),
            "{t}"
        );
        assert!(
            t.contains("hostpath writes until all Bound (first run), by request:"),
            "{t}"
        );
        assert!(t.contains("median (min-max) of the runs"), "{t}");
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["scenarios"][2]["provisioner"]["cpu_bind_s"], 0.5);
        assert_eq!(
            json["scenarios"][0]["writes_bind"]["provisioner"]["by_request"]["create events"],
            20
        );
    }
}
