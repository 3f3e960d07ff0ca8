//! What a scenario measured, as a table (one column per scenario) or JSON.

use crate::harness::cli::Named as _;
use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

use crate::harness::writes::Writes;

use super::{LoadConfig, Scenario};
use crate::harness::stats::{Summary, summarize};
use crate::harness::table::{Row, Unit};

/// One node agent's numbers.
#[derive(Debug, Clone, Serialize)]
pub struct AgentStats {
    pub node: String,
    /// VmRSS before the first pod (driver registered, PVs and PVCs bound, nothing mounted).
    pub rss_idle_bytes: u64,
    /// VmRSS once every pod was Ready.
    pub rss_bytes: u64,
    /// VmHWM (peak RSS) at the same moment.
    pub hwm_bytes: u64,
    /// RssAnon (heap, thread stacks) and RssFile (mapped binary) of `rss_bytes`.
    pub rss_anon_bytes: u64,
    pub rss_file_bytes: u64,
    /// Threads of the agent at that moment.
    pub threads: u64,
    /// User + system CPU time since the agent started, when every pod was Ready / after the
    /// teardown.
    pub cpu_s_at_ready: Option<f64>,
    pub cpu_s_at_end: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ScenarioReport {
    pub scenario: Scenario,
    pub nodes: usize,
    pub pods: usize,
    pub agent_args: Vec<String>,
    /// Background PVs, bound PVCs and pods on other nodes (`--background`).
    pub background: usize,
    /// Background objects created (part of `setup_s`), and deleted after the delete phase.
    pub background_created_s: f64,
    pub background_deleted_s: f64,
    /// Background objects created, volumes created, PVs and PVCs bound, pods watch synced
    /// (not timed below).
    pub setup_s: f64,
    /// From the first pod create until the last create was answered.
    pub pods_created_s: f64,
    /// Per pod: just before its create call → the watch sees Ready=True.
    pub ready: Summary,
    /// From the first create until the first / last pod was Ready (wall time).
    pub first_ready_s: Option<f64>,
    pub all_ready_s: Option<f64>,
    /// Per pod: just before its delete call → the watch sees it gone.
    pub delete: Summary,
    /// From the first delete until the last pod was gone.
    pub all_deleted_s: Option<f64>,
    /// From the first delete until nothing was mounted below the nodes' dirs.
    pub all_unmounted_s: Option<f64>,
    /// The biggest agent's VmRSS before the first pod (driver registered, nothing mounted).
    pub agent_rss_idle_max_bytes: u64,
    pub agent_rss_max_bytes: u64,
    pub agent_rss_mean_bytes: u64,
    pub agent_hwm_max_bytes: u64,
    pub agents: Vec<AgentStats>,
    /// VmRSS of the biggest driver node plugin when every pod was Ready.
    pub driver_rss_max_bytes: Option<u64>,
    /// Mounts below the temp dir when every pod was Ready (stage + publish).
    pub mounts_when_ready: usize,
    /// Mounts left after every process stopped (then unmounted; 0 after a clean run).
    pub mounts_left_at_end: usize,
    /// One pod at a time (`--sequential`).
    pub sequential: bool,
    pub attacher_workers: usize,
    /// Every agent's API writes from the first create until all pods were Ready, and from
    /// then until the end of the delete phase; by request.
    pub agent_writes_ready: Writes,
    pub agent_writes_delete: Writes,
    /// CPU spent from the first create until all pods were Ready: by the agents, by the
    /// drivers (node plugins and the EBS controller), by the benchmark's process (API server, ADC,
    /// attacher, ec2-sim, the watch).
    pub cpu_ready_phase: super::CpuSplit,
    /// Per pod ready latency in seconds, in creation order.
    pub latencies_s: Vec<f64>,
}

fn secs(d: Option<Duration>) -> Option<f64> {
    d.map(|d| d.as_secs_f64())
}

impl ScenarioReport {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        scenario: Scenario,
        config: &LoadConfig,
        setup: Duration,
        created: Duration,
        latencies: &[Duration],
        first_ready: Option<Duration>,
        all_ready: Option<Duration>,
        delete_latencies: &[Duration],
        all_deleted: Option<Duration>,
        all_unmounted: Option<Duration>,
        agents: Vec<AgentStats>,
        driver_rss_max_bytes: Option<u64>,
        mounts_when_ready: usize,
    ) -> Self {
        let rss: Vec<u64> = agents.iter().map(|a| a.rss_bytes).collect();
        Self {
            scenario,
            nodes: config.nodes,
            pods: config.pods,
            agent_args: config.agent_args.clone(),
            background: config.background,
            background_created_s: 0.0,
            background_deleted_s: 0.0,
            setup_s: setup.as_secs_f64(),
            pods_created_s: created.as_secs_f64(),
            ready: summarize(latencies),
            first_ready_s: secs(first_ready),
            all_ready_s: secs(all_ready),
            delete: summarize(delete_latencies),
            all_deleted_s: secs(all_deleted),
            all_unmounted_s: secs(all_unmounted),
            agent_rss_max_bytes: rss.iter().copied().max().unwrap_or(0),
            agent_rss_mean_bytes: if rss.is_empty() {
                0
            } else {
                rss.iter().sum::<u64>() / rss.len() as u64
            },
            agent_hwm_max_bytes: agents.iter().map(|a| a.hwm_bytes).max().unwrap_or(0),
            agents,
            driver_rss_max_bytes,
            mounts_when_ready,
            mounts_left_at_end: 0,
            agent_rss_idle_max_bytes: 0,
            sequential: config.sequential,
            attacher_workers: config.attacher_workers,
            agent_writes_ready: Writes::default(),
            agent_writes_delete: Writes::default(),
            cpu_ready_phase: super::CpuSplit::default(),
            latencies_s: latencies.iter().map(Duration::as_secs_f64).collect(),
        }
    }
}

impl ScenarioReport {
    pub(crate) fn with_extras(
        mut self,
        idle_rss: u64,
        ready: Writes,
        delete: Writes,
        cpu: super::CpuSplit,
    ) -> Self {
        self.cpu_ready_phase = cpu;
        self.agent_rss_idle_max_bytes = idle_rss;
        self.agent_writes_ready = ready;
        self.agent_writes_delete = delete;
        self
    }

    pub(crate) fn with_background(mut self, created: Duration, deleted: Duration) -> Self {
        self.background_created_s = created.as_secs_f64();
        self.background_deleted_s = deleted.as_secs_f64();
        self
    }
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0))
}

fn per_pod(r: &ScenarioReport, writes: u64) -> Option<f64> {
    Some(writes as f64 / r.pods.max(1) as f64)
}

fn most(r: &ScenarioReport, of: fn(&AgentStats) -> u64) -> Option<f64> {
    Some(r.agents.iter().map(of).max().unwrap_or(0) as f64)
}

fn count(n: usize) -> Option<f64> {
    Some(n as f64)
}

fn bytes(n: u64) -> Option<f64> {
    Some(n as f64)
}

/// The rows of the table, in order.
const ROWS: &[Row<ScenarioReport>] = &[
    Row::new("nodes", Unit::Count, |r, _| count(r.nodes)),
    Row::new("pods", Unit::Count, |r, _| count(r.pods)),
    Row::new("background pods elsewhere", Unit::Count, |r, _| {
        count(r.background)
    }),
    Row::new("setup (not timed)", Unit::Seconds, |r, _| Some(r.setup_s)),
    Row::new("  of which background", Unit::Seconds, |r, _| {
        Some(r.background_created_s)
    }),
    Row::new("pods created", Unit::Seconds, |r, _| Some(r.pods_created_s)),
    Row::new("ready p50", Unit::Seconds, |r, _| Some(r.ready.p50_s)),
    Row::new("ready p90", Unit::Seconds, |r, _| Some(r.ready.p90_s)),
    Row::new("ready p99", Unit::Seconds, |r, _| Some(r.ready.p99_s)),
    Row::new("ready max", Unit::Seconds, |r, _| Some(r.ready.max_s)),
    Row::new("first Ready", Unit::Seconds, |r, _| r.first_ready_s),
    Row::new("all Ready (wall)", Unit::Seconds, |r, _| r.all_ready_s),
    Row::new("pods Ready", Unit::Count, |r, _| count(r.ready.count)),
    Row::new("delete p50", Unit::Seconds, |r, _| Some(r.delete.p50_s)),
    Row::new("delete p99", Unit::Seconds, |r, _| Some(r.delete.p99_s)),
    Row::new("all deleted (wall)", Unit::Seconds, |r, _| r.all_deleted_s),
    Row::new("all unmounted (wall)", Unit::Seconds, |r, _| {
        r.all_unmounted_s
    }),
    Row::new("agent RSS idle (max)", Unit::Bytes, |r, _| {
        bytes(r.agent_rss_idle_max_bytes)
    }),
    Row::new("agent RSS max", Unit::Bytes, |r, _| {
        bytes(r.agent_rss_max_bytes)
    }),
    Row::new("agent RSS mean", Unit::Bytes, |r, _| {
        bytes(r.agent_rss_mean_bytes)
    }),
    Row::new("agent VmHWM max", Unit::Bytes, |r, _| {
        bytes(r.agent_hwm_max_bytes)
    }),
    Row::new("agent RssAnon max", Unit::Bytes, |r, _| {
        most(r, |a| a.rss_anon_bytes)
    }),
    Row::new("agent RssFile max", Unit::Bytes, |r, _| {
        most(r, |a| a.rss_file_bytes)
    }),
    Row::new("agent threads max", Unit::Count, |r, _| {
        most(r, |a| a.threads)
    }),
    Row::new("agent CPU (sum, whole run)", Unit::Seconds, |r, _| {
        Some(r.agents.iter().filter_map(|a| a.cpu_s_at_end).sum())
    }),
    Row::new("CPU until Ready: agents", Unit::Seconds, |r, _| {
        Some(r.cpu_ready_phase.agents_s)
    }),
    Row::new("CPU until Ready: drivers", Unit::Seconds, |r, _| {
        Some(r.cpu_ready_phase.drivers_s)
    }),
    Row::new("CPU until Ready: csi-bench", Unit::Seconds, |r, _| {
        Some(r.cpu_ready_phase.node_load_s)
    }),
    Row::new("driver RSS max", Unit::Bytes, |r, _| {
        r.driver_rss_max_bytes.map(|b| b as f64)
    }),
    Row::new("agent writes/pod (ready)", Unit::Ratio, |r, _| {
        per_pod(r, r.agent_writes_ready.total)
    }),
    Row::new("agent writes/pod (delete)", Unit::Ratio, |r, _| {
        per_pod(r, r.agent_writes_delete.total)
    }),
    Row::new("mounts when Ready", Unit::Count, |r, _| {
        count(r.mounts_when_ready)
    }),
    Row::new("mounts left at end", Unit::Count, |r, _| {
        count(r.mounts_left_at_end)
    }),
];

/// The reports side by side (a column per scenario), then each agent's memory, the agents'
/// writes by request, and the ratios the node-side benchmark targets (through-adc against
/// attach-required: at least 2x).
pub fn table(reports: &[ScenarioReport]) -> String {
    let mut out = crate::harness::table::grid(ROWS, reports, |r| r.scenario, 0, (28, 26));
    for r in reports {
        for a in &r.agents {
            let _ = writeln!(
                out,
                "{}: {} agent: VmRSS idle {}, VmRSS at all Ready {}, VmHWM {} \
                 (RssAnon {}, RssFile {}); {} background pods elsewhere",
                r.scenario.name(),
                a.node,
                mib(a.rss_idle_bytes),
                mib(a.rss_bytes),
                mib(a.hwm_bytes),
                mib(a.rss_anon_bytes),
                mib(a.rss_file_bytes),
                r.background
            );
        }
    }
    for r in reports {
        let list = |w: &Writes| {
            w.by_request
                .iter()
                .map(|(k, n)| format!("{k} {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let _ = writeln!(
            out,
            "{}: agent writes until all Ready: {}; during the delete phase: {}",
            r.scenario.name(),
            list(&r.agent_writes_ready),
            list(&r.agent_writes_delete)
        );
    }
    let find = |sc: Scenario| reports.iter().find(|r| r.scenario == sc);
    if let Some(base) = find(Scenario::HostpathAttachRequired) {
        for other in [Scenario::HostpathBypass, Scenario::HostpathThroughAdc] {
            if let Some(o) = find(other)
                && o.nodes == base.nodes
                && o.pods == base.pods
            {
                let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
                let _ = writeln!(
                    out,
                    "{} vs {}: p50 {:.2}x, p99 {:.2}x, all Ready {:.2}x as fast",
                    other.name(),
                    base.scenario.name(),
                    ratio(base.ready.p50_s, o.ready.p50_s),
                    ratio(base.ready.p99_s, o.ready.p99_s),
                    ratio(
                        base.all_ready_s.unwrap_or(0.0),
                        o.all_ready_s.unwrap_or(0.0)
                    ),
                );
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn report(scenario: Scenario, ready_ms: &[u64]) -> ScenarioReport {
        let config = LoadConfig {
            nodes: 1,
            pods: ready_ms.len(),
            ..LoadConfig::default()
        };
        let ms =
            |v: &[u64]| -> Vec<Duration> { v.iter().map(|m| Duration::from_millis(*m)).collect() };
        let agent = AgentStats {
            node: "node-0".into(),
            rss_idle_bytes: 8 << 20,
            rss_bytes: 10 << 20,
            hwm_bytes: 12 << 20,
            rss_anon_bytes: 6 << 20,
            rss_file_bytes: 4 << 20,
            threads: 5,
            cpu_s_at_ready: Some(0.5),
            cpu_s_at_end: Some(1.25),
        };
        let last = ready_ms.iter().max().copied().unwrap_or(0);
        ScenarioReport::new(
            scenario,
            &config,
            Duration::from_millis(300),
            Duration::from_millis(20),
            &ms(ready_ms),
            Some(Duration::from_millis(ready_ms[0])),
            Some(Duration::from_millis(last)),
            &ms(&[100, 100]),
            Some(Duration::from_millis(200)),
            Some(Duration::from_millis(250)),
            vec![agent],
            None,
            4,
        )
    }

    #[test]
    fn a_column_per_scenario_and_the_ratio_against_attach_required() {
        let reports = [
            report(Scenario::HostpathAttachRequired, &[2000, 4000]),
            report(Scenario::HostpathBypass, &[500, 1000]),
        ];
        let t = table(&reports);
        let row = |label: &str| {
            let line = t.lines().find(|l| l.starts_with(label)).unwrap();
            line[label.len()..]
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        };
        let header: Vec<&str> = t.lines().next().unwrap().split_whitespace().collect();
        assert_eq!(
            header,
            ["hostpath-attach-required", "hostpath-bypass"],
            "{t}"
        );
        assert_eq!(row("ready max"), "4.00 s 1.00 s", "{t}");
        assert_eq!(row("pods Ready"), "2 2", "{t}");
        assert_eq!(row("agent RssAnon max"), "6.0 MiB 6.0 MiB", "{t}");
        assert_eq!(row("driver RSS max"), "n/a n/a", "{t}");
        assert_eq!(row("mounts when Ready"), "4 4", "{t}");
        assert!(
            t.contains("hostpath-bypass vs hostpath-attach-required: p50 4.00x, p99 4.00x, all Ready 4.00x as fast"),
            "{t}"
        );
        assert!(
            t.contains(
                "hostpath-bypass: node-0 agent: VmRSS idle 8.0 MiB, VmRSS at all Ready 10.0 MiB"
            ),
            "{t}"
        );
    }
}
