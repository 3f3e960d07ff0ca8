//! What a bench run found: one object (`--output json`) or one table per metric (text).

use std::collections::BTreeSet;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::measure::{Latency, Writes};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Report {
    pub date_utc: String,
    /// Cores this process may use.
    pub cpus: usize,
    pub pods: usize,
    pub nodes: usize,
    pub timing: String,
    pub scenarios: Vec<ScenarioReport>,
    /// Idle memory with 1 node and with `nodes` nodes (`--scenario all` only).
    pub per_node: Option<PerNode>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct ScenarioReport {
    pub scenario: String,
    pub class: String,
    /// False when the scenario could not run as designed (`note` says why) or failed.
    pub measured: bool,
    pub note: Option<String>,
    /// From the start of the cluster until every node was Ready with its drivers.
    pub cluster_ready_s: f64,
    pub pods: Option<PodNumbers>,
    pub provisioning: Option<ProvisionNumbers>,
    /// From the first create until all Ready (all Bound for provisioning), / N.
    pub writes: Writes,
    pub memory: Memory,
    /// From the first delete until every pod, claim, PV and VolumeAttachment was gone.
    pub cleanup_s: f64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct PodNumbers {
    /// Pod create call → a pods watch sees condition Ready=True, per pod.
    pub ready: Latency,
    /// First create call → last pod Ready.
    pub all_ready_s: f64,
    /// How many pods each node got from the scheduler.
    pub pods_per_node: std::collections::BTreeMap<String, usize>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct ProvisionNumbers {
    /// Claim create call → a claims watch sees phase Bound, per claim.
    pub bound: Latency,
    /// First create call → last claim Bound.
    pub all_bound_s: f64,
    pub claims_per_s: f64,
}

/// The csi-cluster process (the whole stack in one process), in MiB.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Memory {
    /// VmRSS once the cluster was ready and had settled, before the first create.
    pub idle_rss_mib: f64,
    /// VmRSS when the last pod was Ready (last claim Bound).
    pub loaded_rss_mib: f64,
    /// VmHWM from just before this scenario's cluster started until it stopped.
    pub peak_mib: f64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct PerNode {
    pub one_node_idle_rss_mib: f64,
    pub nodes: usize,
    pub nodes_idle_rss_mib: f64,
    /// (nodes − 1-node) / (nodes − 1).
    pub per_node_mib: f64,
}

/// Components in the writes table's column order; any other one seen comes after them.
const COMPONENT_ORDER: [&str; 7] = [
    "adc",
    "attacher",
    "node-agent",
    "provisioner",
    "pv-controller",
    "scheduler",
    "statefulset",
];

fn secs(s: f64) -> String {
    if s < 10.0 {
        format!("{s:.3} s")
    } else {
        format!("{s:.1} s")
    }
}

impl Report {
    pub(crate) fn text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "csi-cluster bench, {}: {} pods per scenario on {} nodes (1 zone), EC2 timing {}, {} cores\n",
            self.date_utc, self.pods, self.nodes, self.timing, self.cpus
        );
        let measured: Vec<&ScenarioReport> = self.scenarios.iter().filter(|s| s.measured).collect();
        self.latency_table(&mut out, &measured);
        self.writes_table(&mut out, &measured);
        self.provisioning_table(&mut out, &measured);
        self.memory_table(&mut out, &measured);
        for s in self.scenarios.iter().filter(|s| !s.measured) {
            let _ = writeln!(
                out,
                "{}: not measured: {}",
                s.scenario,
                s.note.as_deref().unwrap_or("?")
            );
        }
        out
    }

    fn latency_table(&self, out: &mut String, rows: &[&ScenarioReport]) {
        let rows: Vec<_> = rows
            .iter()
            .filter_map(|s| Some((s, s.pods.as_ref()?)))
            .collect();
        if rows.is_empty() {
            return;
        }
        let _ = writeln!(
            out,
            "Pod-volume-ready latency (pod create → Ready), all pods created at once"
        );
        let _ = writeln!(
            out,
            "| scenario | class | pods | p50 | p99 | max | all Ready (wall) | pods per node | cleanup |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|");
        for (s, p) in rows {
            let spread: Vec<String> = p.pods_per_node.values().map(usize::to_string).collect();
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                s.scenario,
                s.class,
                p.ready.count,
                secs(p.ready.p50_s),
                secs(p.ready.p99_s),
                secs(p.ready.max_s),
                secs(p.all_ready_s),
                spread.join("/"),
                secs(s.cleanup_s)
            );
        }
        out.push('\n');
    }

    fn writes_table(&self, out: &mut String, rows: &[&ScenarioReport]) {
        if rows.is_empty() {
            return;
        }
        let seen: BTreeSet<&str> = rows
            .iter()
            .flat_map(|s| s.writes.per_pod_by_component.keys().map(String::as_str))
            .collect();
        let mut columns: Vec<&str> = COMPONENT_ORDER
            .into_iter()
            .filter(|c| seen.contains(c))
            .collect();
        columns.extend(seen.iter().filter(|c| !COMPONENT_ORDER.contains(c)));
        let _ = writeln!(
            out,
            "API writes per pod (per claim for provisioning), first create → all Ready (Bound); leases left out"
        );
        let _ = writeln!(
            out,
            "| scenario | writes / pod | {} | failed | VolumeAttachments created | lease writes |",
            columns.join(" | ")
        );
        let _ = writeln!(out, "|---|---|{}---|---|---|", "---|".repeat(columns.len()));
        for s in rows {
            let cells: Vec<String> = columns
                .iter()
                .map(|c| {
                    s.writes
                        .per_pod_by_component
                        .get(*c)
                        .map_or_else(|| "0".into(), |v| format!("{v:.2}"))
                })
                .collect();
            let _ = writeln!(
                out,
                "| {} | {:.2} | {} | {} | {} | {} |",
                s.scenario,
                s.writes.per_pod,
                cells.join(" | "),
                s.writes.failed,
                s.writes.volume_attachments_created,
                s.writes.lease_writes
            );
        }
        out.push('\n');
    }

    fn provisioning_table(&self, out: &mut String, rows: &[&ScenarioReport]) {
        let rows: Vec<_> = rows
            .iter()
            .filter_map(|s| Some((s, s.provisioning.as_ref()?)))
            .collect();
        if rows.is_empty() {
            return;
        }
        let _ = writeln!(
            out,
            "Provisioning (claims on an Immediate ebs.csi.aws.com class, created at once)"
        );
        let _ = writeln!(
            out,
            "| claims | all Bound (wall) | claims / s | p50 | p99 | max | writes / claim | cleanup |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|---|---|---|");
        for (s, p) in rows {
            let _ = writeln!(
                out,
                "| {} | {} | {:.1} | {} | {} | {} | {:.2} | {} |",
                p.bound.count,
                secs(p.all_bound_s),
                p.claims_per_s,
                secs(p.bound.p50_s),
                secs(p.bound.p99_s),
                secs(p.bound.max_s),
                s.writes.per_pod,
                secs(s.cleanup_s)
            );
        }
        out.push('\n');
    }

    fn memory_table(&self, out: &mut String, rows: &[&ScenarioReport]) {
        if rows.is_empty() {
            return;
        }
        let _ = writeln!(
            out,
            "Memory of the csi-cluster process (the whole stack), MiB"
        );
        let _ = writeln!(
            out,
            "| scenario | cluster ready in | VmRSS idle | VmRSS at all Ready | VmHWM (scenario) |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|");
        for s in rows {
            let _ = writeln!(
                out,
                "| {} | {} | {:.1} | {:.1} | {:.1} |",
                s.scenario,
                secs(s.cluster_ready_s),
                s.memory.idle_rss_mib,
                s.memory.loaded_rss_mib,
                s.memory.peak_mib
            );
        }
        if let Some(p) = &self.per_node {
            let _ = writeln!(
                out,
                "\nIdle VmRSS: 1 node {:.1} MiB, {} nodes {:.1} MiB: {:.1} MiB per node",
                p.one_node_idle_rss_mib, p.nodes, p.nodes_idle_rss_mib, p.per_node_mib
            );
        }
        out.push('\n');
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn text_has_a_table_per_metric_and_names_what_was_not_measured() {
        let mut w = Writes {
            per_pod: 5.5,
            total: 11,
            ..Writes::default()
        };
        w.per_pod_by_component.insert("node-agent".into(), 2.0);
        w.per_pod_by_component.insert("adc".into(), 1.5);
        w.per_pod_by_component.insert("registrar".into(), 2.0);
        let report = Report {
            date_utc: "2026-11-27T00:00:00Z".into(),
            cpus: 2,
            pods: 2,
            nodes: 3,
            timing: "fast".into(),
            scenarios: vec![
                ScenarioReport {
                    scenario: "ebs".into(),
                    class: "ebs-sc".into(),
                    measured: true,
                    pods: Some(PodNumbers::default()),
                    writes: w,
                    ..ScenarioReport::default()
                },
                ScenarioReport {
                    scenario: "hostpath-attach".into(),
                    note: Some("the flag does nothing yet".into()),
                    ..ScenarioReport::default()
                },
            ],
            per_node: None,
        };
        let text = report.text();
        assert!(
            text.contains("| scenario | writes / pod | adc | node-agent | registrar | failed"),
            "{text}"
        );
        assert!(
            text.contains("| ebs | 5.50 | 1.50 | 2.00 | 2.00 | 0 | 0 | 0 |"),
            "{text}"
        );
        assert!(text.contains("Pod-volume-ready latency"));
        assert!(
            !text.contains("Provisioning ("),
            "no provisioning row: no table"
        );
        assert!(text.contains("hostpath-attach: not measured: the flag does nothing yet"));
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["scenarios"][0]["writes"]["per_pod"], 5.5);
    }
}
