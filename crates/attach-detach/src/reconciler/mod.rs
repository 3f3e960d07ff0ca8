//! One reconcile pass (kube-controller-manager's reconciler): detach what is attached (or
//! uncertain) but no longer desired (once the node stops reporting it in `status.volumesInUse`,
//! checked again against the API server right before the detach; or forced, after
//! `--max-wait-for-unmount` on a node that is not Ready, or at once on an out-of-service node),
//! then attach what is desired but not
//! attached (refusing a second node for a volume that is not multi-attachable), then write the
//! node status that changed. Every few passes' worth of cache changes, attachments are checked
//! against the plugins (`VolumesAreAttached`): a CSI volume whose VolumeAttachment went away
//! (or whose driver became attachable, the downgrade in the skip-attach design,
//! docs/design/skip-attach.md) is attached again.

mod effects;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashSet};

use k8s_openapi::api::core::v1::Node;
use tokio::time::Instant;

use crate::cache::{Attachment, DetachHow, PodRef, VolumeNode, VolumeToAttach};
use crate::context::{Ctx, State};
use crate::events::{FAILED_ATTACH, FORCED_DETACH, attach_failed, multi_attach};
use crate::metrics::{ACTUAL, DESIRED};
use crate::operations::{attach_no_op, is_no_op};
use crate::populator::{self, Desired};
use crate::statusupdater::NodeStatusUpdater;

pub(crate) use effects::{Effects, Live};

/// A detach one pass decided to start.
struct Detach {
    volume: String,
    node: String,
    attachment: Attachment,
    mode: DetachMode,
}

/// What one pass decided under the state lock.
#[derive(Default)]
struct Plan {
    detaches: Vec<Detach>,
    attaches: Vec<(VolumeToAttach, String, Vec<PodRef>)>,
    /// (pod, message) of Multi-Attach errors not reported before.
    multi_attach_events: Vec<(PodRef, String)>,
}

pub(crate) struct Reconciler {
    status: NodeStatusUpdater,
    /// (volume, node) whose Multi-Attach error was reported (once, as Kubernetes does).
    multi_attach_reported: HashSet<VolumeNode>,
    /// (pod UID, volume, reason) of spec failures already reported.
    failures_reported: HashSet<(String, String, String)>,
    /// Cache generations (VolumeAttachments, CSIDrivers) at the last attachment check.
    synced: Option<(u64, u64)>,
}

/// The taint an operator puts on a node that is shut down for good: its volumes are detached at
/// once, mounted or not (Kubernetes' non-graceful node shutdown).
const OUT_OF_SERVICE_TAINT: &str = "node.kubernetes.io/out-of-service";

/// A Ready node is healthy: a volume it still uses is never force-detached from it (as
/// Kubernetes does since 1.26); a node that is gone or not Ready may be.
fn node_healthy(node: Option<&Node>) -> bool {
    node.and_then(|n| n.status.as_ref())
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn out_of_service(node: Option<&Node>) -> bool {
    node.and_then(|n| n.spec.as_ref())
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == OUT_OF_SERVICE_TAINT))
}

/// Whether a volume the node still reports in use is detached anyway: after
/// `--max-wait-for-unmount` from a node that is gone or not Ready (unless
/// `--disable-force-detach-on-timeout`), or at once from an out-of-service node.
fn force_detach(node: Option<&Node>, waited_out: bool, disabled: bool) -> bool {
    out_of_service(node) || (waited_out && !disabled && !node_healthy(node))
}

/// How a volume that is no longer desired leaves its node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DetachMode {
    /// The node still reports the volume in use and it goes anyway (metric, node Event).
    forced: bool,
    /// Read the node from the API server right before the detach and refuse it if the node
    /// lists the volume in `status.volumesInUse` (Kubernetes' `verifySafeToDetach`); skipped
    /// only when a forced detach is allowed (the outcome would not change).
    verify_safe: bool,
}

/// Whether (and how) a volume that is no longer desired is detached now; `None`: it waits for
/// the node to stop using it. `mounted` is the cached `status.volumesInUse` of the node, for
/// confirmed and uncertain attachments alike (an uncertain one may be attached, so it is
/// treated as attached).
fn detach_mode(
    mounted: bool,
    node: Option<&Node>,
    waited_out: bool,
    disabled: bool,
) -> Option<DetachMode> {
    let force = force_detach(node, waited_out, disabled);
    if mounted && !force {
        return None;
    }
    Some(DetachMode {
        forced: mounted,
        verify_safe: !force,
    })
}

impl Reconciler {
    pub(crate) fn new(ctx: &Ctx) -> Self {
        Self {
            status: NodeStatusUpdater::from_nodes(&ctx.caches.nodes.list()),
            multi_attach_reported: HashSet::new(),
            failures_reported: HashSet::new(),
            synced: None,
        }
    }

    /// One pass: reads the caches and the state in `ctx`, acts through `effects`.
    pub(crate) async fn pass(&mut self, ctx: &Ctx, effects: &mut impl Effects) {
        let desired = {
            let state = ctx.state();
            populator::desired_state(ctx, &state.asw)
        };
        self.report_failures(ctx, effects, &desired).await;
        let plan = {
            let mut state = ctx.state();
            populator::refresh_mounted(ctx, &mut state.asw);
            self.sync_states(ctx, &mut state);
            record_totals(ctx, &desired, &state);
            let mut plan = Plan::default();
            self.plan_detaches(ctx, &desired, &mut state, &mut plan);
            self.plan_attaches(&desired, &mut state, &mut plan);
            let dsw = &desired.dsw;
            let State { asw, ops } = &mut *state;
            ops.retain_backoff(|(v, n)| dsw.contains(v, n) || asw.get(v, n).is_some());
            plan
        };
        for (pod, message) in &plan.multi_attach_events {
            effects.pod_warning(pod, FAILED_ATTACH, message).await;
        }
        self.detach(ctx, effects, plan.detaches).await;
        let mut no_op_events = Vec::new();
        for (volume, node, pods) in plan.attaches {
            if is_no_op(ctx, &volume) {
                no_op_events.push(attach_no_op(ctx, &volume, &node, pods));
            } else {
                effects.start_attach(volume, node, pods);
            }
        }
        self.write_status(ctx, effects).await;
        effects.success_events(no_op_events);
    }

    async fn report_failures(&mut self, ctx: &Ctx, effects: &impl Effects, desired: &Desired) {
        for (pod, volume, reason) in &desired.failures {
            let key = (pod.uid.clone(), volume.clone(), reason.clone());
            if self.failures_reported.insert(key) {
                tracing::warn!(pod = %format!("{}/{}", pod.namespace, pod.name), volume = %volume, reason = %reason, "volume will not be attached");
                effects
                    .pod_warning(pod, FAILED_ATTACH, &attach_failed(volume, reason))
                    .await;
            }
        }
        self.failures_reported
            .retain(|(uid, _, _)| desired.live_pods.contains(uid));
        ctx.events.retain(&desired.live_pods);
    }

    /// Kubernetes' `VolumesAreAttached` sync, run when VolumeAttachments or CSIDrivers changed.
    fn sync_states(&mut self, ctx: &Ctx, state: &mut State) {
        let generations = (
            *ctx.caches.vas.changed().borrow(),
            *ctx.caches.csidrivers.changed().borrow(),
        );
        if self.synced == Some(generations) {
            return;
        }
        self.synced = Some(generations);
        let State { asw, ops } = state;
        let gone: Vec<VolumeNode> = asw
            .attachments
            .iter()
            .filter(|((v, n), a)| a.confirmed && !ops.busy(v, n, a.multi_attach))
            .filter_map(|((v, n), a)| match &a.how {
                DetachHow::Csi { driver, handle } => {
                    let attached = ctx
                        .csi
                        .volumes_are_attached(&[(driver.clone(), handle.clone())], n);
                    (attached.first() == Some(&false)).then(|| (v.clone(), n.clone()))
                }
                DetachHow::AwsEbs { .. } => None,
            })
            .collect();
        for (v, n) in gone {
            tracing::info!(volume = %v, node = %n, "the plugin says the volume is not attached (VolumeAttachment gone or not attached); it is attached again if still needed");
            asw.remove(&v, &n);
        }
    }

    fn plan_detaches(&mut self, ctx: &Ctx, desired: &Desired, state: &mut State, plan: &mut Plan) {
        let now = Instant::now();
        let max_wait = ctx.options.max_wait_for_unmount;
        let State { asw, ops } = state;
        for ((v, n), a) in asw.attachments.iter_mut() {
            if desired.dsw.contains(v, n) {
                a.detach_requested = None;
                continue;
            }
            if ops.busy(v, n, a.multi_attach) || ops.in_backoff(v, n) {
                continue;
            }
            let since = *a.detach_requested.get_or_insert(now);
            let waited_out = now.duration_since(since) >= max_wait;
            let node = ctx.caches.nodes.get(n);
            let disabled = ctx.options.disable_force_detach_on_timeout;
            let Some(mode) = detach_mode(a.mounted, node.as_deref(), waited_out, disabled) else {
                continue;
            };
            a.report = false;
            ops.start(v, n, a.multi_attach);
            plan.detaches.push(Detach {
                volume: v.clone(),
                node: n.clone(),
                attachment: a.clone(),
                mode,
            });
        }
    }

    fn plan_attaches(&mut self, desired: &Desired, state: &mut State, plan: &mut Plan) {
        let State { asw, ops } = state;
        for ((v, n), d) in &desired.dsw.volumes {
            if asw.get(v, n).is_some_and(|a| a.confirmed) || !d.volume.attachable {
                continue;
            }
            let multi = d.volume.multi_attach;
            if ops.busy(v, n, multi) || ops.in_backoff(v, n) {
                continue;
            }
            let elsewhere = if multi {
                Vec::new()
            } else {
                asw.other_nodes(v, n)
            };
            if !elsewhere.is_empty() {
                if self.multi_attach_reported.insert((v.clone(), n.clone())) {
                    let others = desired.dsw.pods_on_nodes(v, &elsewhere);
                    for pod in &d.pods {
                        let message = multi_attach(&d.volume.spec_name, pod, &others);
                        plan.multi_attach_events.push((pod.clone(), message));
                    }
                }
                continue;
            }
            ops.start(v, n, multi);
            plan.attaches
                .push((d.volume.clone(), n.clone(), d.pods.clone()));
        }
        let dsw = &desired.dsw;
        self.multi_attach_reported
            .retain(|(v, n)| dsw.contains(v, n) && !asw.get(v, n).is_some_and(|a| a.confirmed));
    }

    /// Writes the nodes' status without the volumes first (as Kubernetes does: the kubelet
    /// must not see a volume as attached while it is being detached), then starts the
    /// detaches whose node status was written.
    async fn detach(&mut self, ctx: &Ctx, effects: &mut impl Effects, detaches: Vec<Detach>) {
        if detaches.is_empty() {
            return;
        }
        let nodes: BTreeSet<String> = detaches.iter().map(|d| d.node.clone()).collect();
        let mut failed_nodes = BTreeSet::new();
        // Each node read once: a node that is gone gets no status write (and no UID on a
        // forced detach's Event); its volumes are still detached.
        let mut uids = BTreeMap::new();
        for node in nodes {
            let Some(n) = ctx.caches.nodes.get(&node) else {
                continue;
            };
            uids.insert(node.clone(), n.metadata.uid.clone());
            let reported = ctx.state().asw.reported(&node);
            match effects.patch_status(&node, &reported).await {
                Ok(updated) => self.status.written(&node, &updated, reported),
                Err(e) => {
                    tracing::warn!(node = %node, error = %e, "node status not written; the detach waits for the next pass");
                    failed_nodes.insert(node);
                }
            }
        }
        for Detach {
            volume,
            node,
            attachment,
            mode,
        } in detaches
        {
            if failed_nodes.contains(&node) {
                let mut state = ctx.state();
                state.ops.finish(&volume, &node, attachment.multi_attach);
                if let Some(a) = state.asw.get_mut(&volume, &node) {
                    a.report = a.confirmed;
                }
                continue;
            }
            if mode.forced {
                ctx.metrics.forced_detach();
                let max_wait = ctx.options.max_wait_for_unmount;
                tracing::warn!(volume = %volume, node = %node, ?max_wait, "forced detach: the node still reports the volume in use");
                let uid = uids.get(&node).cloned().flatten();
                effects
                    .node_warning(
                        &node,
                        uid,
                        FORCED_DETACH,
                        &format!(
                            "Volume {volume:?} is detached from node {node} although the node still reports it in status.volumesInUse: the node is out of service, or it waited {max_wait:?} (--max-wait-for-unmount) and the node is not Ready"
                        ),
                    )
                    .await;
            }
            effects.start_detach(volume, node, attachment, mode.verify_safe);
        }
    }

    async fn write_status(&mut self, ctx: &Ctx, effects: &impl Effects) {
        let changed = {
            let state = ctx.state();
            self.status.changed(ctx, &state.asw)
        };
        // One patch per node, all nodes at once: a pass that attached volumes on every node
        // should not make the last node wait for the others' round trips.
        let results =
            futures::future::join_all(changed.into_iter().map(|(node, reported)| async move {
                let result = effects.patch_status(&node, &reported).await;
                (node, reported, result)
            }))
            .await;
        for (node, reported, result) in results {
            match result {
                Ok(updated) => self.status.written(&node, &updated, reported),
                Err(e) => {
                    tracing::warn!(node = %node, error = %e, "node status not written; retried next pass")
                }
            }
        }
    }
}

fn record_totals(ctx: &Ctx, desired: &Desired, state: &State) {
    let mut counts: BTreeMap<(String, &'static str), i64> = BTreeMap::new();
    for d in desired.dsw.volumes.values() {
        *counts
            .entry((d.volume.plugin_label(), DESIRED))
            .or_default() += 1;
    }
    for a in state.asw.attachments.values() {
        *counts.entry((a.how.plugin_label(), ACTUAL)).or_default() += 1;
    }
    ctx.metrics.set_total_volumes(&counts);
}
