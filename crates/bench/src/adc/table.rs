//! The report as a table. The rows as numbers: each row takes a scenario's report to one value, so that several
//! runs of a scenario print as "median (min–max)" and one run as its value.

use crate::harness::cli::Named as _;
use std::fmt::Write as _;

use super::report::{Report, ScenarioReport};
use crate::harness::table::{Row, Unit, command_line, first_runs};

fn per(n: u64, pods: usize) -> Option<f64> {
    (pods > 0).then(|| n as f64 / pods as f64)
}

/// The rows of the table, in order.
pub(crate) const ROWS: &[Row<ScenarioReport>] = &[
    Row::new("setup", Unit::Seconds, |s, _| Some(s.setup_seconds)),
    Row::new("processes ready", Unit::Seconds, |s, _| {
        Some(s.startup_seconds)
    }),
    Row::new("pods created", Unit::Seconds, |s, _| {
        Some(s.pods_created_seconds)
    }),
    Row::new("first in volumesAttached", Unit::Seconds, |s, _| {
        s.first_listed_seconds
    }),
    Row::new("all in volumesAttached", Unit::Seconds, |s, _| {
        s.all_listed_seconds
    }),
    Row::new("listed at end", Unit::Count, |s, _| {
        Some(s.volumes_listed as f64)
    }),
    Row::new("  other entries", Unit::Count, |s, _| {
        Some(s.unexpected_listed as f64)
    }),
    Row::new("VolumeAttachments at end", Unit::Count, |s, _| {
        Some(s.volume_attachments as f64)
    }),
    Row::new("  attached", Unit::Count, |s, _| {
        Some(s.volume_attachments_attached as f64)
    }),
    Row::new("ADC writes / volume", Unit::Ratio, |s, n| {
        per(s.adc.writes.total, n)
    }),
    Row::new("  VolumeAttachment", Unit::Ratio, |s, n| {
        per(s.adc.writes.to_resource("volumeattachments"), n)
    }),
    Row::new("  Node (status)", Unit::Ratio, |s, n| {
        per(s.adc.writes.to_resource("nodes"), n)
    }),
    Row::new("  Event", Unit::Ratio, |s, n| {
        per(s.adc.writes.to_resource("events"), n)
    }),
    Row::new("  failed", Unit::Count, |s, _| {
        Some(s.adc.writes.failed as f64)
    }),
    Row::new("ADC peak RSS", Unit::Bytes, |s, _| {
        s.adc.peak_rss_bytes.map(|b| b as f64)
    }),
    Row::new("ADC CPU", Unit::Seconds, |s, _| s.adc.cpu_seconds),
    Row::new("attacher writes / volume", Unit::Ratio, |s, n| {
        s.attacher.as_ref().and_then(|a| per(a.writes.total, n))
    }),
    Row::new("attacher peak RSS", Unit::Bytes, |s, _| {
        s.attacher
            .as_ref()
            .and_then(|a| a.peak_rss_bytes)
            .map(|b| b as f64)
    }),
    Row::new("attacher CPU", Unit::Seconds, |s, _| {
        s.attacher.as_ref().and_then(|a| a.cpu_seconds)
    }),
];

/// The arguments that differ between scenarios (temp paths, ports, the scenario's
/// --skip-attach): the JSON has them, the table leaves them out.
const VARYING: &[&str] = &[
    "--kubeconfig=",
    "--csi-address=",
    "--http-endpoint=",
    "--skip-attach=",
];

impl Report {
    /// The human-readable table: a column per scenario, "median (min-max)" over the runs.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "csi-bench adc: {} pods (one CSI volume each, driver {}) on {} nodes, {} run(s) per scenario",
            self.pods, self.driver, self.nodes, self.runs
        );
        if let Some(first) = self.scenarios.first() {
            let _ = writeln!(
                out,
                "ADC:      {}",
                command_line(&first.adc.bin, &first.adc.args, VARYING)
            );
        }
        if let Some(a) = self.scenarios.iter().find_map(|s| s.attacher.as_ref()) {
            let _ = writeln!(out, "attacher: {}", command_line(&a.bin, &a.args, VARYING));
        }
        let _ = writeln!(out);
        out.push_str(&crate::harness::table::grid(
            ROWS,
            &self.scenarios,
            |s| s.scenario,
            self.pods,
            (26, 22),
        ));
        let _ = writeln!(
            out,
            "(times from the first pod create; writes per volume and CPU over each process's whole life, settle included{})",
            if self.runs > 1 {
                "; median (min-max) of the runs"
            } else {
                ""
            }
        );
        if let Some((median, min, max)) = crate::harness::table::spread(&self.through_adc_speedups)
        {
            let range = if self.through_adc_speedups.len() > 1 {
                format!(" ({min:.2}-{max:.2}x)")
            } else {
                String::new()
            };
            let _ = writeln!(
                out,
                "through-adc is {median:.2}x{range} as fast as attach-required to all in volumesAttached (target >= 3x)"
            );
        }
        for s in first_runs(&self.scenarios, |s| s.scenario) {
            let c = s.scenario;
            let _ = writeln!(out);
            let first = if self.runs > 1 { " (first run)" } else { "" };
            let _ = writeln!(out, "{} writes by request{first}:", c.name());
            let parties = [("ADC", Some(&s.adc)), ("attacher", s.attacher.as_ref())];
            for (who, c) in parties.iter().filter_map(|(w, c)| c.map(|c| (w, c))) {
                for (key, count) in &c.writes.by_request {
                    let _ = writeln!(out, "  {who:<9} {key:<40} {count:>8}");
                }
                let agents: Vec<&str> = c.user_agents.iter().map(String::as_str).collect();
                let _ = writeln!(
                    out,
                    "  {who:<9} user agents: {}",
                    if agents.is_empty() {
                        "(no writes)".to_owned()
                    } else {
                        agents.join(", ")
                    }
                );
            }
        }
        for s in self
            .scenarios
            .iter()
            .filter(|s| s.own_writes != s.own_writes_seen)
        {
            let _ = writeln!(
                out,
                "warning: {}: the benchmark counted {} own writes but the API server saw {}",
                s.scenario, s.own_writes, s.own_writes_seen
            );
        }
        out
    }
}
