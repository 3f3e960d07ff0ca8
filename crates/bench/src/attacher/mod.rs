//! Load for any CSI attacher (ours, `csi-attacher`, or the Go external-attacher: they take the
//! same flags): N PersistentVolumes + VolumeAttachments on the embedded API server, against a
//! driver socket, measuring
//!
//! - the time until every VolumeAttachment is attached, then detached (gone, finalizer removed),
//!   then every PV gone (the attacher's PV finalizer removed), each seen through a watch;
//! - the attacher's API writes per phase, by request, attributed by User-Agent from the API
//!   server's audit trail (everything the benchmark does itself carries its own User-Agent);
//! - the attacher process's peak RSS (VmHWM) and CPU time.
//!
//! [`run`] does it all and returns a [`Report`]; `csi-bench attacher` ([`cli`]) prints it as a
//! table or JSON. `docs/csi-bench/attacher.md` has usage and an example.

pub mod cli;
mod driver;
mod report;
mod run_objects;
mod wait;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::Api;

pub use report::{CsiCalls, Phase, Report};

use crate::Error;
use crate::harness::child::Child;
use crate::harness::world::World;
use crate::harness::writes::Parties;

/// The one party of this benchmark besides itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Attacher;
use report::per;
use run_objects::{LOAD_LABEL, LOAD_LABEL_VALUE, Objects, OwnWrites};
use wait::Tracker;

/// The User-Agent of the benchmark's own API requests.
pub const USER_AGENT: &str = concat!("csi-bench-attacher/", env!("CARGO_PKG_VERSION"));

/// What to run: the `csi-bench attacher` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct LoadConfig {
    /// The attacher binary to load. It gets `--kubeconfig=FILE --csi-address=ADDR --v=2`, then
    /// every --attacher-arg.
    #[arg(long)]
    pub attacher_bin: PathBuf,
    /// An extra argument for the attacher (repeat for more), e.g. --attacher-arg=--worker-threads=50.
    #[arg(long = "attacher-arg", allow_hyphen_values = true)]
    pub attacher_args: Vec<String>,
    /// The CSI driver socket (unix:///path or a path). Default: a built-in csi-mock driver.
    #[arg(long)]
    pub csi_address: Option<String>,
    /// The driver name for spec.attacher and CSINode. Default: what GetPluginInfo answers
    /// (the built-in mock answers "mock.csi.rs", or this name when given).
    #[arg(long)]
    pub driver_name: Option<String>,
    /// PersistentVolumes and VolumeAttachments to create.
    #[arg(long, default_value_t = 1000)]
    pub count: usize,
    /// Nodes (each with a CSINode); VolumeAttachments are spread round robin.
    #[arg(long, default_value_t = 10)]
    pub nodes: usize,
    /// Limit for each phase (setup, attach, detach, PV delete), e.g. 30m, 90s.
    #[arg(long, default_value = "30m", value_parser = component_runtime::parse_go_duration)]
    pub timeout: Duration,
    /// API creates and deletes in flight at once.
    #[arg(long, default_value_t = 32)]
    pub parallelism: usize,
    /// Delay the built-in mock adds to every ControllerPublish/Unpublish, e.g. 10ms.
    #[arg(long, default_value = "0s", value_parser = component_runtime::parse_go_duration)]
    pub mock_delay: Duration,
    /// Keep the attacher's output in this file (default: a temp file removed afterwards).
    #[arg(long)]
    pub attacher_log: Option<PathBuf>,
}

impl Default for LoadConfig {
    fn default() -> Self {
        crate::harness::cli::defaults(&["--attacher-bin=csi-attacher"])
    }
}

fn va_attached(va: &VolumeAttachment) -> bool {
    va.status.as_ref().is_some_and(|s| s.attached)
}

fn always(_: &PersistentVolume) -> bool {
    true
}

/// Runs the load once. The attacher, the API server, the built-in mock and the temp dir are
/// stopped and removed on every way out, errors included.
pub async fn run(config: LoadConfig) -> Result<Report, Error> {
    if config.count == 0 || config.nodes == 0 || config.parallelism == 0 {
        return Err(Error::Config(
            "count, nodes and parallelism must be at least 1".into(),
        ));
    }
    let mut world = World::start("csi-bench-attacher-", None, None, USER_AGENT).await?;
    let client = world.kube.clone();
    let driver = driver::prepare(
        config.csi_address.as_deref(),
        config.driver_name.as_deref(),
        config.mock_delay,
        world.root(),
    )
    .await?;
    tracing::info!(driver = %driver.name, endpoint = %driver.endpoint, api = world.server()?.url(), "set up");

    let own = OwnWrites::default();
    let objects = Objects {
        client: client.clone(),
        driver: &driver.name,
        count: config.count,
        nodes: config.nodes,
        parallelism: config.parallelism,
        own: &own,
    };
    let n = config.count;
    let setup_started = Instant::now();
    let setup_deadline = setup_started + config.timeout;
    objects.create_nodes().await?;
    objects.create_volumes().await?;
    let selector = format!("{LOAD_LABEL}={LOAD_LABEL_VALUE}");
    let mut vas = Tracker::spawn(
        Api::<VolumeAttachment>::all(client.clone()),
        "volumeattachments",
        &selector,
        va_attached,
    );
    let mut pvs = Tracker::spawn(
        Api::<PersistentVolume>::all(client.clone()),
        "persistentvolumes",
        &selector,
        always,
    );
    // Both watches hold every object before the clock starts.
    vas.wait(
        "setup",
        |c| c.synced && c.existing == n,
        None,
        setup_deadline,
    )
    .await?;
    pvs.wait(
        "setup",
        |c| c.synced && c.existing == n,
        None,
        setup_deadline,
    )
    .await?;
    let setup_seconds = setup_started.elapsed().as_secs_f64();
    tracing::info!(
        count = n,
        nodes = config.nodes,
        seconds = setup_seconds,
        "objects created"
    );

    let log = config
        .attacher_log
        .clone()
        .unwrap_or_else(|| world.log("attacher"));
    let mut args = vec![
        format!("--kubeconfig={}", world.kubeconfig.display()),
        format!("--csi-address={}", driver.endpoint),
        "--v=2".to_owned(),
    ];
    args.extend(config.attacher_args.iter().cloned());
    let mut marks = vec![world.audit_len()];

    let mut attacher = Child::spawn("attacher", &config.attacher_bin, &args, &[], &log)?;
    let started = Instant::now();
    vas.wait(
        "attach",
        |c| c.matching >= 1,
        Some(&mut attacher),
        started + config.timeout,
    )
    .await?;
    let first_attached_seconds = started.elapsed().as_secs_f64();
    vas.wait(
        "attach",
        |c| c.matching == n,
        Some(&mut attacher),
        started + config.timeout,
    )
    .await?;
    let attach_seconds = started.elapsed().as_secs_f64();
    marks.push(world.audit_len());
    tracing::info!(seconds = attach_seconds, "all attached");

    let started = Instant::now();
    objects.delete_vas().await?;
    vas.wait(
        "detach",
        |c| c.existing == 0,
        Some(&mut attacher),
        started + config.timeout,
    )
    .await?;
    let detach_seconds = started.elapsed().as_secs_f64();
    marks.push(world.audit_len());
    tracing::info!(seconds = detach_seconds, "all detached");

    let started = Instant::now();
    objects.delete_pvs().await?;
    pvs.wait(
        "pv delete",
        |c| c.existing == 0,
        Some(&mut attacher),
        started + config.timeout,
    )
    .await?;
    let pv_seconds = started.elapsed().as_secs_f64();
    tracing::info!(seconds = pv_seconds, "all PVs deleted");

    let stats = attacher.stop().await;
    drop((vas, pvs));
    let audit = world.audit();
    marks.push(audit.len());
    if audit.len() >= 1_000_000 {
        tracing::warn!("the audit trail reached its limit; write counts are incomplete");
    }
    // Nothing but the attacher and this benchmark talks to the server: every write not ours is
    // the attacher's, whatever it calls itself.
    let parties = Parties::new(USER_AGENT, Attacher);
    let slice = |i: usize| {
        let from = marks[i].min(audit.len());
        let to = marks
            .get(i + 1)
            .copied()
            .unwrap_or(audit.len())
            .min(audit.len());
        parties.tally(&audit[from..to.max(from)])
    };
    let (t_attach, t_detach, t_pv, t_after) = (slice(0), slice(1), slice(2), slice(3));
    let whole = parties.tally(&audit);

    let csi_calls = driver.mock.as_ref().map(|m| {
        use csi_mock::Method;
        let count = |method, ok: bool| {
            m.calls_of(method)
                .iter()
                .filter(|c| (c.code == tonic::Code::Ok) == ok)
                .count() as u64
        };
        CsiCalls {
            publish: count(Method::ControllerPublishVolume, true)
                + count(Method::ControllerPublishVolume, false),
            publish_failed: count(Method::ControllerPublishVolume, false),
            unpublish: count(Method::ControllerUnpublishVolume, true)
                + count(Method::ControllerUnpublishVolume, false),
            unpublish_failed: count(Method::ControllerUnpublishVolume, false),
            list_volumes: m.calls_of(Method::ListVolumes).len() as u64,
            left_published: m.published().len() as u64,
        }
    });

    let report = Report {
        attacher_bin: config.attacher_bin.display().to_string(),
        attacher_args: config.attacher_args.clone(),
        attacher_user_agents: whole.agents_of(Attacher),
        driver: driver.name.clone(),
        csi_address: driver.endpoint.clone(),
        builtin_mock: driver.mock.is_some(),
        count: n,
        nodes: config.nodes,
        setup_seconds,
        first_attached_seconds,
        va_writes_per_attach: per(t_attach.of(Attacher).to_resource("volumeattachments"), n),
        pv_writes_per_attach: per(t_attach.of(Attacher).to_resource("persistentvolumes"), n),
        writes_per_attach: per(t_attach.of(Attacher).total, n),
        writes_per_detach: per(t_detach.of(Attacher).total, n),
        writes_per_pv_delete: per(t_pv.of(Attacher).total, n),
        attach: Phase {
            seconds: attach_seconds,
            writes: t_attach.of(Attacher),
        },
        detach: Phase {
            seconds: detach_seconds,
            writes: t_detach.of(Attacher),
        },
        pv_delete: Phase {
            seconds: pv_seconds,
            writes: t_pv.of(Attacher),
        },
        attacher_writes: report::sum([
            &t_attach.of(Attacher),
            &t_detach.of(Attacher),
            &t_pv.of(Attacher),
            &t_after.of(Attacher),
        ]),
        after: t_after.of(Attacher),
        own_writes: own.total(),
        own_writes_seen: whole.own.total,
        peak_rss_bytes: stats.peak_rss_bytes,
        cpu_seconds: stats.cpu.map(|d| d.as_secs_f64()),
        csi_calls,
        attacher_log: log.display().to_string(),
    };

    if let Some(mock) = driver.mock {
        mock.shutdown().await;
    }
    world.shutdown().await;
    Ok(report)
}
