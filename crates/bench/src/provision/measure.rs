//! The measured part: N claims created at once and timed until Bound; memory, CPU and writes
//! of that phase; then every claim deleted and timed until its volume is gone.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use csi_spec::v1::ListVolumesRequest;
use csi_spec::v1::controller_client::ControllerClient;
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::Api;

use super::env::Env;
use super::report::{MemorySample, PhaseWrites, ProcessReport, ScenarioReport};
use super::run_objects::{self, NS};
use super::watch::{Counts, Watches};
use super::{Error, LoadConfig, Scenario};
use crate::harness::objects::OwnWrites;

/// CPU time so far of the provisioner, the driver and this process (API server, PV
/// controller, ec2-sim, the watches).
#[derive(Debug, Clone, Copy, Default)]
struct Cpu {
    provisioner: Option<Duration>,
    driver: Option<Duration>,
    own: Option<Duration>,
}

impl Cpu {
    fn sample(env: &Env) -> Self {
        Self {
            provisioner: env.provisioner_cpu(),
            driver: env.driver_cpu(),
            own: crate::harness::procfs::cpu_time(std::process::id()).ok(),
        }
    }
}

fn delta(later: Option<Duration>, earlier: Option<Duration>) -> Option<f64> {
    Some(later?.saturating_sub(earlier?).as_secs_f64())
}

/// `later - earlier` per action (the calls of one phase).
fn calls_between(
    later: &BTreeMap<String, u64>,
    earlier: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    later
        .iter()
        .map(|(k, n)| (k.clone(), n.saturating_sub(*earlier.get(k).unwrap_or(&0))))
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// The 1-minute load average, to say how busy the machine was.
fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Volumes the driver lists (ListVolumes, all pages); `None` for a driver without it (EBS).
async fn driver_volumes(env: &Env) -> Result<Option<usize>, Error> {
    if env.scenario != Scenario::Hostpath {
        return Ok(None);
    }
    let err = |reason: String| Error::Csi {
        op: format!("ListVolumes at {}", env.endpoint),
        reason,
    };
    let channel = csi_spec::connect_unix(&env.endpoint)
        .await
        .map_err(|e| err(e.to_string()))?;
    let mut client = ControllerClient::new(channel);
    let (mut token, mut count) = (String::new(), 0);
    loop {
        let page = client
            .list_volumes(ListVolumesRequest {
                max_entries: 0,
                starting_token: token,
            })
            .await
            .map_err(|e| err(e.to_string()))?
            .into_inner();
        count += page.entries.len();
        if page.next_token.is_empty() {
            return Ok(Some(count));
        }
        token = page.next_token;
    }
}

/// Waits until `done(counts)`, checking the processes every 100 ms.
async fn wait(
    env: &mut Env,
    w: &mut Watches,
    phase: &'static str,
    timeout: Duration,
    done: impl Fn(&Counts) -> bool,
    progress: impl Fn(&Counts) -> String,
) -> Result<(), Error> {
    let deadline = Instant::now() + timeout;
    loop {
        let c = w.counts();
        if done(&c) {
            return Ok(());
        }
        env.check_alive()?;
        if Instant::now() > deadline {
            return Err(env.timeout(phase, timeout, progress(&c)));
        }
        w.changed(Duration::from_millis(100)).await;
    }
}

/// Lets the processes run on for `d` (late writes), checking that they stay up.
async fn settle(env: &mut Env, d: Duration) -> Result<(), Error> {
    let until = Instant::now() + d;
    while Instant::now() < until {
        env.check_alive()?;
        tokio::time::sleep(Duration::from_millis(100).min(until - Instant::now())).await;
    }
    env.check_alive()
}

pub(crate) async fn measure(
    env: &mut Env,
    config: &LoadConfig,
    scenario: Scenario,
    run: usize,
    started: Instant,
) -> Result<ScenarioReport, Error> {
    let n = config.pvcs_of(scenario);
    let load_average_1m = load_average();
    let mut w = Watches::spawn(&env.world.kube);
    wait(
        env,
        &mut w,
        "the watches' first lists",
        config.timeout,
        |c| c.claims_synced && c.volumes_synced,
        |c| format!("{c:?}"),
    )
    .await?;
    let setup = started.elapsed();
    let audit_start = env.world.audit_len();
    let ec2_start = env.ec2_calls();
    let cpu_start = Cpu::sample(env);

    // The timed phase: every claim at once (`parallelism` creates in flight).
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(env.world.kube.clone(), NS);
    let own = OwnWrites::default();
    let create = |i: usize| {
        let (claims, own) = (claims.clone(), &own);
        async move {
            let claim = run_objects::claim(i)?;
            let start = Instant::now();
            own.create_object(&claims, &claim).await?;
            Ok::<_, Error>((run_objects::claim_name(i), start))
        }
    };
    let t0 = Instant::now();
    let starts: Vec<(String, Instant)> = futures::stream::iter(0..n)
        .map(create)
        .buffer_unordered(config.parallelism)
        .try_collect()
        .await?;
    let created = t0.elapsed();
    wait(
        env,
        &mut w,
        "all PVCs Bound",
        config.timeout,
        |c| c.bound >= n,
        |c| format!("{} of {n} PVCs Bound, {} PVs", c.bound, c.volumes),
    )
    .await?;
    let cpu_bound = Cpu::sample(env);
    let provisioner_at_bound = env.provisioner_memory().map(MemorySample::from);
    let driver_at_bound = env.driver_memory().map(MemorySample::from);
    let volumes_at_bound = w.counts().volumes;
    let driver_volumes_at_bound = driver_volumes(env).await?;
    settle(env, config.settle).await?;
    let audit_bound = env.world.audit_len();
    let ec2_bound = env.ec2_calls();

    // Deletes: every claim at once; done when every volume is gone (DeleteVolume, then the
    // provisioner's and pv-protection's finalizers removed) and every claim too.
    let t1 = Instant::now();
    let names = starts.iter().map(|(name, _)| name.clone());
    let delete_starts =
        crate::harness::api::delete_timed(&claims, names, config.parallelism, "PVC").await?;
    let deletes_sent = t1.elapsed();
    wait(
        env,
        &mut w,
        "all PVs deleted",
        config.timeout,
        |c| c.volumes == 0 && c.claims_gone >= n,
        |c| format!("{} PVs left, {} of {n} PVCs gone", c.volumes, c.claims_gone),
    )
    .await?;
    let cpu_end = Cpu::sample(env);
    settle(env, config.settle).await?;
    let provisioner_at_end = env.provisioner_memory().map(MemorySample::from);
    let driver_at_end = env.driver_memory().map(MemorySample::from);
    let driver_volumes_at_end = driver_volumes(env).await?;
    let ec2_end = env.ec2_calls();
    let audit = env.world.audit();
    let writes_bind = PhaseWrites::from(
        env.parties
            .tally(audit.get(audit_start..audit_bound).unwrap_or_default()),
    );
    let writes_delete = PhaseWrites::from(
        env.parties
            .tally(audit.get(audit_bound..).unwrap_or_default()),
    );

    let (claims_seen, volumes_seen) = (w.claims(), w.volumes());
    let since = |from: Instant, t: Option<Instant>| t.map(|t| t.saturating_duration_since(from));
    let latencies: Vec<Duration> = starts
        .iter()
        .filter_map(|(name, start)| since(*start, claims_seen.reached_at(name)))
        .collect();
    let delete_latencies: Vec<Duration> = delete_starts
        .iter()
        .filter_map(|(name, start)| {
            let volume = claims_seen.reached_with(name)?;
            since(*start, volumes_seen.gone.get(volume).copied())
        })
        .collect();
    let secs = |d: Option<Duration>| d.map(|d| d.as_secs_f64());
    let provisioner = ProcessReport {
        bin: config.binaries.provisioner.display().to_string(),
        args: env.provisioner_args.clone(),
        at_bound: provisioner_at_bound,
        at_end: provisioner_at_end,
        cpu_bind_s: delta(cpu_bound.provisioner, cpu_start.provisioner),
        cpu_delete_s: delta(cpu_end.provisioner, cpu_bound.provisioner),
        cpu_total_s: secs(cpu_end.provisioner),
    };
    let driver = ProcessReport {
        bin: config.binaries.driver(scenario).display().to_string(),
        args: env.driver_args.clone(),
        at_bound: driver_at_bound,
        at_end: driver_at_end,
        cpu_bind_s: delta(cpu_bound.driver, cpu_start.driver),
        cpu_delete_s: delta(cpu_end.driver, cpu_bound.driver),
        cpu_total_s: secs(cpu_end.driver),
    };
    Ok(ScenarioReport {
        scenario,
        run,
        pvcs: n,
        parallelism: config.parallelism,
        load_average_1m,
        setup_s: setup.as_secs_f64(),
        pvcs_created_s: created.as_secs_f64(),
        bound: crate::harness::stats::summarize(&latencies),
        first_bound_s: secs(
            claims_seen
                .reached
                .values()
                .map(|(at, _)| *at)
                .min()
                .map(|t| t.saturating_duration_since(t0)),
        ),
        all_bound_s: secs(
            claims_seen
                .reached
                .values()
                .map(|(at, _)| *at)
                .max()
                .map(|t| t.saturating_duration_since(t0)),
        ),
        volumes_at_bound,
        writes_bind,
        provisioner,
        driver,
        in_process_cpu_bind_s: delta(cpu_bound.own, cpu_start.own),
        deletes_sent_s: deletes_sent.as_secs_f64(),
        delete: crate::harness::stats::summarize(&delete_latencies),
        all_volumes_gone_s: secs(
            volumes_seen
                .gone
                .values()
                .max()
                .map(|t| t.saturating_duration_since(t1)),
        ),
        all_claims_gone_s: secs(
            claims_seen
                .gone
                .values()
                .max()
                .map(|t| t.saturating_duration_since(t1)),
        ),
        writes_delete,
        driver_volumes_at_bound,
        driver_volumes_at_end,
        ec2_calls_bind: calls_between(&ec2_bound, &ec2_start),
        ec2_calls_delete: calls_between(&ec2_end, &ec2_bound),
        latencies_s: latencies.iter().map(Duration::as_secs_f64).collect(),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn phase_calls_are_differences() {
        let before = BTreeMap::from([("CreateVolume".to_owned(), 2), ("X".to_owned(), 1)]);
        let after = BTreeMap::from([
            ("CreateVolume".to_owned(), 7),
            ("DescribeVolumes".to_owned(), 3),
            ("X".to_owned(), 1),
        ]);
        assert_eq!(
            calls_between(&after, &before),
            BTreeMap::from([
                ("CreateVolume".to_owned(), 5),
                ("DescribeVolumes".to_owned(), 3)
            ])
        );
        assert_eq!(
            delta(Some(Duration::from_secs(3)), Some(Duration::from_secs(1))),
            Some(2.0)
        );
        assert_eq!(delta(None, Some(Duration::from_secs(1))), None);
        assert!(load_average().is_some_and(|l| l >= 0.0));
    }
}
