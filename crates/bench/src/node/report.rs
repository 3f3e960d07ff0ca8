//! What a scenario measured, as a table (one column per scenario) or JSON.

use crate::harness::cli::Named as _;
use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

use crate::harness::writes::Writes;

use super::{LoadConfig, Scenario};
use crate::harness::stats::{Summary, summarize};

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

fn s(v: f64) -> String {
    if v < 1.0 {
        format!("{:.0} ms", v * 1000.0)
    } else {
        format!("{v:.2} s")
    }
}

fn per_pod(writes: u64, pods: usize) -> String {
    format!("{:.2}", writes as f64 / pods.max(1) as f64)
}

fn opt_s(v: Option<f64>) -> String {
    v.map_or_else(|| "n/a".into(), s)
}

/// One row's cell for one report.
type Cell = Box<dyn Fn(&ScenarioReport) -> String>;

/// The reports side by side, then the ratios the node-side benchmark targets
/// (through-adc against attach-required: at least 2x).
pub fn table(reports: &[ScenarioReport]) -> String {
    let mut out = String::new();
    let rows: Vec<(&str, Cell)> = vec![
        (
            "nodes / pods",
            Box::new(|r| format!("{} / {}", r.nodes, r.pods)),
        ),
        (
            "background (other nodes)",
            Box::new(|r| format!("{} pods+PVCs+PVs", r.background)),
        ),
        ("setup (not timed)", Box::new(|r| s(r.setup_s))),
        (
            "  of which background",
            Box::new(|r| s(r.background_created_s)),
        ),
        ("pods created", Box::new(|r| s(r.pods_created_s))),
        ("ready p50", Box::new(|r| s(r.ready.p50_s))),
        ("ready p90", Box::new(|r| s(r.ready.p90_s))),
        ("ready p99", Box::new(|r| s(r.ready.p99_s))),
        ("ready max", Box::new(|r| s(r.ready.max_s))),
        ("first Ready", Box::new(|r| opt_s(r.first_ready_s))),
        ("all Ready (wall)", Box::new(|r| opt_s(r.all_ready_s))),
        (
            "pods Ready",
            Box::new(|r| format!("{} / {}", r.ready.count, r.pods)),
        ),
        ("delete p50", Box::new(|r| s(r.delete.p50_s))),
        ("delete p99", Box::new(|r| s(r.delete.p99_s))),
        ("all deleted (wall)", Box::new(|r| opt_s(r.all_deleted_s))),
        (
            "all unmounted (wall)",
            Box::new(|r| opt_s(r.all_unmounted_s)),
        ),
        (
            "agent RSS idle (max)",
            Box::new(|r| mib(r.agent_rss_idle_max_bytes)),
        ),
        ("agent RSS max", Box::new(|r| mib(r.agent_rss_max_bytes))),
        ("agent RSS mean", Box::new(|r| mib(r.agent_rss_mean_bytes))),
        ("agent VmHWM max", Box::new(|r| mib(r.agent_hwm_max_bytes))),
        (
            "agent RssAnon / RssFile max",
            Box::new(|r| {
                let anon = r.agents.iter().map(|a| a.rss_anon_bytes).max().unwrap_or(0);
                let file = r.agents.iter().map(|a| a.rss_file_bytes).max().unwrap_or(0);
                format!("{} / {}", mib(anon), mib(file))
            }),
        ),
        (
            "agent threads max",
            Box::new(|r| {
                let t = r.agents.iter().map(|a| a.threads).max().unwrap_or(0);
                t.to_string()
            }),
        ),
        (
            "agent CPU (sum, whole run)",
            Box::new(|r| {
                let total: f64 = r.agents.iter().filter_map(|a| a.cpu_s_at_end).sum();
                format!("{total:.2} s")
            }),
        ),
        (
            "CPU until Ready: agents",
            Box::new(|r| format!("{:.2} s", r.cpu_ready_phase.agents_s)),
        ),
        (
            "CPU until Ready: drivers",
            Box::new(|r| format!("{:.2} s", r.cpu_ready_phase.drivers_s)),
        ),
        (
            "CPU until Ready: csi-bench",
            Box::new(|r| format!("{:.2} s", r.cpu_ready_phase.node_load_s)),
        ),
        (
            "driver RSS max",
            Box::new(|r| r.driver_rss_max_bytes.map_or_else(|| "n/a".into(), mib)),
        ),
        (
            "agent writes/pod (ready)",
            Box::new(|r| per_pod(r.agent_writes_ready.total, r.pods)),
        ),
        (
            "agent writes/pod (delete)",
            Box::new(|r| per_pod(r.agent_writes_delete.total, r.pods)),
        ),
        (
            "mounts when Ready",
            Box::new(|r| r.mounts_when_ready.to_string()),
        ),
        (
            "mounts left at end",
            Box::new(|r| r.mounts_left_at_end.to_string()),
        ),
    ];
    let width = 28;
    let col = reports
        .iter()
        .map(|r| r.scenario.name().len())
        .max()
        .unwrap_or(0)
        .max(12)
        + 2;
    let _ = write!(out, "{:width$}", "");
    for r in reports {
        let _ = write!(out, "{:>col$}", r.scenario.name());
    }
    out.push('\n');
    for (label, f) in &rows {
        let _ = write!(out, "{label:width$}");
        for r in reports {
            let _ = write!(out, "{:>col$}", f(r));
        }
        out.push('\n');
    }
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
