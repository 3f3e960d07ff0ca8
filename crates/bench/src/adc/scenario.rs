//! One scenario, start to end, on a fresh API server:
//!
//! 1. setup: Nodes, CSINodes, the CSIDriver, bound PVCs and PVs; a watch on the Nodes;
//! 2. start-up: the ADC (and the attacher against the built-in csi-mock for attach-required),
//!    until each has opened the watches it needs (seen in the audit trail); no pod exists yet;
//! 3. the clock starts at the first pod create: all pods are created, then the run waits until
//!    every volume is in its node's `status.volumesAttached` (not for bypass-adc);
//! 4. settle: the processes run on for `settle`, so late writes are counted;
//! 5. the ADC's /metrics is scraped, the VolumeAttachments listed, the processes stopped
//!    (their peak RSS and CPU taken) and the audit trail tallied.

use std::path::Path;
use std::time::{Duration, Instant};

use apiserver::AuditRecord;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::Api;

use super::nodes::{Attached, AttachedTracker};
use super::report::{Component, ScenarioReport};
use super::run_objects::{LOAD_LABEL, LOAD_LABEL_VALUE, Objects};
use super::{LoadConfig, Scenario, USER_AGENT, metrics, run_objects};
use crate::Error;
use crate::harness::child::{self, Child, ProcessStats};
use crate::harness::world::World;
use crate::harness::writes::{Parties, Tally};

pub(crate) const ADC: &str = "attach/detach controller";
pub(crate) const ATTACHER: &str = "attacher";

/// Who writes besides the benchmark: the attacher is known by its binary's name, every other
/// User-Agent is the ADC's (the report lists the agents it saw).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Party {
    Adc,
    Attacher,
}

/// The processes under test of one scenario: every wait runs through [`Running::during`], so a
/// process that dies or a phase that hangs ends the run with the logs instead of a long wait.
struct Running {
    scenario: Scenario,
    adc: Child,
    attacher: Option<Child>,
}

impl Running {
    async fn during<T>(
        &mut self,
        phase: &str,
        deadline: Instant,
        progress: impl FnOnce() -> String,
        work: impl std::future::Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        let mut children: Vec<&mut Child> = std::iter::once(&mut self.adc)
            .chain(self.attacher.as_mut())
            .collect();
        let phase = format!("{}: {phase}", self.scenario);
        child::during(&mut children, &phase, deadline, progress, work).await
    }

    /// Stops both (a last sample first); the attacher's stats are `None` when it did not run.
    async fn stop(self) -> (ProcessStats, Option<ProcessStats>) {
        let adc = self.adc.stop().await;
        let attacher = match self.attacher {
            Some(a) => Some(a.stop().await),
            None => None,
        };
        (adc, attacher)
    }
}

/// What the ADC must be watching before the pods come: the objects its desired state is made
/// of. (CSIDrivers and CSINodes are read on demand through caches that may start later.)
const ADC_WATCHES: &[&str] = &[
    "pods",
    "nodes",
    "persistentvolumeclaims",
    "persistentvolumes",
];
const ATTACHER_WATCHES: &[&str] = &["volumeattachments"];
/// How often the start-up wait looks at the audit trail.
const READY_POLL: Duration = Duration::from_millis(50);
/// The settle phase's own limit beyond `settle` (a process may take a moment to be sampled).
const SETTLE_SLACK: Duration = Duration::from_secs(30);

fn io(op: String) -> impl FnOnce(std::io::Error) -> Error {
    move |source| Error::Io { op, source }
}

fn since(start: Instant, at: Option<Instant>) -> Option<f64> {
    at.and_then(|t| t.checked_duration_since(start))
        .map(|d| d.as_secs_f64())
}

fn progress(a: &Attached, pods: usize) -> String {
    format!(
        "{} of {pods} volumes in volumesAttached, {} other entries, node watch synced: {}",
        a.listed, a.unexpected, a.synced
    )
}

/// The audit records from `from` on (the trail is bounded; an index past its end is empty).
fn from(audit: &[AuditRecord], from: usize) -> &[AuditRecord] {
    audit.get(from..).unwrap_or_default()
}

fn startup_progress(
    world: &World,
    mark: usize,
    parties: &Parties<Party>,
    attacher: bool,
) -> String {
    let audit = world.audit();
    let records = from(&audit, mark);
    let mut waiting = vec![(ADC.to_owned(), Party::Adc, ADC_WATCHES)];
    if attacher {
        // Named with its User-Agent prefix: a renamed binary shows here first.
        let name = format!(
            "{ATTACHER} (User-Agent {}...)",
            parties.prefix_of(Party::Attacher).unwrap_or_default()
        );
        waiting.push((name, Party::Attacher, ATTACHER_WATCHES));
    }
    let missing: Vec<String> = waiting
        .into_iter()
        .filter_map(|(name, who, resources)| {
            let m = parties.missing_watches(records, who, resources);
            (!m.is_empty()).then(|| format!("{name} on {}", m.join(", ")))
        })
        .collect();
    if missing.is_empty() {
        String::new()
    } else {
        format!("no watch yet: {}", missing.join("; "))
    }
}

fn component(
    bin: &Path,
    args: Vec<String>,
    stats: ProcessStats,
    who: Party,
    whole: &Tally<Party>,
    until: &Tally<Party>,
) -> Component {
    Component {
        bin: bin.display().to_string(),
        args,
        user_agents: whole.agents_of(who),
        writes: whole.of(who),
        writes_until_done: until.of(who),
        peak_rss_bytes: stats.peak_rss_bytes,
        cpu_seconds: stats.cpu.map(|d| d.as_secs_f64()),
    }
}

pub(crate) async fn run_one(
    config: &LoadConfig,
    scenario: Scenario,
) -> Result<ScenarioReport, Error> {
    let mut world =
        World::start("csi-bench-adc-", None, config.log_dir.clone(), USER_AGENT).await?;
    let client = world.kube.clone();
    let mock_config = csi_mock::MockConfig {
        delay: config.mock_delay,
        ..csi_mock::MockConfig::default()
    };
    let driver = mock_config.name.clone();
    let attacher_bin = config
        .attacher_bin
        .as_deref()
        .filter(|_| scenario.attach_required());
    let mock = match attacher_bin {
        Some(_) => Some(csi_mock::start(world.root(), mock_config).await?),
        None => None,
    };

    // 1. setup
    let setup_started = Instant::now();
    let objects = Objects {
        client: client.clone(),
        scenario,
        driver: &driver,
        pods: config.pods,
        nodes: config.nodes,
        parallelism: config.parallelism,
        own: crate::harness::objects::OwnWrites::new(scenario.to_string()),
    };
    let timed_out = |phase: &str, progress: String| {
        Error::timeout(format!("{scenario}: {phase}"), progress, String::new())
    };
    tokio::time::timeout(config.timeout, async {
        objects.create_cluster().await?;
        objects.create_volumes().await
    })
    .await
    .map_err(|_| timed_out("setup", "creating the objects".into()))??;
    let tracker = AttachedTracker::spawn(
        Api::all(client.clone()),
        &format!("{LOAD_LABEL}={LOAD_LABEL_VALUE}"),
        run_objects::expected(&driver, config.pods, config.nodes),
    );
    tokio::time::timeout(config.timeout, tracker.until(|a| a.synced))
        .await
        .map_err(|_| timed_out("setup", "the node watch never synced".into()))?;
    let setup_seconds = setup_started.elapsed().as_secs_f64();
    tracing::info!(%scenario, seconds = setup_seconds, "objects created");

    // 2. start-up
    let log = |name: &str| world.log(&format!("{scenario}-{name}"));
    let metrics_addr =
        metrics::free_port().map_err(io("picking a port for the ADC's metrics".into()))?;
    let mut adc_args = vec![
        format!("--kubeconfig={}", world.kubeconfig.display()),
        format!("--skip-attach={}", scenario.skip_attach()),
        "--reconciler-sync-period=100ms".to_owned(),
        format!("--http-endpoint={metrics_addr}"),
    ];
    adc_args.extend(config.adc_args.iter().cloned());
    let mut parties = Parties::new(USER_AGENT, Party::Adc);
    if let Some(bin) = attacher_bin {
        parties = parties.with_binary(bin, Party::Attacher);
    }
    let mark_start = world.audit_len();
    let started = Instant::now();
    let adc = Child::spawn(ADC, &config.adc_bin, &adc_args, &[], &log("adc"))?;
    let mut attacher_args = Vec::new();
    let attacher = match (attacher_bin, &mock) {
        (Some(bin), Some(mock)) => {
            attacher_args = vec![
                format!("--kubeconfig={}", world.kubeconfig.display()),
                format!("--csi-address={}", mock.endpoint()),
                "--v=2".to_owned(),
            ];
            attacher_args.extend(config.attacher_args.iter().cloned());
            Some(Child::spawn(
                ATTACHER,
                bin,
                &attacher_args,
                &[],
                &log("attacher"),
            )?)
        }
        _ => None,
    };
    let mut running = Running {
        scenario,
        adc,
        attacher,
    };
    let with_attacher = running.attacher.is_some();
    running
        .during(
            "start-up",
            started + config.timeout,
            || startup_progress(&world, mark_start, &parties, with_attacher),
            async {
                while !startup_progress(&world, mark_start, &parties, with_attacher).is_empty() {
                    tokio::time::sleep(READY_POLL).await;
                }
                Ok(())
            },
        )
        .await?;
    let startup_seconds = started.elapsed().as_secs_f64();
    tracing::info!(%scenario, seconds = startup_seconds, "processes ready");

    // 3. the timed phase
    let t0 = Instant::now();
    let deadline = t0 + config.timeout;
    let pods = config.pods;
    running
        .during(
            "pod creation",
            deadline,
            || progress(&tracker.now(), pods),
            objects.create_pods(),
        )
        .await?;
    let pods_created_seconds = t0.elapsed().as_secs_f64();
    if scenario.lists_volumes() {
        running
            .during(
                "attach",
                deadline,
                || progress(&tracker.now(), pods),
                async {
                    tracker.until(|a| a.all_at.is_some()).await;
                    Ok(())
                },
            )
            .await?;
    }
    let done = tracker.now();
    tracing::info!(%scenario, seconds = ?since(t0, done.all_at), "all listed");
    let mark_done = world.audit_len();

    // 4. settle
    let settle_started = Instant::now();
    running
        .during(
            "settle",
            settle_started + config.settle + SETTLE_SLACK,
            String::new,
            async {
                tokio::time::sleep(config.settle).await;
                Ok(())
            },
        )
        .await?;
    let settle_seconds = settle_started.elapsed().as_secs_f64();

    // 5. the end
    let adc_metrics = metrics::scrape(metrics_addr).await.unwrap_or_else(|e| {
        tracing::warn!(%scenario, error = %e, "no ADC metrics in the report");
        Default::default()
    });
    let vas = Api::<VolumeAttachment>::all(client.clone())
        .list(&Default::default())
        .await
        .map_err(|source| Error::Kube {
            op: format!("{scenario}: listing the VolumeAttachments"),
            source,
        })?
        .items;
    let end = tracker.now();
    drop(tracker);
    let (adc_stats, attacher_stats) = running.stop().await;
    let audit = world.audit();
    if audit.len() >= 1_000_000 {
        tracing::warn!("the audit trail reached its limit; write counts are incomplete");
    }
    let whole = parties.tally(from(&audit, mark_start));
    let until = parties.tally(audit.get(mark_start..mark_done).unwrap_or_default());
    let own_seen = parties.tally(&audit).own.total;
    let va_names = run_objects::va_names(&driver, config.pods, config.nodes);

    let report = ScenarioReport {
        scenario,
        attach_required: scenario.attach_required(),
        skip_attach: scenario.skip_attach().to_owned(),
        setup_seconds,
        startup_seconds,
        pods_created_seconds,
        first_listed_seconds: since(t0, done.first_at),
        all_listed_seconds: since(t0, done.all_at),
        settle_seconds,
        volumes_listed: end.listed,
        unexpected_listed: end.unexpected,
        volume_attachments: vas.len(),
        volume_attachments_attached: vas
            .iter()
            .filter(|v| v.status.as_ref().is_some_and(|s| s.attached))
            .count(),
        volume_attachments_named_right: vas
            .iter()
            .filter(|v| {
                v.metadata
                    .name
                    .as_ref()
                    .is_some_and(|n| va_names.contains_key(n))
            })
            .count(),
        adc: component(
            &config.adc_bin,
            adc_args,
            adc_stats,
            Party::Adc,
            &whole,
            &until,
        ),
        attacher: match (attacher_bin, attacher_stats) {
            (Some(bin), Some(stats)) => Some(component(
                bin,
                attacher_args,
                stats,
                Party::Attacher,
                &whole,
                &until,
            )),
            _ => None,
        },
        adc_metrics,
        csi_publish_calls: mock
            .as_ref()
            .map(|m| m.calls_of(csi_mock::Method::ControllerPublishVolume).len() as u64),
        own_writes: objects.writes(),
        own_writes_seen: own_seen,
    };
    if let Some(m) = mock {
        m.shutdown().await;
    }
    world.shutdown().await;
    Ok(report)
}
