//! The schedule: one random operation per tick on a running cluster, the invariant checks
//! between them, then settling and the final clean-up.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use csi_spec::faults::{Fault, FaultPlan, When};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use tonic::Code;

use super::check::{self, Checker};
use super::{ChaosFlags, Report, Sabotage, SplitMix64};
use crate::{Error, HOSTPATH_DRIVER, RunningCluster, UpConfig};

/// The label that marks the schedule's pods, with the claim slot as its value.
const SLOT_LABEL: &str = "chaos.csi.rs/slot";
/// The file written through each pod.
const FILE: &str = "chaos.dat";
/// How often the API, the mount table and the backing files are checked.
const CHECK_EVERY: Duration = Duration::from_secs(1);
/// How often ec2-sim's attachment record is read (it is copied whole).
const HISTORY_EVERY: Duration = Duration::from_secs(2);

const CSI_METHODS: &[&str] = &[
    "NodeStageVolume",
    "NodePublishVolume",
    "NodeUnpublishVolume",
    "NodeUnstageVolume",
    "ControllerPublishVolume",
    "ControllerUnpublishVolume",
    "CreateVolume",
    "DeleteVolume",
];
/// Timeouts, a driver down, and the codes a driver answers under load or misuse.
const CSI_CODES: &[Code] = &[
    Code::DeadlineExceeded,
    Code::Unavailable,
    Code::Aborted,
    Code::ResourceExhausted,
    Code::Internal,
    Code::FailedPrecondition,
];
const EC2_ACTIONS: &[&str] = &[
    "AttachVolume",
    "DetachVolume",
    "CreateVolume",
    "DeleteVolume",
    "DescribeVolumes",
];

/// Something to do later in the schedule.
#[derive(Debug, Clone)]
enum Later {
    Start(String),
    DeletePod(String),
    ClearCsiDelay(String),
    ClearEc2Latency(String),
}

/// The schedule's state.
struct World<'a> {
    cluster: &'a mut RunningCluster,
    client: Client,
    plan: FaultPlan,
    rng: SplitMix64,
    seed: u64,
    claims: usize,
    nodes: Vec<String>,
    checker: Checker,
    report: Report,
    later: Vec<(Instant, Later)>,
    /// Components that may be killed (the fault proxies are the test's own).
    killable: Vec<String>,
    down: BTreeSet<String>,
    ec2_faults: ec2_sim::Faults,
    pod_seq: u64,
    /// Claim UID → the content last written through a pod of that claim.
    expected: BTreeMap<String, Vec<u8>>,
    /// Pods whose file was checked and written since they became Ready.
    verified: BTreeSet<String>,
    /// Every EBS volume a PV named, for the final leak check.
    ebs_volumes: BTreeSet<String>,
    /// PV name → EBS volume ID, as last listed.
    pv_handles: BTreeMap<String, String>,
    kills: u64,
    flips: u64,
    ec2_armed: u64,
    /// `--sabotage` not done yet.
    sabotage: Vec<Sabotage>,
    /// A sabotage was just done: check before the schedule's next operation can remove what
    /// it broke (a pod deleted right after its volume was unmounted under it).
    check_now: bool,
    /// The claim (UID) whose file `Sabotage::Corrupt` overwrote, until the data check has read
    /// it back. A claim deleted first takes the chance away: the sabotage is armed again.
    corrupted: Option<String>,
    /// The claim (UID) whose EC2 volume `Sabotage::DeleteVolume` removed, until a check has
    /// reported it. A check that could not look (an API error) or a claim deleted first leave
    /// it unseen: the check runs again on every pass, and a claim gone unseen arms the
    /// sabotage again.
    volume_deleted: Option<String>,
}

pub(super) async fn run(
    flags: &ChaosFlags,
    seed: u64,
    stop: tokio_util::sync::CancellationToken,
) -> Result<Report, Error> {
    let (dir, temp) = match &flags.data_dir {
        Some(d) => {
            std::fs::create_dir_all(d).map_err(|e| Error::io("creating the data dir", d, e))?;
            (d.clone(), None)
        }
        None => {
            let t = tempfile::Builder::new()
                .prefix("csi-chaos-")
                .tempdir_in("/var/tmp")
                .map_err(|e| Error::io("creating a temp dir in", "/var/tmp", e))?;
            (t.path().to_path_buf(), Some(t))
        }
    };
    eprintln!(
        "chaos: seed {seed}, {} nodes, {} claims, {}s; data dir {}",
        flags.nodes,
        flags.claims,
        flags.duration.as_secs(),
        dir.display()
    );
    let plan = FaultPlan::new();
    let mut config = UpConfig::new(flags.nodes, &dir);
    config.zones = 1;
    config.hostpath_attach_required = true;
    config.csi_faults = Some(plan.clone());
    config.port = Some(0);
    let mut cluster = RunningCluster::start(config).await?;
    let result = async {
        cluster.wait_ready().await?;
        drive(&mut cluster, flags, seed, plan, stop).await
    }
    .await;
    let stopped = cluster.stop().await;
    let mut report = result?;
    stopped?;
    if let Some(t) = temp
        && !report.violations.is_empty()
    {
        // The logs explain the violation: keep them.
        let kept = t.keep();
        eprintln!("chaos: logs kept in {}", kept.join("logs").display());
        report.kept = Some(kept);
    }
    Ok(report)
}

async fn drive(
    cluster: &mut RunningCluster,
    flags: &ChaosFlags,
    seed: u64,
    plan: FaultPlan,
    stop: tokio_util::sync::CancellationToken,
) -> Result<Report, Error> {
    let start = Instant::now();
    let client = cluster.client()?;
    let killable = cluster
        .components()
        .into_iter()
        .filter(|c| !c.contains("fault proxy"))
        .collect();
    let nodes = cluster.node_names();
    let checker = Checker::new(start, cluster.data_dir());
    let mut w = World {
        cluster,
        client,
        plan,
        rng: SplitMix64::new(seed),
        seed,
        claims: flags.claims,
        nodes,
        checker,
        report: Report {
            seed,
            ..Report::default()
        },
        later: Vec::new(),
        killable,
        down: BTreeSet::new(),
        ec2_faults: ec2_sim::Faults::default(),
        pod_seq: 0,
        expected: BTreeMap::new(),
        verified: BTreeSet::new(),
        ebs_volumes: BTreeSet::new(),
        pv_handles: BTreeMap::new(),
        kills: 0,
        flips: 0,
        ec2_armed: 0,
        sabotage: flags.sabotage.clone(),
        check_now: false,
        corrupted: None,
        volume_deleted: None,
    };
    let end = start + flags.duration;
    let (mut next_check, mut next_history) = (start, start);
    let mut last_progress = start;
    while Instant::now() < end {
        if stop.is_cancelled() {
            eprintln!(
                "chaos: interrupted after {}s; settling and cleaning up",
                start.elapsed().as_secs()
            );
            w.report.interrupted = true;
            break;
        }
        w.run_due(false).await;
        if let Some((pods, claims)) = w.list().await {
            w.data(&pods, &claims).await;
            if std::mem::take(&mut w.check_now) {
                w.check(&pods, &claims).await;
            }
            w.operate(&pods, &claims).await;
            if Instant::now() >= next_check {
                w.check(&pods, &claims).await;
                // Every Ready pod's file is read back (and written anew) once per period.
                w.verified.clear();
                next_check = Instant::now() + CHECK_EVERY;
            }
        }
        if Instant::now() >= next_history {
            w.checker.ec2_history(w.cluster.ec2());
            next_history = Instant::now() + HISTORY_EVERY;
        }
        if last_progress.elapsed() >= Duration::from_secs(30) {
            last_progress = Instant::now();
            eprintln!(
                "chaos: {:>5}s {} ({} files written, {} read back)",
                start.elapsed().as_secs(),
                w.summary(),
                w.report.files_written,
                w.report.files_verified
            );
        }
        let pause = w.rng.millis(40, 200);
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = stop.cancelled() => {}
        }
    }
    eprintln!(
        "chaos: schedule done after {}s; settling",
        start.elapsed().as_secs()
    );
    w.settle(flags.settle).await;
    eprintln!("chaos: settled; deleting everything");
    w.delete_everything(flags.settle).await;
    w.checker.ec2_history(w.cluster.ec2());
    w.finish(start);
    Ok(w.report)
}

impl World<'_> {
    fn summary(&self) -> String {
        let mut r = self.report.clone();
        r.faults = self.faults();
        r.checks = self.checker.checks;
        r.violations = self.checker.violations.clone();
        r.summary()
    }

    fn faults(&self) -> u64 {
        self.plan.injected() + self.kills + self.flips + self.ec2_armed
    }

    fn finish(&mut self, start: Instant) {
        self.report.faults = self.faults();
        self.report.checks = self.checker.checks;
        self.report.violations = std::mem::take(&mut self.checker.violations);
        self.report.elapsed = start.elapsed();
        self.report.sabotage_left = self.sabotage.clone();
        if self.corrupted.is_some() {
            // Done, but never read back: the data check had no chance to see it.
            self.report.sabotage_left.push(Sabotage::Corrupt);
        }
        if self.volume_deleted.is_some() {
            // Done, but no check saw it: it had no chance to report it.
            self.report.sabotage_left.push(Sabotage::DeleteVolume);
        }
    }

    /// A sabotage done and not yet seen by its check.
    fn unseen_sabotage(&self) -> bool {
        self.corrupted.is_some() || self.volume_deleted.is_some()
    }

    /// Arms `kind` again when the claim it was done through went before its check saw it
    /// (the schedule deleted the claim first, taking the check's chance away).
    fn rearm_if_claim_gone(&mut self, kind: Sabotage, claims: &[PersistentVolumeClaim]) {
        let unseen = match kind {
            Sabotage::Corrupt => &mut self.corrupted,
            Sabotage::DeleteVolume => &mut self.volume_deleted,
            Sabotage::Unmount => return,
        };
        let Some(uid) = unseen.as_ref() else { return };
        if !claims.iter().any(|c| c.metadata.uid.as_ref() == Some(uid)) {
            eprintln!("chaos: the claim of sabotage {kind:?} went before its check saw it; again");
            *unseen = None;
            self.sabotage.insert(0, kind);
        }
    }

    fn bound_volume_gone_reports(&self) -> usize {
        self.checker
            .violations
            .iter()
            .filter(|v| v.invariant == check::BOUND_VOLUME_GONE)
            .count()
    }

    fn op(&mut self) {
        self.report.operations += 1;
    }

    async fn list(&self) -> Option<(Vec<Pod>, Vec<PersistentVolumeClaim>)> {
        let pods: Api<Pod> = Api::default_namespaced(self.client.clone());
        let claims: Api<PersistentVolumeClaim> = Api::default_namespaced(self.client.clone());
        let lp = ListParams::default().labels(SLOT_LABEL);
        let pods = pods.list(&lp).await.ok()?.items;
        let claims = claims.list(&ListParams::default()).await.ok()?.items;
        let claims = claims
            .into_iter()
            .filter(|c| {
                c.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with("chaos-"))
            })
            .collect();
        Some((pods, claims))
    }

    /// Runs what is due; `all`: everything, due or not.
    async fn run_due(&mut self, all: bool) {
        let now = Instant::now();
        let (due, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.later)
            .into_iter()
            .partition(|(at, _)| all || *at <= now);
        self.later = rest;
        for (_, what) in due {
            match what {
                Later::Start(c) => {
                    if let Err(e) = self.cluster.start_component(&c) {
                        tracing::warn!(component = %c, error = %e, "chaos: starting again");
                    }
                    self.down.remove(&c);
                }
                Later::DeletePod(p) => self.delete_pod(&p).await,
                Later::ClearCsiDelay(m) => self.plan.set_delay(&m, Duration::ZERO),
                Later::ClearEc2Latency(a) => {
                    self.ec2_faults.latency_ms.remove(&a);
                    self.cluster.ec2().set_faults(self.ec2_faults.clone());
                }
            }
        }
    }

    fn later(&mut self, after: Duration, what: Later) {
        self.later.push((Instant::now() + after, what));
    }

    /// One random operation.
    async fn operate(&mut self, pods: &[Pod], claims: &[PersistentVolumeClaim]) {
        match self.rng.below(100) {
            0..=64 => {
                let slot = self.rng.below(self.claims);
                self.workload(slot, pods, claims).await;
            }
            65..=71 => self.kill(),
            72..=83 => self.csi_fault(),
            84..=86 => self.csi_delay(),
            87..=96 => self.ec2_fault(),
            97 | 98 => {
                if self.rng.chance(0.3) {
                    self.flip_attach_required().await;
                }
            }
            _ => {
                if self.rng.chance(0.3) {
                    self.restart_api_server().await;
                }
            }
        }
    }

    async fn workload(&mut self, slot: usize, pods: &[Pod], claims: &[PersistentVolumeClaim]) {
        let name = claim_name(slot);
        let claim = claims
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(name.as_str()));
        let live: Vec<&Pod> = pods
            .iter()
            .filter(|p| slot_of(p) == Some(slot) && p.metadata.deletion_timestamp.is_none())
            .collect();
        let Some(claim) = claim else {
            self.create_claim(slot).await;
            return;
        };
        if claim.metadata.deletion_timestamp.is_some() {
            // Held by pvc-protection until its pods are gone.
            if let Some(p) = live.first()
                && self.rng.chance(0.5)
            {
                let p = pod_name(p);
                self.delete_pod(&p).await;
            }
            return;
        }
        let Some(pod) = live.first() else {
            if self.rng.chance(0.85) {
                let pod = self.create_pod(slot, None).await;
                // Deleted again soon: in the middle of attach, stage or publish.
                if let Some(pod) = pod
                    && self.rng.chance(0.2)
                {
                    let after = self.rng.millis(0, 1500);
                    self.later(after, Later::DeletePod(pod));
                }
            } else {
                self.delete_claim(slot).await;
            }
            return;
        };
        let ready = check::is_ready(pod);
        let age = pod
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(Duration::ZERO, |t| {
                let secs = jiff::Timestamp::now().duration_since(t.0).as_secs();
                Duration::from_secs(secs.max(0).unsigned_abs())
            });
        if !ready && age < Duration::from_secs(10) {
            if self.rng.chance(0.1) {
                let p = pod_name(pod);
                self.delete_pod(&p).await;
            }
            return;
        }
        let (p, from) = (pod_name(pod), check::node_of(pod));
        match self.rng.below(100) {
            // Move: the old pod terminating while the new one is placed elsewhere.
            0..=44 => {
                self.delete_pod(&p).await;
                self.create_pod(slot, Some(&from)).await;
            }
            45..=74 => self.delete_pod(&p).await,
            75..=84 => self.delete_claim(slot).await,
            _ => {}
        }
    }

    async fn create_claim(&mut self, slot: usize) {
        let class = if slot % 2 == 0 { "ebs-sc" } else { "hostpath" };
        let claim: PersistentVolumeClaim = match serde_json::from_value(json!({
            "metadata": {"name": claim_name(slot)},
            "spec": {
                "storageClassName": class,
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}}
            }
        })) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "chaos: claim body");
                return;
            }
        };
        let api: Api<PersistentVolumeClaim> = Api::default_namespaced(self.client.clone());
        if api.create(&PostParams::default(), &claim).await.is_ok() {
            self.op();
        }
    }

    async fn delete_claim(&mut self, slot: usize) {
        let api: Api<PersistentVolumeClaim> = Api::default_namespaced(self.client.clone());
        if api
            .delete(&claim_name(slot), &DeleteParams::default())
            .await
            .is_ok()
        {
            self.op();
        }
    }

    /// A pod of `slot`; an EBS claim's pod is held to a random node other than `not_on`
    /// (hostpath volumes live on one node: the scheduler places those).
    async fn create_pod(&mut self, slot: usize, not_on: Option<&str>) -> Option<String> {
        self.pod_seq += 1;
        let name = format!("chaos-{slot}-{}", self.pod_seq);
        let mut spec = json!({
            "containers": [{
                "name": "app",
                "image": "busybox",
                "volumeMounts": [{"name": "data", "mountPath": "/data"}]
            }],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim_name(slot)}}]
        });
        if slot % 2 == 0 {
            let choices: Vec<&String> = self
                .nodes
                .iter()
                .filter(|n| Some(n.as_str()) != not_on)
                .collect();
            let node = (*self.rng.pick(&choices)).clone();
            spec["nodeSelector"] = json!({"kubernetes.io/hostname": node});
        }
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {SLOT_LABEL: slot.to_string()}},
            "spec": spec
        }))
        .ok()?;
        let api: Api<Pod> = Api::default_namespaced(self.client.clone());
        api.create(&PostParams::default(), &pod).await.ok()?;
        self.op();
        Some(name)
    }

    async fn delete_pod(&mut self, name: &str) {
        let api: Api<Pod> = Api::default_namespaced(self.client.clone());
        if api.delete(name, &DeleteParams::default()).await.is_ok() {
            self.op();
        }
    }

    fn kill(&mut self) {
        let up: Vec<String> = self
            .killable
            .iter()
            .filter(|c| !self.down.contains(*c))
            .cloned()
            .collect();
        if up.is_empty() {
            return;
        }
        let c = self.rng.pick(&up).clone();
        if self.cluster.kill(&c).is_ok() {
            self.down.insert(c.clone());
            self.kills += 1;
            self.op();
            let after = self.rng.millis(200, 4000);
            self.later(after, Later::Start(c));
        }
    }

    /// apiserver-lite stopped and started again from its data dir: every watch breaks.
    async fn restart_api_server(&mut self) {
        match self.cluster.restart_api_server().await {
            Ok(()) => {
                self.kills += 1;
                self.op();
            }
            Err(e) => tracing::warn!(error = %e, "chaos: restarting apiserver-lite"),
        }
        if let Ok(c) = self.cluster.client() {
            self.client = c;
        }
    }

    fn csi_fault(&mut self) {
        let method = self.rng.pick(CSI_METHODS).to_string();
        let code = *self.rng.pick(CSI_CODES);
        let when = if self.rng.chance(0.5) {
            When::Before
        } else {
            When::After
        };
        let count = 1 + self.rng.below(3) as u32;
        self.plan.add(Fault {
            method,
            code,
            when,
            count,
        });
        self.op();
    }

    fn csi_delay(&mut self) {
        let method = self.rng.pick(&CSI_METHODS[..5]).to_string();
        let delay = self.rng.millis(200, 2000);
        self.plan.set_delay(&method, delay);
        self.op();
        let after = self.rng.millis(2000, 8000);
        self.later(after, Later::ClearCsiDelay(method));
    }

    fn ec2_fault(&mut self) {
        let action = self.rng.pick(EC2_ACTIONS).to_string();
        if self.rng.chance(0.7) {
            let next = 1 + self.rng.below(4) as u64;
            self.ec2_faults
                .throttle
                .retain(|t| t.next > 0 || t.rate > 0.0);
            self.ec2_faults.throttle.push(ec2_sim::Throttle {
                action: Some(action),
                rate: 0.0,
                next,
            });
            self.ec2_armed += next;
        } else {
            let ms = self.rng.millis(100, 1500).as_millis() as u64;
            self.ec2_faults.latency_ms.insert(action.clone(), ms);
            self.ec2_armed += 1;
            let after = self.rng.millis(2000, 8000);
            self.later(after, Later::ClearEc2Latency(action));
        }
        self.cluster.ec2().set_faults(self.ec2_faults.clone());
        self.op();
    }

    /// Replaces the hostpath CSIDriver with `attachRequired` flipped (the field is immutable).
    async fn flip_attach_required(&mut self) {
        let api: Api<CSIDriver> = Api::all(self.client.clone());
        let Ok(Some(d)) = api.get_opt(HOSTPATH_DRIVER).await else {
            return;
        };
        let mut spec = d.spec.clone();
        let now = spec.attach_required.unwrap_or(true);
        spec.attach_required = Some(!now);
        if api
            .delete(HOSTPATH_DRIVER, &DeleteParams::default())
            .await
            .is_err()
        {
            return;
        }
        let fresh = CSIDriver {
            metadata: kube::api::ObjectMeta {
                name: Some(HOSTPATH_DRIVER.to_string()),
                ..Default::default()
            },
            spec,
        };
        // Between the delete and the create the driver has no CSIDriver (attach required).
        for _ in 0..20 {
            if api.create(&PostParams::default(), &fresh).await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tracing::info!(attach_required = !now, "chaos: hostpath CSIDriver replaced");
        self.flips += 1;
        self.op();
    }

    /// Every Ready pod not looked at yet: the file its claim's last pod wrote must be there;
    /// then a new one is written.
    async fn data(&mut self, pods: &[Pod], claims: &[PersistentVolumeClaim]) {
        self.rearm_if_claim_gone(Sabotage::Corrupt, claims);
        for pod in pods.iter().filter(|p| check::is_ready(p)) {
            let Some(uid) = pod.metadata.uid.clone() else {
                continue;
            };
            if self.verified.contains(&uid) {
                continue;
            }
            let Some(slot) = slot_of(pod) else { continue };
            let Some(claim) = claims
                .iter()
                .find(|c| c.metadata.name.as_deref() == Some(claim_name(slot).as_str()))
            else {
                continue;
            };
            let Some(claim_uid) = claim.metadata.uid.clone() else {
                continue;
            };
            let Some(path) = check::volume_paths(pod)
                .into_iter()
                .find_map(|(v, p)| (v == "data").then_some(p))
            else {
                continue;
            };
            if !check::mount_points().contains(&path) {
                // The mount check reports this one if the pod is still Ready.
                continue;
            }
            let file = path.join(FILE);
            if let Some(want) = self.expected.get(&claim_uid).cloned() {
                self.checker.checks += 1;
                if self.corrupted.as_ref() == Some(&claim_uid) {
                    self.corrupted = None;
                }
                let got = std::fs::read(&file);
                if got.as_ref().is_ok_and(|g| *g == want) {
                    self.report.files_verified += 1;
                } else if self.still_ready_and_mounted(pod, &path).await {
                    let what = match got {
                        Ok(g) => {
                            format!("{} bytes that are not the {} written", g.len(), want.len())
                        }
                        Err(e) => e.to_string(),
                    };
                    let detail = format!(
                        "claim {} through pod {} on {}: {}: {what}",
                        claim_name(slot),
                        pod_name(pod),
                        check::node_of(pod),
                        file.display()
                    );
                    self.checker.violate(check::DATA, detail);
                } else {
                    continue;
                }
            }
            self.verified.insert(uid.clone());
            let content = self.content(&claim_uid);
            if write_synced(&file, &content).is_ok()
                && self.still_ready_and_mounted(pod, &path).await
            {
                self.expected.insert(claim_uid.clone(), content);
                self.report.files_written += 1;
                self.sabotage(slot, &path, &file, claim);
                if self.corrupted.as_ref() == Some(&claim_uid) {
                    // Read it back through this pod on the next pass, not only when a later
                    // pod of the claim is Ready: the schedule may delete the claim first.
                    self.verified.remove(&uid);
                }
            } else {
                // Whether it reached the volume is unknown: nothing to expect.
                self.expected.remove(&claim_uid);
            }
        }
    }

    /// `--sabotage`: breaks what the checks guard, once each.
    fn sabotage(&mut self, slot: usize, path: &Path, file: &Path, claim: &PersistentVolumeClaim) {
        let Some(kind) = self.sabotage.first().copied() else {
            return;
        };
        let done = match kind {
            Sabotage::Unmount => std::process::Command::new("umount")
                .arg("-l")
                .arg(path)
                .status()
                .is_ok_and(|s| s.success()),
            Sabotage::Corrupt => {
                let done = write_synced(file, b"not what was written").is_ok();
                if done {
                    self.corrupted = claim.metadata.uid.clone();
                }
                done
            }
            Sabotage::DeleteVolume => {
                let Some(handle) = claim
                    .spec
                    .as_ref()
                    .and_then(|s| s.volume_name.clone())
                    .filter(|_| slot % 2 == 0)
                    .and_then(|pv| self.pv_handles.get(&pv).cloned())
                else {
                    return;
                };
                let img = self
                    .cluster
                    .data_dir()
                    .join("ec2")
                    .join("volumes")
                    .join(format!("{handle}.img"));
                let done = std::fs::remove_file(img).is_ok();
                if done {
                    self.volume_deleted = claim.metadata.uid.clone();
                }
                done
            }
        };
        if done {
            eprintln!(
                "chaos: sabotage {kind:?} through claim {}",
                claim_name(slot)
            );
            self.sabotage.remove(0);
            self.check_now = true;
        }
    }

    async fn still_ready_and_mounted(&self, pod: &Pod, path: &Path) -> bool {
        let api: Api<Pod> = Api::default_namespaced(self.client.clone());
        let Ok(Some(now)) = api.get_opt(&pod_name(pod)).await else {
            return false;
        };
        now.metadata.uid == pod.metadata.uid
            && check::is_ready(&now)
            && check::mount_points().contains(path)
    }

    fn content(&mut self, claim_uid: &str) -> Vec<u8> {
        let n = self.report.files_written;
        let mut out =
            format!("chaos seed {} claim {claim_uid} write {n}\n", self.seed).into_bytes();
        let mut x = self.rng.next_u64();
        while out.len() < 64 * 1024 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            out.extend_from_slice(&x.to_le_bytes());
        }
        out
    }

    async fn check(&mut self, pods: &[Pod], claims: &[PersistentVolumeClaim]) {
        self.checker.ready_pods_mounted(&self.client, pods).await;
        let gone_before = self.bound_volume_gone_reports();
        self.checker
            .bound_claims_have_volumes(&self.client, claims)
            .await;
        if self.bound_volume_gone_reports() > gone_before {
            self.volume_deleted = None;
        }
        self.rearm_if_claim_gone(Sabotage::DeleteVolume, claims);
        if self.volume_deleted.is_some() {
            // Not seen yet (the check could not look): again on the next pass.
            self.check_now = true;
        }
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        if let Ok(l) = pvs.list(&ListParams::default()).await {
            for pv in &l.items {
                if let (Some(name), Some(h)) = (pv.metadata.name.clone(), check::ebs_handle(pv)) {
                    self.ebs_volumes.insert(h.clone());
                    self.pv_handles.insert(name, h);
                }
            }
        }
    }

    /// The faults stop and every component runs; then the cluster must reach a state where
    /// every pod is Ready and every claim Bound, and no mount is left that no pod wants.
    async fn settle(&mut self, patience: Duration) {
        self.plan.clear();
        self.ec2_faults = ec2_sim::Faults::default();
        self.cluster.ec2().set_faults(ec2_sim::Faults::default());
        self.later
            .retain(|(_, l)| !matches!(l, Later::DeletePod(_)));
        self.run_due(true).await;
        for c in self.cluster.components() {
            if !self.cluster.is_running(&c) {
                let _ = self.cluster.start_component(&c);
            }
        }
        self.ensure_csidriver().await;
        let deadline = Instant::now() + patience;
        let mut last = String::new();
        loop {
            if let Some((pods, claims)) = self.list().await {
                self.data(&pods, &claims).await;
                let stuck = stuck(&pods, &claims);
                // A sabotage not seen yet has its check run even while a pod is stuck (a pod
                // whose volume was deleted may never be Ready again).
                if std::mem::take(&mut self.check_now) || stuck.is_empty() {
                    self.check(&pods, &claims).await;
                }
                if stuck.is_empty() {
                    if self.sabotage.is_empty() && !self.unseen_sabotage() {
                        break;
                    }
                    // `--sabotage` left to do (a loaded machine gave it no chance in the
                    // schedule): every file is written again, each write a chance, and a
                    // slot the sabotage can act through gets a claim and a pod if the
                    // schedule left it without.
                    self.verified.clear();
                    self.offer_sabotage(&pods, &claims).await;
                    last = format!(
                        "sabotage {:?} not done yet (corrupted file read back: {}, deleted volume reported: {})",
                        self.sabotage,
                        self.corrupted.is_none(),
                        self.volume_deleted.is_none()
                    );
                } else {
                    last = stuck.join("; ");
                }
            }
            if Instant::now() >= deadline {
                self.checker.violate(
                    check::SETTLE,
                    format!("not settled after {}s: {last}", patience.as_secs()),
                );
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        // Teardown of what deleted pods used may still be finishing: strays must go in time.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (Some((pods, _)), Ok(pvs)) = (
                self.list().await,
                Api::<PersistentVolume>::all(self.client.clone())
                    .list(&ListParams::default())
                    .await,
            ) else {
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            };
            let mut probe = Checker::probe(Instant::now(), self.cluster.data_dir());
            probe.no_stray_mounts(self.cluster.data_dir(), &pods, &pvs.items);
            if probe.violations.is_empty() || Instant::now() >= deadline {
                self.checker.checks += probe.checks;
                for v in probe.violations {
                    self.checker.violate(v.invariant, v.detail);
                }
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        // Every file once more, now that nothing interferes, and the checks after it (a
        // sabotage done by this last write must be seen too).
        self.verified.clear();
        if let Some((pods, claims)) = self.list().await {
            self.data(&pods, &claims).await;
            self.check(&pods, &claims).await;
        }
    }

    /// Settling with `--sabotage` left: the schedule may have ended with no pod the next
    /// sabotage can act through (`DeleteVolume` needs an EBS claim, the even slots; every kind
    /// needs the pod's volume mounted, which an earlier `Unmount` took away). The first slot
    /// that fits gets what it lacks, one step per call: a claim, a pod, or, for a pod whose
    /// volume was unmounted under it, its deletion so that a fresh pod mounts it again (a
    /// claim being deleted is passed over, or its pod deleted if no other slot fits). Only
    /// called when nothing is stuck, so every live pod is Ready.
    async fn offer_sabotage(&mut self, pods: &[Pod], claims: &[PersistentVolumeClaim]) {
        let Some(kind) = self.sabotage.first().copied() else {
            return;
        };
        let mounted = check::mount_points();
        let live = |slot: usize| {
            pods.iter()
                .find(|p| slot_of(p) == Some(slot) && p.metadata.deletion_timestamp.is_none())
        };
        let usable = |p: &Pod| {
            check::volume_paths(p)
                .into_iter()
                .any(|(v, path)| v == "data" && mounted.contains(&path))
        };
        let claim_of = |slot: usize| {
            claims
                .iter()
                .find(|c| c.metadata.name.as_deref() == Some(claim_name(slot).as_str()))
        };
        let deleting =
            |slot: usize| claim_of(slot).is_some_and(|c| c.metadata.deletion_timestamp.is_some());
        let fits: Vec<usize> = (0..self.claims)
            .filter(|s| kind != Sabotage::DeleteVolume || s % 2 == 0)
            .collect();
        let slots: Vec<usize> = fits.iter().copied().filter(|s| !deleting(*s)).collect();
        if slots.iter().any(|s| live(*s).is_some_and(usable)) {
            return;
        }
        let Some(&slot) = slots.first() else {
            // Every slot that fits has its claim being deleted, held by pvc-protection for a
            // pod settling leaves alone: that pod goes, then the claim, then a new claim comes.
            if let Some(pod) = fits.iter().find_map(|s| live(*s)) {
                let name = pod_name(pod);
                eprintln!(
                    "chaos: pod {name} holds a claim being deleted; deleted for sabotage {kind:?}"
                );
                self.delete_pod(&name).await;
            }
            return;
        };
        if claim_of(slot).is_none() {
            eprintln!("chaos: claim {} for sabotage {kind:?}", claim_name(slot));
            self.create_claim(slot).await;
        } else if let Some(pod) = live(slot) {
            let name = pod_name(pod);
            eprintln!("chaos: pod {name} lost its volume's mount; a new one for sabotage {kind:?}");
            self.delete_pod(&name).await;
        } else {
            eprintln!("chaos: a pod of {} for sabotage {kind:?}", claim_name(slot));
            self.create_pod(slot, None).await;
        }
    }

    async fn ensure_csidriver(&self) {
        let api: Api<CSIDriver> = Api::all(self.client.clone());
        if let Ok(None) = api.get_opt(HOSTPATH_DRIVER).await {
            let d: Result<CSIDriver, _> = serde_json::from_value(json!({
                "metadata": {"name": HOSTPATH_DRIVER},
                "spec": {"attachRequired": true, "volumeLifecycleModes": ["Persistent", "Ephemeral"]}
            }));
            if let Ok(d) = d {
                let _ = api.create(&PostParams::default(), &d).await;
            }
        }
    }

    /// Deletes every pod and claim of the schedule; nothing may be left: no PV, no
    /// VolumeAttachment, no EC2 volume, no CSI mount on any node.
    async fn delete_everything(&mut self, patience: Duration) {
        let pods: Api<Pod> = Api::default_namespaced(self.client.clone());
        let claims: Api<PersistentVolumeClaim> = Api::default_namespaced(self.client.clone());
        let deadline = Instant::now() + patience;
        let mut left = Vec::new();
        while Instant::now() < deadline {
            if let Some((ps, cs)) = self.list().await {
                for p in ps
                    .iter()
                    .filter(|p| p.metadata.deletion_timestamp.is_none())
                {
                    let _ = pods.delete(&pod_name(p), &DeleteParams::default()).await;
                }
                for c in cs
                    .iter()
                    .filter(|c| c.metadata.deletion_timestamp.is_none())
                {
                    if let Some(n) = &c.metadata.name {
                        let _ = claims.delete(n, &DeleteParams::default()).await;
                    }
                }
                left = self.leftovers(ps.len(), cs.len()).await;
                if left.is_empty() {
                    self.checker.checks += 1;
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        self.checker.checks += 1;
        self.checker.violate(
            check::LEAK,
            format!("after {}s: {}", patience.as_secs(), left.join("; ")),
        );
    }

    async fn leftovers(&self, pods: usize, claims: usize) -> Vec<String> {
        let mut left = Vec::new();
        if pods > 0 {
            left.push(format!("{pods} pods"));
        }
        if claims > 0 {
            left.push(format!("{claims} claims"));
        }
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        match pvs.list(&ListParams::default()).await {
            Ok(l) if !l.items.is_empty() => left.push(format!(
                "PVs {}",
                names(l.items.iter().map(|p| p.metadata.name.clone()))
            )),
            Ok(_) => {}
            Err(e) => left.push(format!("listing PVs: {e}")),
        }
        let vas: Api<VolumeAttachment> = Api::all(self.client.clone());
        match vas.list(&ListParams::default()).await {
            Ok(l) if !l.items.is_empty() => left.push(format!(
                "VolumeAttachments {}",
                names(l.items.iter().map(|p| p.metadata.name.clone()))
            )),
            Ok(_) => {}
            Err(e) => left.push(format!("listing VolumeAttachments: {e}")),
        }
        let volumes = self.cluster.data_dir().join("ec2").join("volumes");
        let ebs: Vec<&String> = self
            .ebs_volumes
            .iter()
            .filter(|v| volumes.join(format!("{v}.img")).exists())
            .collect();
        if !ebs.is_empty() {
            left.push(format!("EC2 volumes {ebs:?}"));
        }
        let nodes = self.cluster.data_dir().join("nodes");
        let mounts: Vec<PathBuf> = check::mount_points()
            .into_iter()
            .filter(|m| m.starts_with(&nodes) && m.to_string_lossy().contains("csi"))
            .collect();
        if !mounts.is_empty() {
            left.push(format!("mounts {mounts:?}"));
        }
        left
    }
}

/// What keeps the cluster from being settled: pods not Ready or being deleted, claims not
/// Bound (a claim being deleted with no pod left must go).
fn stuck(pods: &[Pod], claims: &[PersistentVolumeClaim]) -> Vec<String> {
    let mut out = Vec::new();
    let deleting: BTreeSet<&str> = claims
        .iter()
        .filter(|c| c.metadata.deletion_timestamp.is_some())
        .filter_map(|c| c.metadata.name.as_deref())
        .collect();
    for p in pods {
        // A pod whose claim is being deleted never starts ("PVC is being deleted"), as in
        // Kubernetes: waiting for it is right, not stuck.
        let claim_deleting = slot_of(p).is_some_and(|s| deleting.contains(claim_name(s).as_str()));
        if p.metadata.deletion_timestamp.is_some() {
            out.push(format!("pod {} being deleted", pod_name(p)));
        } else if !check::is_ready(p) && !claim_deleting {
            out.push(format!(
                "pod {} not Ready on {:?}",
                pod_name(p),
                check::node_of(p)
            ));
        }
    }
    for c in claims {
        let name = c.metadata.name.clone().unwrap_or_default();
        if c.metadata.deletion_timestamp.is_some() {
            let used = pods
                .iter()
                .any(|p| slot_of(p).is_some_and(|s| claim_name(s) == name));
            if !used {
                out.push(format!("claim {name} being deleted"));
            }
        } else if !check::is_bound(c)
            && pods
                .iter()
                .any(|p| slot_of(p).is_some_and(|s| claim_name(s) == name))
        {
            out.push(format!("claim {name} not Bound"));
        }
    }
    out
}

fn names(it: impl Iterator<Item = Option<String>>) -> String {
    it.flatten().collect::<Vec<_>>().join(", ")
}

fn write_synced(file: &Path, content: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::File::create(file)?;
    f.write_all(content)?;
    f.sync_all()
}

fn claim_name(slot: usize) -> String {
    format!("chaos-{slot}")
}

fn pod_name(p: &Pod) -> String {
    p.metadata.name.clone().unwrap_or_default()
}

fn slot_of(p: &Pod) -> Option<usize> {
    p.metadata.labels.as_ref()?.get(SLOT_LABEL)?.parse().ok()
}
