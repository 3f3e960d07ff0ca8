//! `csi-bench stack`: pod-volume-ready latency, API writes per pod, provisioning throughput
//! and the process's memory, per scenario, each on its own throw-away cluster.
//!
//! Modules: `scenarios` (which cluster and class each runs), `workload` (the objects, created
//! at once and timed, then deleted), `watch` (when each object reached its goal), `measure`
//! (percentiles, the audit record's writes, `/proc/self` memory), `report` (JSON and tables),
//! `isolate` (a scenario in a child process).
//! Only the report goes to stdout; progress goes to stderr.

mod isolate;
mod measure;
mod report;
mod scenarios;
mod timeline;
mod watch;
mod workload;

use crate::harness::cli::Named as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::storage::v1::CSIDriver;
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;

use self::measure::BENCH_USER_AGENT;
use self::report::{PerNode, Report, ScenarioReport};
use self::scenarios::Scenario;
use cluster::{Error, HOSTPATH_DRIVER, RunningCluster, UpConfig};

/// The longest data dir of one bench process: a cluster's dir below it (`/N`) plus the
/// longest socket path a node has (`/nodes/node-NN/kubelet/plugins_registry/
/// hostpath.csi.k8s.io-reg.sock`, 68) must stay within a unix socket path's 107 bytes.
const MAX_DATA_DIR: usize = 37;
/// The most pairs one scenario may create.
const MAX_PODS: usize = 10_000;

/// What a parent's data dir must leave for its children's (`/N`, `/i1`).
const CHILD_DIR: usize = 3;

/// How long the cluster is left alone after it is ready before its idle memory is read
/// (the components' first lists and watches settle).
const SETTLE: Duration = Duration::from_secs(2);

/// The whole stack in this process, as csi-cluster runs it: pod volume to Ready, writes per pod,
/// provisioning, memory.
///
/// Per scenario a throw-away csi-cluster (every component in this process, real loop devices
/// and mounts, ec2-sim for EBS) gets --pods claim + pod pairs at once; each pod is timed from
/// its create until Ready, each claim until Bound, then everything is deleted and the cluster
/// stopped. API writes and reads per pod by component come from the API server's audit
/// record; memory is this process's VmRSS/VmHWM. With several scenarios or runs each runs in
/// a child process of its own, so its memory is its own. Runs as root.
///
///   csi-bench stack --scenario all --pods 100 --nodes 10
///   csi-bench stack --scenario ebs,hostpath-bypass-adc --pods 3 --nodes 2 -o json
#[derive(clap::Args, Debug, Clone)]
#[command(verbatim_doc_comment)]
pub struct Flags {
    /// Claim + pod pairs per scenario (claims for provisioning), all created at once.
    #[arg(long, default_value_t = 20, value_name = "N")]
    pub pods: usize,

    /// Nodes of each scenario's cluster (all in one zone).
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub nodes: usize,

    /// ebs, hostpath-attach, hostpath-through-adc, hostpath-bypass-adc, in-tree-migrated,
    /// provisioning, or all; a comma list or the flag repeated for several. `all` also
    /// measures the idle memory per node (1 node against --nodes).
    #[arg(long, default_value = "all", value_name = "SCENARIO[,...]")]
    pub scenario: Vec<String>,

    /// text prints one table per metric, json one object with every number.
    #[command(flatten)]
    pub report: crate::harness::output::ReportFlags,

    /// Where the clusters live (one directory per scenario, with its logs); kept
    /// afterwards. Default: a temp dir under /var/tmp, removed afterwards. At most 34
    /// characters (unix socket paths below it).
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,

    /// ec2-sim's timing: fast (tens of ms) or realistic (AWS's medians).
    #[arg(long, default_value = "fast", value_name = "fast|realistic")]
    pub timing: ec2_sim::Timing,

    /// How long each phase (cluster ready, all Ready, cleanup) may take, in seconds.
    #[arg(long, default_value_t = 300, value_name = "SECONDS")]
    pub timeout: u64,

    /// Create the pairs (claims) one at a time, each once the one before is Ready (Bound):
    /// each path's own latency without queueing, instead of a burst.
    #[arg(long)]
    pub sequential: bool,

    /// Run every scenario this many times (each on a fresh cluster); the tables show the
    /// median and the range, the JSON every run.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub runs: usize,

    /// Internal (what `all` runs in a child process): print the idle VmRSS of a ready
    /// N-node cluster as JSON.
    #[arg(long, hide = true, value_name = "N")]
    pub idle_nodes: Option<usize>,
}

/// What the flags ask for, checked.
struct Plan {
    scenarios: Vec<Scenario>,
    runs: usize,
    sequential: bool,
    per_node: bool,
    report: crate::harness::output::ReportFlags,
    pods: usize,
    nodes: usize,
    timing: ec2_sim::Timing,
    patience: Duration,
}

impl Flags {
    fn plan(&self) -> Result<Plan, Error> {
        let (scenarios, per_node) =
            crate::harness::cli::select(&self.scenario).map_err(Error::Config)?;
        // The 20-node × 5,000-pod memory run (docs/csi-bench/node.md), with room to spare.
        if self.pods == 0 || self.pods > MAX_PODS {
            return Err(Error::Config(format!(
                "--pods must be between 1 and {MAX_PODS}, got {}",
                self.pods
            )));
        }
        if self.nodes == 0 || self.nodes > 99 {
            return Err(Error::Config(format!(
                "--nodes must be between 1 and 99, got {}",
                self.nodes
            )));
        }
        if !(1..=10).contains(&self.runs) {
            return Err(Error::Config(format!(
                "--runs must be between 1 and 10, got {}",
                self.runs
            )));
        }
        cluster::require_real_timing(self.timing)?;
        Ok(Plan {
            scenarios,
            runs: self.runs,
            sequential: self.sequential,
            per_node: per_node && self.nodes > 1,
            report: self.report.clone(),
            pods: self.pods,
            nodes: self.nodes,
            timing: self.timing,
            patience: Duration::from_secs(self.timeout.max(1)),
        })
    }
}

/// The data dir: the user's (kept) or a temp dir under /var/tmp (removed when dropped).
enum DataDir {
    Kept(PathBuf),
    Temp(tempfile::TempDir),
}

impl DataDir {
    /// `reserve`: characters the dirs of child processes add below it.
    fn new(given: Option<&Path>, reserve: usize) -> Result<Self, Error> {
        let dir = match given {
            Some(d) => {
                std::fs::create_dir_all(d).map_err(|e| Error::io("creating the data dir", d, e))?;
                let d = std::fs::canonicalize(d)
                    .map_err(|e| Error::io("resolving the data dir", d, e))?;
                DataDir::Kept(d)
            }
            None => DataDir::Temp(
                tempfile::Builder::new()
                    .prefix("csi-bench-")
                    .tempdir_in("/var/tmp")
                    .map_err(|e| Error::io("creating a temp dir in", "/var/tmp", e))?,
            ),
        };
        let len = dir.path().as_os_str().len();
        let max = MAX_DATA_DIR - reserve;
        if len > max {
            return Err(Error::Config(format!(
                "--data-dir {} is {len} characters: at most {max} here (unix socket paths below it are limited to 107 bytes)",
                dir.path().display()
            )));
        }
        Ok(dir)
    }

    fn path(&self) -> &Path {
        match self {
            DataDir::Kept(p) => p,
            DataDir::Temp(t) => t.path(),
        }
    }
}

/// Runs the benchmark: the scenarios one after the other, the report on stdout, progress on
/// stderr. Fails if a scenario failed (after printing what was measured). With more than one
/// scenario or run (or `all`'s per-node memory), each runs in a `csi-bench stack` child process of
/// its own, so its memory numbers are its own and not what earlier clusters left allocated.
/// The child is this program (`/proc/self/exe`) run as `stack`, so `run` belongs to the
/// `csi-bench` binary; a single scenario and run stays in-process.
pub async fn run(flags: Flags) -> Result<(), Error> {
    let plan = flags.plan()?;
    cluster::require_root("bench")?;
    let isolated =
        flags.idle_nodes.is_none() && (plan.scenarios.len() * plan.runs > 1 || plan.per_node);
    let data_dir = DataDir::new(
        flags.data_dir.as_deref(),
        if isolated { CHILD_DIR } else { 0 },
    )?;
    let shutdown = component_runtime::shutdown_on_signals();
    let interrupted = || Error::Interrupted("the clusters were cleaned up; no report".into());
    if let Some(nodes) = flags.idle_nodes {
        cluster::logs::init(&data_dir.path().join("logs"), 0)?;
        // Dropping the cluster on a signal unmounts and detaches below its dir (its guard).
        let dir = data_dir.path().join("0");
        let idle = tokio::select! {
            r = idle_rss(nodes, &plan, &dir) => r?,
            () = shutdown.cancelled() => return Err(interrupted()),
        };
        println!("{}", serde_json::json!({ "idle_rss_mib": idle }));
        return Ok(());
    }
    eprintln!(
        "bench: {} pods, {} nodes, scenarios {}; data dir {}",
        plan.pods,
        plan.nodes,
        plan.scenarios
            .iter()
            .map(|s| s.name())
            .collect::<Vec<_>>()
            .join(", "),
        data_dir.path().display()
    );
    let (per_node, reports) = if isolated {
        // The children get the signal passed on and clean up themselves; wait for them.
        measure_all(&flags, &plan, data_dir.path(), true, &shutdown).await?
    } else {
        cluster::logs::init(&data_dir.path().join("logs"), 0)?;
        tokio::select! {
            r = measure_all(&flags, &plan, data_dir.path(), false, &shutdown) => r?,
            () = shutdown.cancelled() => return Err(interrupted()),
        }
    };
    if shutdown.is_cancelled() {
        return Err(interrupted());
    }
    let report = Report {
        date_utc: jiff::Timestamp::now()
            .strftime("%Y-%m-%d %H:%M UTC")
            .to_string(),
        cpus: std::thread::available_parallelism().map_or(0, usize::from),
        pods: plan.pods,
        nodes: plan.nodes,
        timing: timing_name(plan.timing).into(),
        runs: plan.runs,
        sequential: plan.sequential,
        scenarios: reports,
        per_node,
    };
    // Only --json-file can fail here: a path the user gave.
    plan.report
        .emit(&report, Report::text)
        .map_err(|e| Error::Config(e.to_string()))?;
    let failed: Vec<String> = report
        .scenarios
        .iter()
        .filter(|s| s.note.as_deref().is_some_and(|n| n.starts_with("failed")))
        .map(|s| s.scenario.clone())
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "scenarios failed: {} (see above)",
            failed.join(", ")
        )))
    }
}

pub(crate) fn timing_name(t: ec2_sim::Timing) -> &'static str {
    match t {
        ec2_sim::Timing::Instant => "instant",
        ec2_sim::Timing::Fast => "fast",
        ec2_sim::Timing::Realistic => "realistic",
    }
}

/// Every run of every scenario (and `all`'s per-node memory), in child processes when
/// `isolated`.
async fn measure_all(
    flags: &Flags,
    plan: &Plan,
    data_dir: &Path,
    isolated: bool,
    shutdown: &CancellationToken,
) -> Result<(Vec<PerNode>, Vec<ScenarioReport>), Error> {
    let mut per_node = Vec::new();
    let mut reports = Vec::new();
    for run in 1..=plan.runs {
        if plan.runs > 1 {
            eprintln!("bench: run {run} of {}", plan.runs);
        }
        if plan.per_node {
            let one = isolate::idle_rss(flags, 1, &data_dir.join("i1"), shutdown).await?;
            let many = isolate::idle_rss(flags, plan.nodes, &data_dir.join("in"), shutdown).await?;
            per_node.push(PerNode {
                one_node_idle_rss_mib: one,
                nodes: plan.nodes,
                nodes_idle_rss_mib: many,
                per_node_mib: (many - one) / (plan.nodes - 1) as f64,
            });
        }
        for (i, s) in plan.scenarios.iter().enumerate() {
            if shutdown.is_cancelled() {
                return Ok((per_node, reports));
            }
            let dir = data_dir.join(((run - 1) * plan.scenarios.len() + i).to_string());
            let mut r = if isolated {
                isolate::scenario(flags, *s, &dir, shutdown).await
            } else {
                run_scenario(*s, plan, &dir).await
            };
            r.run = run;
            match (&r.measured, &r.note) {
                // A child said so itself.
                (true, _) if isolated => {}
                (true, _) => eprintln!("bench: {} done", s.name()),
                (false, note) => eprintln!(
                    "bench: {} (run {run}) not measured: {}",
                    s.name(),
                    note.as_deref().unwrap_or("?")
                ),
            }
            reports.push(r);
        }
    }
    Ok((per_node, reports))
}

/// A client whose writes the tally leaves out.
async fn bench_client(cluster: &RunningCluster) -> Result<Client, Error> {
    component_runtime::build_client(
        Some(&cluster.kubeconfig()),
        &format!("{BENCH_USER_AGENT}/{}", env!("CARGO_PKG_VERSION")),
        -1.0,
        0,
    )
    .await
    .map_err(|e| Error::start("the bench's API client", e))
}

/// One scenario on its own cluster, stopped afterwards whatever happened.
async fn run_scenario(s: Scenario, plan: &Plan, dir: &Path) -> ScenarioReport {
    let mut report = ScenarioReport {
        scenario: s.name().into(),
        class: s.class().into(),
        ..ScenarioReport::default()
    };
    eprintln!(
        "bench: {}: starting a {}-node cluster in {}",
        s.name(),
        plan.nodes,
        dir.display()
    );
    measure::reset_peak();
    let started = Instant::now();
    let cluster =
        match RunningCluster::start(s.up_config(plan.nodes, plan.pods, dir, plan.timing)).await {
            Ok(c) => c,
            Err(e) => {
                report.note = Some(format!("failed: starting the cluster: {e}"));
                return report;
            }
        };
    let outcome = measure_on(&cluster, s, plan, started, &mut report).await;
    let stopped = cluster.stop().await;
    report.memory.peak_mib = measure::memory().1;
    let _ = std::fs::remove_dir_all(dir)
        .map_err(|e| tracing::warn!(error = %e, dir = %dir.display(), "removing a scenario's dir"));
    match (outcome, stopped) {
        (Ok(Some(not_measured)), Ok(())) => report.note = Some(not_measured),
        (Ok(None), Ok(())) => report.measured = true,
        (Err(e), _) => report.note = Some(format!("failed: {e}")),
        (Ok(_), Err(e)) => report.note = Some(format!("failed: stopping the cluster: {e}")),
    }
    report
}

/// The measurement proper; `Ok(Some(why))` when the scenario cannot run as designed here.
async fn measure_on(
    cluster: &RunningCluster,
    s: Scenario,
    plan: &Plan,
    started: Instant,
    report: &mut ScenarioReport,
) -> Result<Option<String>, Error> {
    cluster.wait_ready().await?;
    report.cluster_ready_s = started.elapsed().as_secs_f64();
    let client = bench_client(cluster).await?;
    if s == Scenario::HostpathAttach && !hostpath_attach_required(&client).await? {
        return Ok(Some(format!(
            "UpConfig::hostpath_attach_required left CSIDriver {HOSTPATH_DRIVER} at attachRequired false: this build does not implement it"
        )));
    }
    if s == Scenario::Provisioning {
        workload::create_immediate_class(&client).await?;
    }
    tokio::time::sleep(SETTLE).await;
    report.memory.idle_rss_mib = measure::memory().0;
    eprintln!(
        "bench: {}: ready in {:.1} s; creating {} {}",
        s.name(),
        report.cluster_ready_s,
        plan.pods,
        if s.has_pods() {
            "claims and pods"
        } else {
            "claims"
        }
    );
    let mut trails = Vec::new();
    if s.has_pods() {
        let (pods, pod_trails) = workload::pods_to_ready(
            cluster,
            &client,
            s.class(),
            plan.pods,
            plan.sequential,
            plan.patience,
        )
        .await?;
        report.pods = Some(pods);
        trails = pod_trails;
    } else {
        report.provisioning = Some(
            workload::claims_to_bound(
                cluster,
                &client,
                s.class(),
                plan.pods,
                plan.sequential,
                plan.patience,
            )
            .await?,
        );
    }
    // One copy of the window's audit record for every number drawn from it.
    let audit = cluster.audit();
    report.writes = measure::writes(&audit, plan.pods);
    report.reads = measure::reads(&audit, plan.pods);
    report.server = timeline::server_time(&audit);
    if let Some(pods) = report.pods.as_mut() {
        pods.stages = timeline::stages(&audit, &trails);
    }
    drop(audit);
    report.memory.loaded_rss_mib = measure::memory().0;
    eprintln!("bench: {}: all there; deleting everything", s.name());
    report.cleanup_s = workload::clean_up(&client, plan.patience)
        .await?
        .as_secs_f64();
    Ok(None)
}

async fn hostpath_attach_required(client: &Client) -> Result<bool, Error> {
    let driver = Api::<CSIDriver>::all(client.clone())
        .get(HOSTPATH_DRIVER)
        .await
        .map_err(|e| Error::kube(format!("reading CSIDriver {HOSTPATH_DRIVER}"), e))?;
    Ok(driver.spec.attach_required == Some(true))
}

/// VmRSS of a ready `nodes`-node cluster left idle (no workload) for a moment.
async fn idle_rss(nodes: usize, plan: &Plan, dir: &Path) -> Result<f64, Error> {
    eprintln!("bench: idle memory with {nodes} node(s)");
    let mut config = UpConfig::new(nodes, dir);
    config.zones = 1;
    config.port = Some(0);
    config.timing = plan.timing;
    let cluster = RunningCluster::start(config).await?;
    let ready = cluster.wait_ready().await;
    tokio::time::sleep(SETTLE).await;
    let rss = measure::memory().0;
    cluster.stop().await?;
    ready?;
    let _ = std::fs::remove_dir_all(dir);
    Ok(rss)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use clap::Parser as _;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        flags: Flags,
    }

    fn flags(args: &[&str]) -> Flags {
        let all = ["csi-bench-stack"].iter().chain(args.iter()).copied();
        Cli::try_parse_from(all).unwrap().flags
    }

    #[test]
    fn flags_default_and_check() {
        let p = flags(&[]).plan().unwrap();
        assert_eq!((p.pods, p.nodes, p.report.json()), (20, 3, false));
        assert_eq!(p.scenarios.len(), 6);
        assert!(p.per_node);
        let p = flags(&[
            "--scenario",
            "ebs,hostpath-bypass-adc",
            "-o",
            "json",
            "--pods",
            "3",
        ])
        .plan()
        .unwrap();
        assert_eq!(
            p.scenarios,
            vec![Scenario::Ebs, Scenario::HostpathBypassAdc]
        );
        assert!(p.report.json() && !p.per_node);
        let e = flags(&["--pods", "0"]).plan().err().unwrap().to_string();
        assert!(e.contains("--pods"), "{e}");
        assert_eq!(flags(&["--pods", "5000"]).plan().unwrap().pods, 5000);
        let e = flags(&["--pods", "10001"])
            .plan()
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("between 1 and 10000"), "{e}");
        assert!(
            !flags(&["--nodes", "1"]).plan().unwrap().per_node,
            "1 node: nothing to compare"
        );
    }

    #[test]
    fn a_long_data_dir_is_refused_by_name() {
        let long = tempfile::tempdir().unwrap();
        let dir = long
            .path()
            .join("a-directory-name-that-is-far-too-long-for-sockets");
        let e = DataDir::new(Some(&dir), 0).err().unwrap().to_string();
        assert!(e.contains("--data-dir") && e.contains("107"), "{e}");
    }
}
