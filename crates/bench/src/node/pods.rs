//! The measured part: bind the volumes, create the pods all at once and time each until a pods
//! watch sees it Ready; read the agents' memory; delete the pods and time them until gone and
//! until nothing is mounted on the nodes any more.

use std::time::{Duration, Instant};

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::runtime::watcher;

use crate::harness::goals::{Counts, GoalWatch};
use crate::harness::objects::OwnWrites;
use crate::harness::writes::{Writes, is_write};

use super::env::{Env, mounts_below};
use super::report::{AgentStats, ScenarioReport};
use super::run_objects::{self, NS, POD_LABEL, POD_LABEL_VALUE};
use super::{Error, LoadConfig, Scenario};

/// How csi-node-agent's requests start (`node_agent::startup::user_agent`).
const AGENT_USER_AGENT: &str = "csi-node-agent/";

fn is_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The run's pods, timed until each is first Ready and until each is gone.
fn pod_watch(api: Api<Pod>) -> GoalWatch {
    let config = watcher::Config::default().labels(&format!("{POD_LABEL}={POD_LABEL_VALUE}"));
    GoalWatch::spawn(api, config, |p: &Pod| is_ready(p).then(String::new))
}

/// Waits until `done(counts)` (`reached`: pods seen Ready, `gone`: deleted), checking the
/// processes every 100 ms.
async fn wait(
    w: &GoalWatch,
    env: &mut Env,
    phase: &str,
    timeout: Duration,
    done: impl Fn(&Counts) -> bool,
    progress: impl Fn(&Counts) -> String,
) -> Result<(), Error> {
    let deadline = Instant::now() + timeout;
    let mut rx = w.receiver();
    loop {
        let c = *rx.borrow_and_update();
        if done(&c) {
            return Ok(());
        }
        env.check_alive()?;
        if Instant::now() > deadline {
            return Err(Error::timeout(
                phase.to_string(),
                format!("after {timeout:?}, {}", progress(&c)),
                env.agent_log_tails(10),
            ));
        }
        let _ = tokio::time::timeout(Duration::from_millis(100), rx.changed()).await;
    }
}

pub(crate) async fn measure(
    env: &mut Env,
    config: &LoadConfig,
    scenario: Scenario,
) -> Result<ScenarioReport, Error> {
    let n = config.pods;
    let setup_start = Instant::now();
    // The rest of the cluster first: other nodes' pods, claims and PVs.
    run_objects::create_background(
        &env.world.kube,
        env.driver_name,
        config.background,
        config.parallelism,
    )
    .await?;
    let background_created = setup_start.elapsed();
    let endpoints: Vec<String> = match &env.ebs {
        Some(e) => vec![e.controller_endpoint()],
        None => env
            .nodes
            .iter()
            .map(|node| format!("unix://{}", node.socket.display()))
            .collect(),
    };
    run_objects::bind_all(
        &env.world.kube,
        scenario,
        env.driver_name,
        &endpoints,
        n,
        config.parallelism,
    )
    .await?;
    let pods: Api<Pod> = Api::namespaced(env.world.kube.clone(), NS);
    let w = pod_watch(pods.clone());
    wait(
        &w,
        env,
        "the pods watch's first list",
        config.timeout,
        |c| c.synced,
        |_| "not synced".into(),
    )
    .await?;
    let setup = setup_start.elapsed();
    let mut idle_rss = Vec::with_capacity(env.nodes.len());
    for node in &env.nodes {
        idle_rss.push(node.agent_memory()?.rss);
    }
    let audit_start = env.world.audit_len();
    let cpu_start = env.cpu_split();

    // The timed phase: every pod at once (parallelism in flight), round robin over the nodes;
    // or, with `sequential`, one pod at a time, each created once the one before is Ready.
    let node_names: Vec<String> = env.nodes.iter().map(|n| n.name.clone()).collect();
    let own = OwnWrites::default();
    let create = |i: usize| {
        let (pods, own) = (pods.clone(), &own);
        let node = node_names
            .get(run_objects::node_of(i, node_names.len()))
            .cloned()
            .unwrap_or_default();
        async move {
            let pod = run_objects::pod(i, &node)?;
            let start = Instant::now();
            own.create_object(&pods, &pod).await?;
            Ok::<_, Error>((run_objects::pod_name(i), start))
        }
    };
    let t0 = Instant::now();
    let starts: Vec<(String, Instant)> = if config.sequential {
        let mut starts = Vec::with_capacity(n);
        for i in 0..n {
            starts.push(create(i).await?);
            wait(
                &w,
                env,
                "the pod Ready (sequential)",
                config.timeout,
                |c| c.reached > i,
                |c| format!("{} of {n} pods Ready", c.reached),
            )
            .await?;
        }
        starts
    } else {
        futures::stream::iter(0..n)
            .map(create)
            .buffer_unordered(config.parallelism)
            .try_collect()
            .await?
    };
    let created = t0.elapsed();
    wait(
        &w,
        env,
        "all pods Ready",
        config.timeout,
        |c| c.reached >= n,
        |c| format!("{} of {n} pods Ready", c.reached),
    )
    .await?;
    let audit_ready = env.world.audit_len();
    let cpu_ready = env.cpu_split().since(cpu_start);

    // Memory once every volume is mounted.
    let mut agents = Vec::new();
    for (node, &idle) in env.nodes.iter().zip(&idle_rss) {
        let m = node.agent_memory()?;
        agents.push(AgentStats {
            node: node.name.clone(),
            rss_idle_bytes: idle,
            rss_bytes: m.rss,
            hwm_bytes: m.hwm,
            rss_anon_bytes: m.anon,
            rss_file_bytes: m.file,
            threads: m.threads,
            cpu_s_at_ready: node.agent_cpu().map(|d| d.as_secs_f64()),
            cpu_s_at_end: None,
        });
    }
    let driver_rss_max = env
        .nodes
        .iter()
        .filter_map(|n| n.driver_memory())
        .map(|m| m.rss)
        .max();
    let mounts_when_ready = mounts_below(env.world.root()).len();

    // Teardown: every pod deleted at once; gone when the agent confirmed the deletion.
    let t1 = Instant::now();
    let names = starts.iter().map(|(name, _)| name.clone());
    let delete_starts =
        crate::harness::api::delete_timed(&pods, names, config.parallelism, "pod").await?;
    wait(
        &w,
        env,
        "all pods deleted",
        config.timeout,
        |c| c.gone >= n,
        |c| format!("{} of {n} pods gone", c.gone),
    )
    .await?;
    let all_deleted = {
        let seen = w.seen();
        seen.gone.values().max().map(|t| t.duration_since(t1))
    };
    // Unstaging may follow the confirmation: wait until nothing is mounted on the nodes.
    let unmount_deadline = Instant::now() + config.timeout;
    let all_unmounted = loop {
        if mounts_below(env.world.root()).is_empty() {
            break Some(t1.elapsed());
        }
        env.check_alive()?;
        if Instant::now() > unmount_deadline {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let audit = env.world.audit();
    let writes_ready = agent_writes(audit.get(audit_start..audit_ready).unwrap_or_default());
    let writes_delete = agent_writes(audit.get(audit_ready..).unwrap_or_default());
    // The background goes too (the run leaves nothing), after the agents' numbers.
    let t2 = Instant::now();
    if config.background > 0 {
        run_objects::delete_background(&env.world.kube).await?;
    }
    let background_deleted = t2.elapsed();
    for (a, node) in agents.iter_mut().zip(env.nodes.iter()) {
        a.cpu_s_at_end = node.agent_cpu().map(|d| d.as_secs_f64());
    }

    let tl = w.seen();
    let mut latencies = Vec::with_capacity(n);
    for (name, start) in &starts {
        if let Some(ready) = tl.reached_at(name) {
            latencies.push(ready.saturating_duration_since(*start));
        }
    }
    let mut delete_latencies = Vec::with_capacity(n);
    for (name, start) in &delete_starts {
        if let Some(gone) = tl.gone.get(name) {
            delete_latencies.push(gone.saturating_duration_since(*start));
        }
    }
    let first_ready = tl
        .reached
        .values()
        .map(|(at, _)| *at)
        .min()
        .map(|t| t.saturating_duration_since(t0));
    let all_ready = tl
        .reached
        .values()
        .map(|(at, _)| *at)
        .max()
        .map(|t| t.saturating_duration_since(t0));
    Ok(ScenarioReport::new(
        scenario,
        config,
        setup,
        created,
        &latencies,
        first_ready,
        all_ready,
        &delete_latencies,
        all_deleted,
        all_unmounted,
        agents,
        driver_rss_max,
        mounts_when_ready,
    )
    .with_extras(
        idle_rss.iter().copied().max().unwrap_or(0),
        writes_ready,
        writes_delete,
        cpu_ready,
    )
    .with_background(background_created, background_deleted))
}

/// The agents' writes (User-Agent `csi-node-agent/...`) in a slice of the audit trail.
fn agent_writes(records: &[apiserver::AuditRecord]) -> Writes {
    let mut w = Writes::default();
    for r in records
        .iter()
        .filter(|r| is_write(&r.verb) && r.user_agent.starts_with(AGENT_USER_AGENT))
    {
        w.add(r);
    }
    w
}
