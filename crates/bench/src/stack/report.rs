//! What a bench run found: one object (`--output json`) or one table per metric (text).

use std::collections::BTreeSet;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::measure::{Latency, Reads, Writes};
use super::timeline::{ServerTime, Stage};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Report {
    pub date_utc: String,
    /// Cores this process may use.
    pub cpus: usize,
    pub pods: usize,
    pub nodes: usize,
    pub timing: String,
    /// How many times every scenario ran (`--runs`).
    pub runs: usize,
    /// One pod (claim) at a time instead of all at once (`--sequential`).
    pub sequential: bool,
    /// Every run's scenarios, run 1 first.
    pub scenarios: Vec<ScenarioReport>,
    /// Idle memory with 1 node and with `nodes` nodes, once per run (`--scenario all` only).
    pub per_node: Vec<PerNode>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct ScenarioReport {
    pub scenario: String,
    /// 1 for the first run.
    pub run: usize,
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
    /// The same window's gets, lists and watches (absent in reports from before they were
    /// counted).
    #[serde(default)]
    pub reads: Reads,
    /// apiserver-lite's time on those writes.
    pub server: ServerTime,
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
    /// Where the time went: each step's write, timed from the pod's create.
    pub stages: Vec<Stage>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct ProvisionNumbers {
    /// Claim create call → a claims watch sees phase Bound, per claim.
    pub bound: Latency,
    /// First create call → last claim Bound.
    pub all_bound_s: f64,
    pub claims_per_s: f64,
}

/// The benchmark's process (the whole stack in one process, as csi-cluster runs it), in MiB.
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
    if s < 0.01 {
        format!("{:.1} ms", s * 1000.0)
    } else if s < 1.0 {
        format!("{:.0} ms", s * 1000.0)
    } else if s < 10.0 {
        format!("{s:.2} s")
    } else {
        format!("{s:.1} s")
    }
}

fn two(v: f64) -> String {
    format!("{v:.2}")
}

fn one(v: f64) -> String {
    format!("{v:.1}")
}

fn whole(v: f64) -> String {
    format!("{v:.0}")
}

/// One run's value, or the median over runs with the range when the runs differ at the
/// shown precision: `1.23 s (1.10 s–1.40 s)`.
fn agg(values: &[f64], fmt: fn(f64) -> String) -> String {
    let Some((median, min, max)) = crate::harness::table::spread(values) else {
        return "n/a".into();
    };
    let (lo, hi) = (fmt(min), fmt(max));
    if lo == hi {
        fmt(median)
    } else {
        format!("{} ({lo}–{hi})", fmt(median))
    }
}

/// A scenario's measured runs.
struct Group<'a> {
    name: &'a str,
    runs: Vec<&'a ScenarioReport>,
}

impl Group<'_> {
    fn cell(&self, f: impl Fn(&ScenarioReport) -> Option<f64>, fmt: fn(f64) -> String) -> String {
        let v: Vec<f64> = self.runs.iter().filter_map(|s| f(s)).collect();
        agg(&v, fmt)
    }
}

impl Report {
    /// The measured scenarios, in the order they first ran.
    fn groups(&self) -> Vec<Group<'_>> {
        let mut groups: Vec<Group<'_>> = Vec::new();
        for s in self.scenarios.iter().filter(|s| s.measured) {
            match groups.iter_mut().find(|g| g.name == s.scenario) {
                Some(g) => g.runs.push(s),
                None => groups.push(Group {
                    name: &s.scenario,
                    runs: vec![s],
                }),
            }
        }
        groups
    }

    pub(crate) fn text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "csi-bench stack, {}: {} pods per scenario on {} nodes (1 zone), EC2 timing {}, {} cores, {}\n",
            self.date_utc,
            self.pods,
            self.nodes,
            self.timing,
            self.cpus,
            if self.runs == 1 {
                "1 run".to_string()
            } else {
                format!("{} runs: median (min–max)", self.runs)
            }
        );
        let groups = self.groups();
        let created = if self.sequential {
            "created one at a time, each once the one before was Ready"
        } else {
            "all created at once"
        };
        latency_table(&mut out, &groups, created);
        stages_table(&mut out, &groups);
        writes_table(&mut out, &groups);
        provisioning_table(&mut out, &groups);
        self.memory_table(&mut out, &groups);
        let mut said = BTreeSet::new();
        for s in self.scenarios.iter().filter(|s| !s.measured) {
            let note = s.note.as_deref().unwrap_or("?");
            if said.insert((s.scenario.as_str(), note)) {
                let _ = writeln!(out, "{} (run {}): not measured: {note}", s.scenario, s.run);
            }
        }
        out
    }

    fn memory_table(&self, out: &mut String, groups: &[Group<'_>]) {
        if groups.is_empty() {
            return;
        }
        let _ = writeln!(out, "Memory of the process running the whole stack, MiB");
        let _ = writeln!(
            out,
            "| scenario | cluster ready in | VmRSS idle | VmRSS at all Ready | VmHWM (scenario) |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|");
        for g in groups {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} |",
                g.name,
                g.cell(|s| Some(s.cluster_ready_s), secs),
                g.cell(|s| Some(s.memory.idle_rss_mib), one),
                g.cell(|s| Some(s.memory.loaded_rss_mib), one),
                g.cell(|s| Some(s.memory.peak_mib), one),
            );
        }
        if let Some(first) = self.per_node.first() {
            let v =
                |f: fn(&PerNode) -> f64| agg(&self.per_node.iter().map(f).collect::<Vec<_>>(), one);
            let _ = writeln!(
                out,
                "\nIdle VmRSS: 1 node {} MiB, {} nodes {} MiB: {} MiB per node",
                v(|p| p.one_node_idle_rss_mib),
                first.nodes,
                v(|p| p.nodes_idle_rss_mib),
                v(|p| p.per_node_mib)
            );
        }
        out.push('\n');
    }
}

fn latency_table(out: &mut String, groups: &[Group<'_>], created: &str) {
    let rows: Vec<&Group<'_>> = groups.iter().filter(|g| g.runs[0].pods.is_some()).collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "Pod-volume-ready latency (pod create → Ready), {created}"
    );
    let _ = writeln!(
        out,
        "| scenario | class | pods | p50 | p99 | max | all Ready (wall) | pods per node | cleanup |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|");
    for g in rows {
        let pods = |f: fn(&PodNumbers) -> f64| move |s: &ScenarioReport| s.pods.as_ref().map(f);
        let spread: Vec<String> = g.runs[0]
            .pods
            .as_ref()
            .map(|p| p.pods_per_node.values().map(usize::to_string).collect())
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            g.name,
            g.runs[0].class,
            g.cell(pods(|p| p.ready.count as f64), whole),
            g.cell(pods(|p| p.ready.p50_s), secs),
            g.cell(pods(|p| p.ready.p99_s), secs),
            g.cell(pods(|p| p.ready.max_s), secs),
            g.cell(pods(|p| p.all_ready_s), secs),
            spread.join("/"),
            g.cell(|s| Some(s.cleanup_s), secs),
        );
    }
    out.push('\n');
}

/// Each step's time since pod create, p50 and p99, and apiserver-lite's time on the writes.
fn stages_table(out: &mut String, groups: &[Group<'_>]) {
    let rows: Vec<&Group<'_>> = groups
        .iter()
        .filter(|g| {
            g.runs[0]
                .pods
                .as_ref()
                .is_some_and(|p| !p.stages.is_empty())
        })
        .collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "Where a pod's time goes: pod create → the write that did each step (audit record)"
    );
    let _ = writeln!(out, "| scenario | step | by | p50 | p99 |");
    let _ = writeln!(out, "|---|---|---|---|---|");
    for g in &rows {
        for (i, stage) in g.runs[0].pods.iter().flat_map(|p| &p.stages).enumerate() {
            let of = |f: fn(&Stage) -> f64| {
                move |s: &ScenarioReport| {
                    s.pods
                        .as_ref()
                        .and_then(|p| p.stages.iter().find(|x| x.step == stage.step))
                        .map(f)
                }
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} |",
                if i == 0 { g.name } else { "" },
                stage.step,
                stage.by,
                g.cell(of(|x| x.since_create.p50_s), secs),
                g.cell(of(|x| x.since_create.p99_s), secs),
            );
        }
    }
    let _ = writeln!(
        out,
        "\napiserver-lite's time on the stack's writes (received → answered)"
    );
    let _ = writeln!(out, "| scenario | writes | sum | p50 | p99 | max |");
    let _ = writeln!(out, "|---|---|---|---|---|---|");
    for g in &rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} |",
            g.name,
            g.cell(|s| Some(s.server.writes as f64), whole),
            g.cell(|s| Some(s.server.total_s), secs),
            g.cell(|s| Some(s.server.per_write.p50_s), secs),
            g.cell(|s| Some(s.server.per_write.p99_s), secs),
            g.cell(|s| Some(s.server.per_write.max_s), secs),
        );
    }
    out.push('\n');
}

fn writes_table(out: &mut String, groups: &[Group<'_>]) {
    if groups.is_empty() {
        return;
    }
    let seen: BTreeSet<&str> = groups
        .iter()
        .flat_map(|g| g.runs.iter())
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
    for g in groups {
        let cells: Vec<String> = columns
            .iter()
            .map(|c| {
                g.cell(
                    |s| {
                        Some(
                            s.writes
                                .per_pod_by_component
                                .get(*c)
                                .copied()
                                .unwrap_or(0.0),
                        )
                    },
                    two,
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} |",
            g.name,
            g.cell(|s| Some(s.writes.per_pod), two),
            cells.join(" | "),
            g.cell(|s| Some(s.writes.failed as f64), whole),
            g.cell(|s| Some(s.writes.volume_attachments_created as f64), whole),
            g.cell(|s| Some(s.writes.lease_writes as f64), whole),
        );
    }
    out.push('\n');
}

fn provisioning_table(out: &mut String, groups: &[Group<'_>]) {
    let rows: Vec<&Group<'_>> = groups
        .iter()
        .filter(|g| g.runs[0].provisioning.is_some())
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
    for g in rows {
        let prov = |f: fn(&ProvisionNumbers) -> f64| {
            move |s: &ScenarioReport| s.provisioning.as_ref().map(f)
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            g.cell(prov(|p| p.bound.count as f64), whole),
            g.cell(prov(|p| p.all_bound_s), secs),
            g.cell(prov(|p| p.claims_per_s), one),
            g.cell(prov(|p| p.bound.p50_s), secs),
            g.cell(prov(|p| p.bound.p99_s), secs),
            g.cell(prov(|p| p.bound.max_s), secs),
            g.cell(|s| Some(s.writes.per_pod), two),
            g.cell(|s| Some(s.cleanup_s), secs),
        );
    }
    out.push('\n');
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn ebs(run: usize, per_pod: f64, p50: f64) -> ScenarioReport {
        let mut w = Writes {
            per_pod,
            ..Writes::default()
        };
        w.per_pod_by_component.insert("node-agent".into(), 2.0);
        w.per_pod_by_component.insert("adc".into(), 1.5);
        w.per_pod_by_component.insert("registrar".into(), 2.0);
        ScenarioReport {
            scenario: "ebs".into(),
            run,
            class: "ebs-sc".into(),
            measured: true,
            pods: Some(PodNumbers {
                ready: Latency {
                    count: 3,
                    p50_s: p50,
                    p99_s: p50,
                    max_s: p50,
                },
                ..PodNumbers::default()
            }),
            writes: w,
            ..ScenarioReport::default()
        }
    }

    fn report(scenarios: Vec<ScenarioReport>, runs: usize) -> Report {
        Report {
            date_utc: "2026-11-27 00:00 UTC".into(),
            cpus: 2,
            pods: 3,
            nodes: 3,
            timing: "fast".into(),
            runs,
            sequential: false,
            scenarios,
            per_node: Vec::new(),
        }
    }

    #[test]
    fn text_has_a_table_per_metric_and_names_what_was_not_measured() {
        let not = ScenarioReport {
            scenario: "hostpath-attach".into(),
            run: 1,
            note: Some("the flag does nothing yet".into()),
            ..ScenarioReport::default()
        };
        let r = report(vec![ebs(1, 5.5, 1.0), not], 1);
        let text = r.text();
        assert!(
            text.contains("| scenario | writes / pod | adc | node-agent | registrar | failed"),
            "{text}"
        );
        assert!(
            text.contains("| ebs | 5.50 | 1.50 | 2.00 | 2.00 | 0 | 0 | 0 |"),
            "{text}"
        );
        assert!(text.contains("| ebs | ebs-sc | 3 | 1.00 s |"), "{text}");
        assert!(
            !text.contains("Provisioning ("),
            "no provisioning row: no table"
        );
        assert!(text.contains("hostpath-attach (run 1): not measured: the flag does nothing yet"));
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["scenarios"][0]["writes"]["per_pod"], 5.5);
    }

    #[test]
    fn runs_show_the_median_and_the_range() {
        let r = report(
            vec![ebs(1, 5.0, 1.0), ebs(2, 7.0, 3.0), ebs(3, 6.0, 1.2)],
            3,
        );
        let text = r.text();
        assert!(text.contains("3 runs: median (min–max)"), "{text}");
        assert!(
            text.contains("| ebs | ebs-sc | 3 | 1.20 s (1.00 s–3.00 s) |"),
            "one row per scenario, equal runs shown once: {text}"
        );
        assert!(text.contains("| ebs | 6.00 (5.00–7.00) | 1.50 |"), "{text}");
        assert_eq!(agg(&[1.0, 2.0], two), "1.50 (1.00–2.00)");
        assert_eq!(agg(&[0.0125, 0.5], secs), "256 ms (12 ms–500 ms)");
        assert_eq!(agg(&[], two), "n/a");
    }
}
