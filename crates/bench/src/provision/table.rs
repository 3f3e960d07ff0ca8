//! The report as a table. The rows as numbers: each row takes one run's report to one value, so that several
//! runs print as "median (min-max)"  and one run as its value.

use crate::harness::table::{Row, Unit, command_line, first_runs};

use std::fmt::Write as _;

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
    Row::new("PVCs", Unit::Count, |s, _| Some(s.pvcs as f64)),
    Row::new("load average at start", Unit::Ratio, |s, _| {
        s.load_average_1m
    }),
    Row::new("setup (not timed)", Unit::Seconds, |s, _| Some(s.setup_s)),
    Row::new("PVCs created", Unit::Seconds, |s, _| Some(s.pvcs_created_s)),
    Row::new("first Bound", Unit::Seconds, |s, _| s.first_bound_s),
    Row::new("all Bound", Unit::Seconds, |s, _| s.all_bound_s),
    Row::new("Bound p50 (per PVC)", Unit::Seconds, |s, _| {
        Some(s.bound.p50_s)
    }),
    Row::new("Bound p99", Unit::Seconds, |s, _| Some(s.bound.p99_s)),
    Row::new("Bound max", Unit::Seconds, |s, _| Some(s.bound.max_s)),
    Row::new("PVCs Bound", Unit::Count, |s, _| Some(s.bound.count as f64)),
    Row::new("writes / PVC: provisioner", Unit::Ratio, |s, _| {
        per_pvc(s, s.writes_bind.provisioner.total)
    }),
    Row::new("  create PV", Unit::Ratio, |s, _| {
        per_pvc(
            s,
            s.writes_bind
                .provisioner
                .of_requests(&["create persistentvolumes"]),
        )
    }),
    Row::new("  Events", Unit::Ratio, |s, _| {
        per_pvc(s, s.writes_bind.provisioner.to_resource("events"))
    }),
    Row::new("writes / PVC: pv-controller", Unit::Ratio, |s, _| {
        per_pvc(s, s.writes_bind.pv_controller.total)
    }),
    Row::new("  PVC (spec + status)", Unit::Ratio, |s, _| {
        per_pvc(
            s,
            s.writes_bind
                .pv_controller
                .to_resource("persistentvolumeclaims"),
        )
    }),
    Row::new("  PV (spec + status)", Unit::Ratio, |s, _| {
        per_pvc(
            s,
            s.writes_bind.pv_controller.to_resource("persistentvolumes"),
        )
    }),
    Row::new("  Events", Unit::Ratio, |s, _| {
        per_pvc(s, s.writes_bind.pv_controller.to_resource("events"))
    }),
    Row::new("failed writes (bind, both)", Unit::Count, |s, _| {
        Some((s.writes_bind.provisioner.failed + s.writes_bind.pv_controller.failed) as f64)
    }),
    Row::new("other writers' writes", Unit::Count, |s, _| {
        Some((s.writes_bind.other.total + s.writes_delete.other.total) as f64)
    }),
    Row::new("provisioner VmRSS at all Bound", Unit::Bytes, |s, _| {
        rss(s.provisioner.at_bound)
    }),
    Row::new("provisioner VmRSS at end", Unit::Bytes, |s, _| {
        rss(s.provisioner.at_end)
    }),
    Row::new("provisioner VmHWM at end", Unit::Bytes, |s, _| {
        hwm(s.provisioner.at_end)
    }),
    Row::new("provisioner CPU until all Bound", Unit::Seconds, |s, _| {
        s.provisioner.cpu_bind_s
    }),
    Row::new("driver VmRSS at all Bound", Unit::Bytes, |s, _| {
        rss(s.driver.at_bound)
    }),
    Row::new("driver VmHWM at end", Unit::Bytes, |s, _| {
        hwm(s.driver.at_end)
    }),
    Row::new("driver CPU until all Bound", Unit::Seconds, |s, _| {
        s.driver.cpu_bind_s
    }),
    Row::new("in-process CPU until all Bound", Unit::Seconds, |s, _| {
        s.in_process_cpu_bind_s
    }),
    Row::new("driver volumes at all Bound", Unit::Count, |s, _| {
        s.driver_volumes_at_bound.map(|n| n as f64)
    }),
    Row::new("EC2 CreateVolume calls", Unit::Count, |s, _| {
        ec2(&s.ec2_calls_bind, "CreateVolume")
    }),
    Row::new("deletes sent", Unit::Seconds, |s, _| Some(s.deletes_sent_s)),
    Row::new("all PVs gone", Unit::Seconds, |s, _| s.all_volumes_gone_s),
    Row::new("PV gone p50 (per PVC)", Unit::Seconds, |s, _| {
        Some(s.delete.p50_s)
    }),
    Row::new("PV gone p99", Unit::Seconds, |s, _| Some(s.delete.p99_s)),
    Row::new("delete writes / PVC: provisioner", Unit::Ratio, |s, _| {
        per_pvc(s, s.writes_delete.provisioner.total)
    }),
    Row::new("delete writes / PVC: pv-ctrl", Unit::Ratio, |s, _| {
        per_pvc(s, s.writes_delete.pv_controller.total)
    }),
    Row::new("provisioner CPU for the deletes", Unit::Seconds, |s, _| {
        s.provisioner.cpu_delete_s
    }),
    Row::new("driver volumes at end", Unit::Count, |s, _| {
        s.driver_volumes_at_end.map(|n| n as f64)
    }),
    Row::new("EC2 DeleteVolume calls", Unit::Count, |s, _| {
        ec2(&s.ec2_calls_delete, "DeleteVolume")
    }),
];

/// The arguments that differ between runs (temp paths): the JSON has them, the table leaves
/// them out.
const VARYING: &[&str] = &[
    "--kubeconfig=",
    "--csi-address=",
    "--endpoint=",
    "--ec2-endpoint=",
    "--state-dir=",
];

impl Report {
    /// The human-readable table: a column per scenario, "median (min-max)" over the runs;
    /// then, per scenario, the writes of its first run by request.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "csi-bench provision: {} run(s) per scenario",
            self.runs
        );
        for s in first_runs(&self.scenarios, |s| s.scenario) {
            let c = s.scenario;
            let _ = writeln!(
                out,
                "{c}: {} PVCs; provisioner: {}",
                s.pvcs,
                command_line(&s.provisioner.bin, &s.provisioner.args, VARYING)
            );
            let _ = writeln!(
                out,
                "{c}: driver: {}",
                command_line(&s.driver.bin, &s.driver.args, VARYING)
            );
        }
        let _ = writeln!(out);
        out.push_str(&crate::harness::table::grid(
            ROWS,
            &self.scenarios,
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
        for s in first_runs(&self.scenarios, |s| s.scenario) {
            let c = s.scenario;
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
