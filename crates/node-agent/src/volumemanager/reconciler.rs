//! The reconciler (the kubelet's volume manager reconciler): each pass compares the desired
//! and the actual state and starts what closes the gap, unmounts first:
//!
//! 1. a published volume no pod wants any more → NodeUnpublish;
//! 2. a staged volume no pod uses → NodeUnstage, then it leaves `volumesInUse` (only then may
//!    the attach/detach controller detach it);
//! 3. a wanted volume that is not published → once it is in `volumesInUse` and, if the
//!    attach/detach controller manages it, in `volumesAttached`: wait for attach, NodeStage,
//!    NodePublish.
//!
//! Operations on one volume never overlap; a failed one backs off exponentially (500 ms up to
//! 2m2s, the kubelet's). A volume that waits longer than `stuck_event_after` gets a
//! `FailedMount` Event naming the step and the cause.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use component_runtime::ObjectCache;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use tokio::sync::mpsc;
use volume_plugins::names::volume_attachment_name;

use super::cache::{
    ActualStateOfWorld, DesiredStateOfWorld, MountedVolume, PodToMount, StagedVolume, VolumeHandle,
};
use super::operations::{self, MountFailure, MountRequest, Mounted, OpContext, OpError, PodInfo};
use super::pod_events::PodEvents;
use super::volume_spec::{MountKind, VolumeToMount};
use crate::metrics::Metrics;

/// A finished operation, back from its task.
#[derive(Debug)]
pub enum OpOutcome {
    Mount {
        pod_uid: String,
        unique_name: String,
        started: Instant,
        result: Result<Mounted, MountFailure>,
    },
    Unpublish {
        volume: MountedVolume,
        started: Instant,
        result: Result<(), OpError>,
    },
    Unstage {
        volume: StagedVolume,
        started: Instant,
        result: Result<(), OpError>,
    },
}

/// Exponential backoff of one (volume, pod) after a failure.
#[derive(Debug, Clone, Copy)]
struct Backoff {
    until: Instant,
    delay: Duration,
}

/// Why a wanted volume cannot be mounted yet.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Wait {
    message: String,
    /// Reported at once (a state that will not fix itself: an unregistered driver, an
    /// attach error), not only after `stuck_event_after`.
    urgent: bool,
}

impl Wait {
    fn patient(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            urgent: false,
        }
    }

    fn urgent(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            urgent: true,
        }
    }
}

/// A wanted volume that waits, since when, and whether its Event went out.
#[derive(Debug, Clone)]
struct Blocked {
    wait: Wait,
    since: Instant,
    reported: bool,
}

/// Settings of the reconciler.
#[derive(Debug, Clone)]
pub struct ReconcilerOptions {
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// How long a volume may wait (for volumesAttached, a driver, a PVC) before a
    /// `FailedMount` Event says why.
    pub stuck_event_after: Duration,
    /// How often a published volume whose CSIDriver says `requiresRepublish` is published
    /// again (the kubelet remounts such volumes on each pod sync, `--sync-frequency`).
    pub republish_period: Duration,
}

pub struct Reconciler {
    ctx: Arc<OpContext>,
    options: ReconcilerOptions,
    pub(super) asw: ActualStateOfWorld,
    in_flight: HashSet<String>,
    backoff: HashMap<(String, String), Backoff>,
    blocked: HashMap<(String, String), Blocked>,
    results: mpsc::UnboundedSender<OpOutcome>,
    events: PodEvents,
    metrics: Metrics,
    vas: ObjectCache<VolumeAttachment>,
    /// Volumes mounted from an in-tree spec translated to CSI (the `migrated` label of their
    /// operations, the unmounts' too); forgotten once unstaged. After a restart a volume is
    /// known migrated again once a pod that wants it is mounted.
    migrated: HashSet<String>,
    /// When each (volume, pod) was last published, for `requiresRepublish` drivers.
    published_at: HashMap<(String, String), Instant>,
}

/// What a pass needs to read.
pub struct PassInput<'a> {
    pub dsw: &'a DesiredStateOfWorld,
    /// The node as cached (its `status.volumesAttached`).
    pub node: Option<Arc<Node>>,
    /// Unique names the node status reports in `volumesInUse` now.
    pub reported_in_use: &'a BTreeSet<String>,
}

impl Reconciler {
    pub fn new(
        ctx: Arc<OpContext>,
        options: ReconcilerOptions,
        asw: ActualStateOfWorld,
        results: mpsc::UnboundedSender<OpOutcome>,
        events: PodEvents,
        metrics: Metrics,
        vas: ObjectCache<VolumeAttachment>,
    ) -> Self {
        Self {
            ctx,
            options,
            asw,
            in_flight: HashSet::new(),
            backoff: HashMap::new(),
            blocked: HashMap::new(),
            results,
            events,
            metrics,
            vas,
            migrated: HashSet::new(),
            published_at: HashMap::new(),
        }
    }

    /// Whether the volume's driver wants NodePublish again now and then
    /// (`requiresRepublish`, for tokens or contents that expire).
    fn requires_republish(&self, v: &VolumeToMount) -> bool {
        let MountKind::Csi(c) = &v.kind else {
            return false;
        };
        self.ctx
            .csidrivers
            .get(&c.driver)
            .and_then(|d| d.spec.requires_republish)
            .unwrap_or(false)
    }

    /// Whether a published volume is due for its periodic republish. A publish this agent has
    /// not timed (rebuilt from disk) counts from the first time it is looked at.
    fn republish_due(&mut self, v: &VolumeToMount, pod_uid: &str, now: Instant) -> bool {
        if !self.requires_republish(v) {
            return false;
        }
        let at = *self
            .published_at
            .entry((v.unique_name.clone(), pod_uid.to_string()))
            .or_insert(now);
        now.duration_since(at) >= self.options.republish_period
    }

    /// Whether an operation on the volume is running.
    pub fn busy(&self, unique_name: &str) -> bool {
        self.in_flight.contains(unique_name)
    }

    /// Whether the attach/detach controller manages the volume: it must then be in
    /// `volumesInUse` before it is mounted, and in `volumesAttached` too.
    pub fn adc_manages(&self, v: &VolumeToMount) -> bool {
        match &v.kind {
            MountKind::AwsEbs { .. } => true,
            MountKind::Csi(c) => self.adc_manages_csi(&c.driver, c.ephemeral),
        }
    }

    /// Whether the attach/detach controller manages the volume behind `handle` now.
    fn adc_manages_handle(&self, handle: &VolumeHandle) -> bool {
        match handle {
            VolumeHandle::AwsEbs { .. } => true,
            VolumeHandle::Csi {
                driver, ephemeral, ..
            } => self.adc_manages_csi(driver, *ephemeral),
        }
    }

    /// The one rule behind both: an ephemeral inline volume is never attached; any other CSI
    /// volume is the attach/detach controller's when its driver's attach path says so.
    fn adc_manages_csi(&self, driver: &str, ephemeral: bool) -> bool {
        !ephemeral && self.ctx.csi.attach_path(driver).adc_manages()
    }

    /// `node.status.volumesInUse` as it should be: every wanted volume the attach/detach
    /// controller manages, and every one staged or published (also uncertain) that it managed
    /// when it was mounted or manages now, whatever the desired state says: a volume stays
    /// listed until it is unmounted, also when its pod is gone or its CSIDriver was turned
    /// `attachRequired: false` in the meantime.
    pub fn volumes_in_use(&self, dsw: &DesiredStateOfWorld) -> BTreeSet<String> {
        let mut set: BTreeSet<String> = dsw
            .volumes()
            .filter(|(_, v)| self.adc_manages(v))
            .map(|(_, v)| v.unique_name.clone())
            .collect();
        let staged = self
            .asw
            .all_staged()
            .map(|s| (&s.unique_name, &s.handle, s.reported_in_use));
        let mounted = self
            .asw
            .all_mounted()
            .map(|m| (&m.unique_name, &m.handle, m.reported_in_use));
        for (name, handle, reported) in staged.chain(mounted) {
            if reported || self.adc_manages_handle(handle) {
                set.insert(name.clone());
            }
        }
        // An operation in flight may be staging or publishing right now, before its outcome
        // is in the actual state: the volume stays listed until it is done (Kubernetes lists
        // volumes with an operation pending too). Without this, a pod deleted in the middle of
        // its mount let the volume drop out while NodeStage mounted it (`csi-cluster chaos`).
        set.extend(self.in_flight.iter().cloned());
        set
    }

    pub fn pass(&mut self, input: &PassInput<'_>) {
        let now = Instant::now();
        self.name_reconstructed(input.dsw);
        self.unmount_unwanted(input.dsw, now);
        self.unstage_unused(input.dsw, now);
        self.mount_wanted(input, now);
        self.report_stuck(input.dsw, now);
        self.metrics.set_mounted(self.asw.mounted_count());
    }

    /// A CSI volume is torn down through its driver: after a restart the driver registers
    /// again shortly, and the teardown waits for that rather than failing and backing off.
    /// (A registry change wakes the reconciler.)
    fn driver_registered(&self, handle: &VolumeHandle) -> bool {
        match handle {
            VolumeHandle::Csi { driver, .. } => self.ctx.drivers.get(driver).is_some(),
            VolumeHandle::AwsEbs { .. } => true,
        }
    }

    fn backing_off(&self, key: &(String, String), now: Instant) -> bool {
        self.backoff.get(key).is_some_and(|b| b.until > now)
    }

    /// Names each publish rebuilt from disk by the pod volume that resolves to it, so that it
    /// is still matched by name should that volume become unresolvable later (see
    /// `PodToMount::keeps_unresolved`), and counts for the pod's readiness.
    fn name_reconstructed(&mut self, dsw: &DesiredStateOfWorld) {
        for pod in dsw.pods() {
            for v in pod.resolved() {
                self.asw.name_mount(&v.unique_name, &pod.uid, &v.outer_name);
            }
        }
    }

    fn unmount_unwanted(&mut self, dsw: &DesiredStateOfWorld, now: Instant) {
        // A live pod whose volume cannot be resolved right now (its PV or claim missing from
        // the cache for a moment, a CSIDriver changed) keeps what it has mounted: as the
        // kubelet, a running pod's volume is only torn down with the pod.
        // A publish rebuilt from disk after a restart has no pod volume name: see
        // `PodToMount::keeps_unresolved`.
        let unwanted: Vec<MountedVolume> = self
            .asw
            .all_mounted()
            .filter(|m| !dsw.wants(&m.unique_name, &m.pod_uid))
            .filter(|m| !dsw.pod(&m.pod_uid).is_some_and(|p| p.keeps_unresolved(m)))
            .cloned()
            .collect();
        for m in unwanted {
            let key = (m.unique_name.clone(), m.pod_uid.clone());
            if self.busy(&m.unique_name)
                || self.backing_off(&key, now)
                || !self.driver_registered(&m.handle)
            {
                continue;
            }
            self.in_flight.insert(m.unique_name.clone());
            let ctx = self.ctx.clone();
            let tx = self.results.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                let result = operations::unpublish(ctx, m.clone()).await;
                let _ = tx.send(OpOutcome::Unpublish {
                    volume: m,
                    started,
                    result,
                });
            });
        }
    }

    fn unstage_unused(&mut self, dsw: &DesiredStateOfWorld, now: Instant) {
        let unused: Vec<StagedVolume> = self
            .asw
            .all_staged()
            .filter(|s| !self.asw.is_published_anywhere(&s.unique_name))
            .filter(|s| !dsw.wants_volume(&s.unique_name))
            .cloned()
            .collect();
        for s in unused {
            let key = (s.unique_name.clone(), String::new());
            if self.busy(&s.unique_name)
                || self.backing_off(&key, now)
                || !self.driver_registered(&s.handle)
            {
                continue;
            }
            self.in_flight.insert(s.unique_name.clone());
            let ctx = self.ctx.clone();
            let tx = self.results.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                let result = operations::unstage(ctx, s.clone()).await;
                let _ = tx.send(OpOutcome::Unstage {
                    volume: s,
                    started,
                    result,
                });
            });
        }
    }

    /// The `devicePath` the attach/detach controller reported, if it lists the volume.
    fn attached_device(node: Option<&Node>, unique_name: &str) -> Option<String> {
        node?
            .status
            .as_ref()?
            .volumes_attached
            .as_ref()?
            .iter()
            .find(|a| a.name == unique_name)
            .map(|a| a.device_path.clone())
    }

    /// Why the volume cannot be mounted yet, or `None` when it can.
    fn precondition(
        &self,
        v: &VolumeToMount,
        input: &PassInput<'_>,
    ) -> Result<Option<String>, Wait> {
        if let MountKind::Csi(c) = &v.kind
            && self.ctx.drivers.get(&c.driver).is_none()
        {
            return Err(Wait::urgent(format!(
                "{} (are its node plugin and csi-node-driver-registrar running on this node?)",
                operations::csi_not_registered(&c.driver)
            )));
        }
        if !self.adc_manages(v) {
            return Ok(None);
        }
        if !input.reported_in_use.contains(&v.unique_name) {
            return Err(Wait::patient(
                "waiting for the volume to be reported in node.status.volumesInUse",
            ));
        }
        match Self::attached_device(input.node.as_deref(), &v.unique_name) {
            Some(device) => Ok(Some(device)),
            None => Err(self.not_attached_reason(v)),
        }
    }

    fn not_attached_reason(&self, v: &VolumeToMount) -> Wait {
        let MountKind::Csi(c) = &v.kind else {
            return Wait::patient(format!(
                "waiting for the attach/detach controller to attach volume {} (node.status.volumesAttached does not list {})",
                v.spec_name, v.unique_name
            ));
        };
        if !self
            .ctx
            .csi
            .attach_path(&c.driver)
            .creates_volume_attachment()
        {
            return Wait::patient(format!(
                "waiting for the attach/detach controller to list {} in node.status.volumesAttached (skip-attach through-adc: no VolumeAttachment)",
                v.unique_name
            ));
        }
        let va = volume_attachment_name(&c.handle, &c.driver, &self.ctx.node_name);
        match self.vas.get(&va) {
            None => Wait::patient(format!(
                "waiting for attach of VolumeAttachment {va}: it does not exist yet (is the attach/detach controller running?)"
            )),
            Some(obj) => {
                let status = obj.status.clone().unwrap_or_default();
                match status.attach_error.and_then(|e| e.message) {
                    Some(err) => Wait::urgent(format!(
                        "waiting for attach of VolumeAttachment {va}: {err}"
                    )),
                    None if status.attached => Wait::patient(format!(
                        "VolumeAttachment {va} is attached; waiting for the attach/detach controller to list {} in node.status.volumesAttached",
                        v.unique_name
                    )),
                    None => Wait::patient(format!(
                        "waiting for attach of VolumeAttachment {va}: not attached yet (is csi-attacher for {} running?)",
                        c.driver
                    )),
                }
            }
        }
    }

    fn mount_wanted(&mut self, input: &PassInput<'_>, now: Instant) {
        let mut still_blocked = HashSet::new();
        for (pod, v) in input.dsw.volumes() {
            let key = (v.unique_name.clone(), pod.uid.clone());
            if self
                .asw
                .mounted(&v.unique_name, &pod.uid)
                .is_some_and(|m| !m.uncertain)
                && !self.republish_due(v, &pod.uid, now)
            {
                continue;
            }
            if self.busy(&v.unique_name) || self.backing_off(&key, now) {
                continue;
            }
            let device_path = match self.precondition(v, input) {
                Ok(d) => d,
                Err(wait) => {
                    let k = (pod.uid.clone(), v.outer_name.clone());
                    still_blocked.insert(k.clone());
                    self.note_blocked(k, wait, now);
                    continue;
                }
            };
            self.blocked
                .remove(&(pod.uid.clone(), v.outer_name.clone()));
            let reported_in_use = self.adc_manages(v);
            let req = MountRequest {
                pod: pod_info(pod),
                volume: v.clone(),
                // An uncertain stage (reconstructed, not proven mounted) is done again.
                already_staged: self
                    .asw
                    .staged(&v.unique_name)
                    .filter(|s| !s.uncertain)
                    .cloned(),
                device_path,
                reported_in_use,
            };
            self.in_flight.insert(v.unique_name.clone());
            let ctx = self.ctx.clone();
            let tx = self.results.clone();
            let pod_uid = pod.uid.clone();
            let unique_name = v.unique_name.clone();
            if matches!(&v.kind, MountKind::Csi(c) if c.migrated) {
                self.migrated.insert(v.unique_name.clone());
            }
            tokio::spawn(async move {
                let started = Instant::now();
                let result = operations::mount(ctx, req).await;
                let _ = tx.send(OpOutcome::Mount {
                    pod_uid,
                    unique_name,
                    started,
                    result,
                });
            });
        }
        // Unresolved pod volumes (PVC not bound, ...) wait too, and so do volumes of a
        // claim being deleted, in a pod that does not have them yet.
        for pod in input.dsw.pods() {
            for (name, why) in &pod.unresolved {
                let k = (pod.uid.clone(), name.clone());
                still_blocked.insert(k.clone());
                self.note_blocked(k, Wait::patient(why.clone()), now);
            }
            for (v, why) in &pod.keep_only {
                if self.asw.mounted(&v.unique_name, &pod.uid).is_some() {
                    continue;
                }
                let k = (pod.uid.clone(), v.outer_name.clone());
                still_blocked.insert(k.clone());
                self.note_blocked(k, Wait::urgent(why.clone()), now);
            }
        }
        self.blocked.retain(|k, _| still_blocked.contains(k));
    }

    /// Records what a volume waits for; a new reason is reported anew, the wait keeps its
    /// start.
    fn note_blocked(&mut self, key: (String, String), wait: Wait, now: Instant) {
        let entry = self.blocked.entry(key).or_insert_with(|| Blocked {
            wait: wait.clone(),
            since: now,
            reported: false,
        });
        if entry.wait != wait {
            entry.wait = wait;
            entry.reported = false;
        }
    }

    fn report_stuck(&mut self, dsw: &DesiredStateOfWorld, now: Instant) {
        for ((uid, volume), b) in &mut self.blocked {
            let due =
                b.wait.urgent || now.duration_since(b.since) >= self.options.stuck_event_after;
            if b.reported || !due {
                continue;
            }
            b.reported = true;
            if let Some(pod) = dsw.pod(uid) {
                self.events.failed_mount(
                    &pod.pod,
                    format!("Unable to mount volume \"{volume}\": {}", b.wait.message),
                );
            }
        }
    }

    /// Applies a finished operation to the actual state.
    pub fn finished(&mut self, outcome: OpOutcome, dsw: &DesiredStateOfWorld) {
        match outcome {
            OpOutcome::Mount {
                pod_uid,
                unique_name,
                started,
                result,
            } => {
                self.in_flight.remove(&unique_name);
                let key = (unique_name.clone(), pod_uid.clone());
                match result {
                    Ok(m) => {
                        self.backoff.remove(&key);
                        self.published_at.insert(key.clone(), Instant::now());
                        self.metrics.operation(
                            "volume_mount",
                            &unique_name,
                            self.migrated.contains(&unique_name),
                            started.elapsed(),
                            true,
                        );
                        self.asw.add_staged(m.staged);
                        self.asw.add_mounted(m.mounted);
                    }
                    Err(MountFailure {
                        error: e,
                        staged,
                        published,
                    }) => {
                        self.metrics.operation(
                            "volume_mount",
                            &unique_name,
                            self.migrated.contains(&unique_name),
                            started.elapsed(),
                            false,
                        );
                        // What the failed mount left: a stage (certain, or uncertain after a
                        // non-final error) and an uncertain publish. An entry already uncertain
                        // stays so after a final error: only NodeUnstage/NodeUnpublish prove
                        // nothing is left (the kubelet forgets it; a leftover mount would then
                        // leave volumesInUse and be detached under it).
                        if let Some(s) = staged {
                            tracing::info!(volume = %unique_name, uncertain = s.uncertain, "recording the stage of a failed mount");
                            self.asw.add_staged(s);
                        }
                        // A failed republish leaves the volume as it was: still published
                        // for the pod (the kubelet keeps a mounted volume mounted).
                        let was_published = self
                            .asw
                            .mounted(&unique_name, &pod_uid)
                            .is_some_and(|m| !m.uncertain);
                        if let Some(m) = published.filter(|_| !was_published) {
                            self.asw.add_mounted(m);
                        }
                        self.back_off(key.clone());
                        let volume = dsw
                            .pod(&pod_uid)
                            .and_then(|p| p.volumes.iter().find(|v| v.unique_name == unique_name))
                            .map(|v| v.spec_name.clone())
                            .unwrap_or_else(|| unique_name.clone());
                        tracing::warn!(volume = %unique_name, pod_uid = %pod_uid, step = e.step.as_str(), error = %e.message, "mount failed");
                        if let Some(pod) = dsw.pod(&pod_uid) {
                            self.events.failed_mount(
                                &pod.pod,
                                format!(
                                    "{} failed for volume \"{volume}\" : {}",
                                    e.step.as_str(),
                                    e.message
                                ),
                            );
                        }
                    }
                }
            }
            OpOutcome::Unpublish {
                volume,
                started,
                result,
            } => {
                self.in_flight.remove(&volume.unique_name);
                let key = (volume.unique_name.clone(), volume.pod_uid.clone());
                match result {
                    Ok(()) => {
                        self.backoff.remove(&key);
                        self.metrics.operation(
                            "volume_unmount",
                            &volume.unique_name,
                            self.migrated.contains(&volume.unique_name),
                            started.elapsed(),
                            true,
                        );
                        self.asw
                            .remove_mounted(&volume.unique_name, &volume.pod_uid);
                        self.published_at.remove(&key);
                    }
                    Err(e) => {
                        self.metrics.operation(
                            "volume_unmount",
                            &volume.unique_name,
                            self.migrated.contains(&volume.unique_name),
                            started.elapsed(),
                            false,
                        );
                        tracing::warn!(volume = %volume.unique_name, pod_uid = %volume.pod_uid, step = e.step.as_str(), error = %e.message, "unmount failed");
                        self.back_off(key);
                    }
                }
            }
            OpOutcome::Unstage {
                volume,
                started,
                result,
            } => {
                self.in_flight.remove(&volume.unique_name);
                let key = (volume.unique_name.clone(), String::new());
                match result {
                    Ok(()) => {
                        self.backoff.remove(&key);
                        self.metrics.operation(
                            "unmount_device",
                            &volume.unique_name,
                            self.migrated.contains(&volume.unique_name),
                            started.elapsed(),
                            true,
                        );
                        self.asw.remove_staged(&volume.unique_name);
                        self.migrated.remove(&volume.unique_name);
                    }
                    Err(e) => {
                        self.metrics.operation(
                            "unmount_device",
                            &volume.unique_name,
                            self.migrated.contains(&volume.unique_name),
                            started.elapsed(),
                            false,
                        );
                        tracing::warn!(volume = %volume.unique_name, step = e.step.as_str(), error = %e.message, "unmount device failed");
                        self.back_off(key);
                    }
                }
            }
        }
    }

    fn back_off(&mut self, key: (String, String)) {
        let delay = match self.backoff.get(&key) {
            Some(b) => (b.delay * 2).min(self.options.backoff_max),
            None => self.options.backoff_initial,
        };
        self.backoff.insert(
            key,
            Backoff {
                until: Instant::now() + delay,
                delay,
            },
        );
    }

    /// The earliest time a backed-off operation may run again (to wake the loop then).
    pub fn next_retry(&self) -> Option<Instant> {
        self.backoff
            .values()
            .map(|b| b.until)
            .filter(|t| *t > Instant::now())
            .min()
    }

    /// Whether every storage volume of the pod is published: all it wants or keeps, and an
    /// unresolved one only if it is still mounted from before (see `unmount_unwanted`).
    pub fn pod_volumes_ready(&self, pod: &PodToMount) -> bool {
        let published = |unique: &str| {
            self.asw
                .mounted(unique, &pod.uid)
                .is_some_and(|m| !m.uncertain)
        };
        pod.volumes.iter().all(|v| published(&v.unique_name))
            && pod.keep_only.iter().all(|(v, _)| published(&v.unique_name))
            && pod.unresolved.iter().all(|(name, _)| {
                self.asw
                    .all_mounted()
                    .any(|m| m.pod_uid == pod.uid && m.outer_name == *name && !m.uncertain)
            })
    }

    /// Where each volume of the pod is on the host (pod volume name → path).
    pub fn pod_volume_paths(&self, pod: &PodToMount) -> std::collections::BTreeMap<String, String> {
        pod.volumes
            .iter()
            .filter_map(|v| {
                self.asw
                    .mounted(&v.unique_name, &pod.uid)
                    .map(|m| (v.outer_name.clone(), m.host_path.display().to_string()))
            })
            .collect()
    }

    /// Whether the pod has nothing of ours left on the node (its deletion may be confirmed).
    pub fn pod_torn_down(&self, uid: &str) -> bool {
        !self.asw.pod_has_volumes(uid)
    }
}

fn pod_info(pod: &PodToMount) -> PodInfo {
    let p: &Pod = &pod.pod;
    PodInfo {
        uid: pod.uid.clone(),
        namespace: pod.namespace().to_string(),
        name: pod.name().to_string(),
        service_account: p
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_else(|| "default".into()),
    }
}
