//! The report as a table. The rows as numbers: each row takes one run's report to one value, so that several
//! runs print as "median (min-max)"  and one run as its value.

use crate::harness::table::{Row, Unit};

use std::fmt::Write as _;

use super::Scenario;
use super::report::{MemorySample, Report, ScenarioReport};

fn per_pvc(s: &ScenarioReport, n: u64) -> Option<f64> {
    (s.pvcs > 0).then(|| n as f64 / s.pvcs as f64)
}

fn rss(m: Option<MemorySample>) -> Option<f64> {
    m.map(|m| m.rss_bytes as f64)
}

fn hwm(m: Option<MemorySample>) -> Option<f64> {
    m.map(|m| m.hwm_bytes as f64)
}

fn ec2(calls: &std::collections::BTreeMap<String, u64>, action: &str) -> Option<f64> {
    calls.get(action).map(|n| *n as f64)
}

/// The rows of the table, in order.
pub(crate) const ROWS: &[Row<ScenarioReport>] = &[
    Row {
        label: "PVCs",
        unit: Unit::Count,
        value: |s, _| Some(s.pvcs as f64),
    },
    Row {
        label: "load average at start",
        unit: Unit::Ratio,
        value: |s, _| s.load_average_1m,
    },
    Row {
        label: "setup (not timed)",
        unit: Unit::Seconds,
        value: |s, _| Some(s.setup_s),
    },
    Row {
        label: "PVCs created",
        unit: Unit::Seconds,
        value: |s, _| Some(s.pvcs_created_s),
    },
    Row {
        label: "first Bound",
        unit: Unit::Seconds,
        value: |s, _| s.first_bound_s,
    },
    Row {
        label: "all Bound",
        unit: Unit::Seconds,
        value: |s, _| s.all_bound_s,
    },
    Row {
        label: "Bound p50 (per PVC)",
        unit: Unit::Seconds,
        value: |s, _| Some(s.bound.p50_s),
    },
    Row {
        label: "Bound p99",
        unit: Unit::Seconds,
        value: |s, _| Some(s.bound.p99_s),
    },
    Row {
        label: "Bound max",
        unit: Unit::Seconds,
        value: |s, _| Some(s.bound.max_s),
    },
    Row {
        label: "PVCs Bound",
        unit: Unit::Count,
        value: |s, _| Some(s.bound.count as f64),
    },
    Row {
        label: "writes / PVC: provisioner",
        unit: Unit::Ratio,
        value: |s, _| per_pvc(s, s.writes_bind.provisioner.total),
    },
    Row {
        label: "  create PV",
        unit: Unit::Ratio,
        value: |s, _| {
            per_pvc(
                s,
                s.writes_bind
                    .provisioner
                    .of_requests(&["create persistentvolumes"]),
            )
        },
    },
    Row {
        label: "  Events",
        unit: Unit::Ratio,
        value: |s, _| per_pvc(s, s.writes_bind.provisioner.to_resource("events")),
    },
    Row {
        label: "writes / PVC: pv-controller",
        unit: Unit::Ratio,
        value: |s, _| per_pvc(s, s.writes_bind.pv_controller.total),
    },
    Row {
        label: "  PVC (spec + status)",
        unit: Unit::Ratio,
        value: |s, _| {
            per_pvc(
                s,
                s.writes_bind
                    .pv_controller
                    .to_resource("persistentvolumeclaims"),
            )
        },
    },
    Row {
        label: "  PV (spec + status)",
        unit: Unit::Ratio,
        value: |s, _| {
            per_pvc(
                s,
                s.writes_bind.pv_controller.to_resource("persistentvolumes"),
            )
        },
    },
    Row {
        label: "  Events",
        unit: Unit::Ratio,
        value: |s, _| per_pvc(s, s.writes_bind.pv_controller.to_resource("events")),
    },
    Row {
        label: "failed writes (bind, both)",
        unit: Unit::Count,
        value: |s, _| {
            Some((s.writes_bind.provisioner.failed + s.writes_bind.pv_controller.failed) as f64)
        },
    },
    Row {
        label: "other writers' writes",
        unit: Unit::Count,
        value: |s, _| Some((s.writes_bind.other.total + s.writes_delete.other.total) as f64),
    },
    Row {
        label: "provisioner VmRSS at all Bound",
        unit: Unit::Bytes,
        value: |s, _| rss(s.provisioner.at_bound),
    },
    Row {
        label: "provisioner VmRSS at end",
        unit: Unit::Bytes,
        value: |s, _| rss(s.provisioner.at_end),
    },
    Row {
        label: "provisioner VmHWM at end",
        unit: Unit::Bytes,
        value: |s, _| hwm(s.provisioner.at_end),
    },
    Row {
        label: "provisioner CPU until all Bound",
        unit: Unit::Seconds,
        value: |s, _| s.provisioner.cpu_bind_s,
    },
    Row {
        label: "driver VmRSS at all Bound",
        unit: Unit::Bytes,
        value: |s, _| rss(s.driver.at_bound),
    },
    Row {
        label: "driver VmHWM at end",
        unit: Unit::Bytes,
        value: |s, _| hwm(s.driver.at_end),
    },
    Row {
        label: "driver CPU until all Bound",
        unit: Unit::Seconds,
        value: |s, _| s.driver.cpu_bind_s,
    },
    Row {
        label: "in-process CPU until all Bound",
        unit: Unit::Seconds,
        value: |s, _| s.in_process_cpu_bind_s,
    },
    Row {
        label: "driver volumes at all Bound",
        unit: Unit::Count,
        value: |s, _| s.driver_volumes_at_bound.map(|n| n as f64),
    },
    Row {
        label: "EC2 CreateVolume calls",
        unit: Unit::Count,
        value: |s, _| ec2(&s.ec2_calls_bind, "CreateVolume"),
    },
    Row {
        label: "deletes sent",
        unit: Unit::Seconds,
        value: |s, _| Some(s.deletes_sent_s),
    },
    Row {
        label: "all PVs gone",
        unit: Unit::Seconds,
        value: |s, _| s.all_volumes_gone_s,
    },
    Row {
        label: "PV gone p50 (per PVC)",
        unit: Unit::Seconds,
        value: |s, _| Some(s.delete.p50_s),
    },
    Row {
        label: "PV gone p99",
        unit: Unit::Seconds,
        value: |s, _| Some(s.delete.p99_s),
    },
    Row {
        label: "delete writes / PVC: provisioner",
        unit: Unit::Ratio,
        value: |s, _| per_pvc(s, s.writes_delete.provisioner.total),
    },
    Row {
        label: "delete writes / PVC: pv-ctrl",
        unit: Unit::Ratio,
        value: |s, _| per_pvc(s, s.writes_delete.pv_controller.total),
    },
    Row {
        label: "provisioner CPU for the deletes",
        unit: Unit::Seconds,
        value: |s, _| s.provisioner.cpu_delete_s,
    },
    Row {
        label: "driver volumes at end",
        unit: Unit::Count,
        value: |s, _| s.driver_volumes_at_end.map(|n| n as f64),
    },
    Row {
        label: "EC2 DeleteVolume calls",
        unit: Unit::Count,
        value: |s, _| ec2(&s.ec2_calls_delete, "DeleteVolume"),
    },
];

/// The arguments that are the same in every run (not the temp paths).
fn command(bin: &str, args: &[String]) -> String {
    let varying = [
        "--kubeconfig=",
        "--csi-address=",
        "--endpoint=",
        "--ec2-endpoint=",
        "--state-dir=",
    ];
    let mut parts = vec![bin];
    parts.extend(
        args.iter()
            .map(String::as_str)
            .filter(|a| !varying.iter().any(|v| a.starts_with(v))),
    );
    parts.join(" ")
}

impl Report {
    /// The scenarios that ran, each once, in the order they first ran.
    fn columns(&self) -> Vec<Scenario> {
        crate::harness::table::columns(&self.scenarios, |s| s.scenario)
    }

    /// The human-readable table: a column per scenario, "median (min-max)" over the runs;
    /// then, per scenario, the writes of its first run by request.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let columns = self.columns();
        let _ = writeln!(
            out,
            "csi-bench provision: {} run(s) per scenario",
            self.runs
        );
        for c in &columns {
            if let Some(s) = self.scenarios.iter().find(|s| s.scenario == *c) {
                let _ = writeln!(
                    out,
                    "{c}: {} PVCs; provisioner: {}",
                    s.pvcs,
                    command(&s.provisioner.bin, &s.provisioner.args)
                );
                let _ = writeln!(
                    out,
                    "{c}: driver: {}",
                    command(&s.driver.bin, &s.driver.args)
                );
            }
        }
        let _ = writeln!(out);
        let _ = write!(out, "{:<34}", "");
        for c in &columns {
            let _ = write!(out, " {:>24}", c.name());
        }
        let _ = writeln!(out);
        out.push_str(&crate::harness::table::rows(
            ROWS,
            &self.scenarios,
            &columns,
            |s| s.scenario,
            0,
            (34, 24),
        ));
        let _ = writeln!(
            out,
            "(times from the first create / the first delete; writes per PVC, counted until {:.1} s after each phase{})",
            self.settle_s,
            if self.runs > 1 {
                "; median (min-max) of the runs"
            } else {
                ""
            }
        );
        for c in &columns {
            let Some(s) = self.scenarios.iter().find(|s| s.scenario == *c) else {
                continue;
            };
            let first = if self.runs > 1 { " (first run)" } else { "" };
            for (phase, w) in [
                ("until all Bound", &s.writes_bind),
                ("delete", &s.writes_delete),
            ] {
                let _ = writeln!(out);
                let _ = writeln!(out, "{c} writes {phase}{first}, by request:");
                for (who, writes) in [
                    ("provisioner", &w.provisioner),
                    ("pv-ctrl", &w.pv_controller),
                    ("other", &w.other),
                ] {
                    for (key, count) in &writes.by_request {
                        let _ = writeln!(out, "  {who:<12} {key:<44} {count:>8}");
                    }
                }
                if !w.other_agents.is_empty() {
                    let agents: Vec<&str> = w.other_agents.iter().map(String::as_str).collect();
                    let _ = writeln!(out, "  other user agents: {}", agents.join(", "));
                }
            }
            for (phase, calls) in [
                ("until all Bound", &s.ec2_calls_bind),
                ("delete", &s.ec2_calls_delete),
            ] {
                if calls.is_empty() {
                    continue;
                }
                let list: Vec<String> = calls.iter().map(|(k, n)| format!("{k} {n}")).collect();
                let _ = writeln!(out, "{c} EC2 calls {phase}{first}: {}", list.join(", "));
            }
        }
        out
    }
}
