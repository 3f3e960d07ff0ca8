//! The desired state from the caches (kube-controller-manager's
//! `desired_state_of_world_populator` plus the pod handlers, as one recomputation per pass), and
//! the actual state rebuilt at start (its `populateActualStateOfWorld` and VolumeAttachment
//! processing).

use std::collections::{BTreeSet, HashSet};

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use volume_plugins::names::csi_unique_volume_name;

use crate::CONTROLLER_MANAGED_ANNOTATION;
use crate::cache::{ActualStateOfWorld, Attachment, DesiredStateOfWorld, DetachHow, PodRef};
use crate::context::Ctx;
use crate::in_tree::instance_of;
use crate::volume_spec::{SpecContext, SpecOutcome, volume_to_attach};

/// A node annotation that keeps the volumes of terminated pods attached (as Kubernetes honours
/// it; deprecated there, still read).
pub(crate) const KEEP_TERMINATED_POD_VOLUMES_ANNOTATION: &str =
    "volumes.kubernetes.io/keep-terminated-pod-volumes";

/// Whether `pod`'s volumes should be attached to its (managed) `node`.
pub(crate) fn pod_wants_volumes(pod: &Pod, node: &Node) -> bool {
    if !is_managed(node) {
        return false;
    }
    let keep = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(KEEP_TERMINATED_POD_VOLUMES_ANNOTATION))
        .is_some_and(|v| v == "true");
    keep || !is_terminated(pod)
}

/// Whether this controller attaches and detaches for the node.
pub(crate) fn is_managed(node: &Node) -> bool {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CONTROLLER_MANAGED_ANNOTATION))
        .is_some_and(|v| v == "true")
}

/// A pod whose volumes no longer need to be attached: it finished, or it is being deleted and
/// none of its containers runs.
pub(crate) fn is_terminated(pod: &Pod) -> bool {
    let status = pod.status.as_ref();
    if matches!(
        status.and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    ) {
        return true;
    }
    if pod.metadata.deletion_timestamp.is_none() {
        return false;
    }
    let running = status
        .into_iter()
        .flat_map(|s| {
            s.container_statuses
                .iter()
                .flatten()
                .chain(s.init_container_statuses.iter().flatten())
        })
        .any(|c| c.state.as_ref().is_some_and(|st| st.running.is_some()));
    !running
}

pub(crate) fn pod_ref(pod: &Pod) -> PodRef {
    PodRef {
        namespace: pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into()),
        name: pod.metadata.name.clone().unwrap_or_default(),
        uid: pod.metadata.uid.clone().unwrap_or_default(),
    }
}

/// One pass's desired state, and the pod volumes that will not be attached as written.
#[derive(Debug, Default)]
pub(crate) struct Desired {
    pub dsw: DesiredStateOfWorld,
    /// (pod, volume name for the Event, reason).
    pub failures: Vec<(PodRef, String, String)>,
    /// UIDs of every pod seen (to forget what was reported for pods that are gone).
    pub live_pods: HashSet<String>,
}

/// The desired state now. A volume the plugin no longer attaches (a CSIDriver that turned
/// `attachRequired: false` in bypass-adc mode) stays desired while its pod runs if it is still
/// attached, as Kubernetes keeps it in its desired state until the pod goes.
pub(crate) fn desired_state(ctx: &Ctx, asw: &ActualStateOfWorld) -> Desired {
    let spec_ctx = SpecContext {
        pvcs: &ctx.caches.pvcs,
        pvs: &ctx.caches.pvs,
        csinodes: &ctx.caches.csinodes,
        csi: &ctx.csi,
        migrated: &ctx.options.migrated,
    };
    let mut out = Desired::default();
    for pod in ctx.caches.pods.list() {
        let pod_ref = pod_ref(&pod);
        out.live_pods.insert(pod_ref.uid.clone());
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) else {
            continue;
        };
        if node.is_empty() {
            continue;
        }
        if !ctx
            .caches
            .nodes
            .get(node)
            .is_some_and(|n| pod_wants_volumes(&pod, &n))
        {
            continue;
        }
        let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
        for volume in volumes.into_iter().flatten() {
            match volume_to_attach(&spec_ctx, &pod, volume, node) {
                SpecOutcome::Attach(v) => {
                    if v.attachable || asw.get(&v.unique_name, node).is_some() {
                        out.dsw.add(v, node, pod_ref.clone());
                    }
                }
                SpecOutcome::NotAttachable => {}
                SpecOutcome::Pending(why) => {
                    tracing::debug!(pod = %format!("{}/{}", pod_ref.namespace, pod_ref.name), volume = %volume.name, why, "volume not resolvable yet");
                }
                SpecOutcome::Failed { volume, reason } => {
                    out.failures.push((pod_ref.clone(), volume, reason));
                }
            }
        }
    }
    out
}

/// Updates each attachment's `mounted` from its node's `status.volumesInUse`; attachments on
/// nodes that are gone keep their last known value.
pub(crate) fn refresh_mounted(ctx: &Ctx, asw: &mut ActualStateOfWorld) {
    for node_name in asw.nodes() {
        if let Some(node) = ctx.caches.nodes.get(&node_name) {
            asw.set_mounted_by_node(&node_name, &volumes_in_use(&node));
        }
    }
}

fn volumes_in_use(node: &Node) -> BTreeSet<String> {
    node.status
        .as_ref()
        .and_then(|s| s.volumes_in_use.clone())
        .unwrap_or_default()
        .into_iter()
        .collect()
}

/// The actual state after a (re)start: every managed node's `status.volumesAttached`, then
/// every VolumeAttachment not being deleted on a managed (or deleted) node, attached or not,
/// so that nothing is attached twice and nothing leaks.
pub(crate) fn actual_state(ctx: &Ctx) -> ActualStateOfWorld {
    let mut asw = ActualStateOfWorld::default();
    for node in ctx.caches.nodes.list() {
        if !is_managed(&node) {
            continue;
        }
        let name = node.metadata.name.clone().unwrap_or_default();
        let in_use = volumes_in_use(&node);
        let attached = node
            .status
            .as_ref()
            .and_then(|s| s.volumes_attached.as_ref());
        for volume in attached.into_iter().flatten() {
            let Some(how) = DetachHow::from_unique_name(&volume.name) else {
                tracing::warn!(node = %name, volume = %volume.name, "status.volumesAttached names a volume of a plugin this controller does not run; leaving it");
                continue;
            };
            let mut attachment = Attachment::new(how, volume.device_path.clone(), true);
            if matches!(attachment.how, DetachHow::AwsEbs { .. }) {
                attachment.instance_id = instance_of(&node).ok();
            }
            attachment.mounted = in_use.contains(&volume.name);
            asw.mark_attached(&volume.name, &name, attachment);
        }
    }
    for va in ctx.caches.vas.list() {
        let node_name = va.spec.node_name.clone();
        if va.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let node = ctx.caches.nodes.get(&node_name);
        if node.as_ref().is_some_and(|n| !is_managed(n)) {
            continue;
        }
        let Some(handle) = va_volume_handle(ctx, &va) else {
            tracing::warn!(va = ?va.metadata.name, "cannot tell the volume handle of a VolumeAttachment (its PV is gone?); leaving it");
            continue;
        };
        let driver = va.spec.attacher.clone();
        let unique = csi_unique_volume_name(&driver, &handle);
        if asw.get(&unique, &node_name).is_some() {
            continue;
        }
        let attached = va.status.as_ref().is_some_and(|s| s.attached);
        let mut attachment =
            Attachment::new(DetachHow::Csi { driver, handle }, String::new(), attached);
        // Attached or uncertain, the node's word decides whether it is mounted: an uncertain
        // attachment the node uses waits for it like an attached one.
        attachment.mounted = node
            .as_ref()
            .is_some_and(|n| volumes_in_use(n).contains(&unique));
        tracing::info!(va = ?va.metadata.name, volume = %unique, node = %node_name, attached, "VolumeAttachment found at start");
        if attached {
            asw.mark_attached(&unique, &node_name, attachment);
        } else {
            asw.mark_uncertain(&unique, &node_name, attachment);
        }
    }
    asw
}

/// The volume handle of a VolumeAttachment: from its inline spec, or its PV (translated when
/// the PV is in-tree).
fn va_volume_handle(ctx: &Ctx, va: &VolumeAttachment) -> Option<String> {
    let source = &va.spec.source;
    if let Some(inline) = &source.inline_volume_spec {
        return inline.csi.as_ref().map(|c| c.volume_handle.clone());
    }
    let pv = ctx
        .caches
        .pvs
        .get(source.persistent_volume_name.as_deref()?)?;
    if let Some(csi) = pv.spec.as_ref().and_then(|s| s.csi.as_ref()) {
        return Some(csi.volume_handle.clone());
    }
    let translated = csi_translation::translate_in_tree_pv_to_csi(&pv).ok()?;
    translated.spec?.csi.map(|c| c.volume_handle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateRunning, ContainerStatus, PodStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    fn pod(phase: &str, deleting: bool, running: bool) -> Pod {
        Pod {
            metadata: ObjectMeta {
                deletion_timestamp: deleting.then(|| Time(jiff::Timestamp::now())),
                ..Default::default()
            },
            status: Some(PodStatus {
                phase: Some(phase.into()),
                container_statuses: Some(vec![ContainerStatus {
                    state: Some(ContainerState {
                        running: running.then(ContainerStateRunning::default),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn terminated_pods() {
        assert!(is_terminated(&pod("Succeeded", false, false)));
        assert!(is_terminated(&pod("Failed", false, false)));
        assert!(!is_terminated(&pod("Running", false, true)));
        assert!(!is_terminated(&pod("Pending", false, false)));
        assert!(
            is_terminated(&pod("Running", true, false)),
            "deleted, nothing runs"
        );
        assert!(
            !is_terminated(&pod("Running", true, true)),
            "deleted, still running"
        );
    }

    fn node(annotations: &[(&str, &str)]) -> Node {
        Node {
            metadata: ObjectMeta {
                annotations: Some(
                    annotations
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn managed_nodes_carry_the_annotation_set_to_true() {
        assert!(is_managed(&node(&[(
            CONTROLLER_MANAGED_ANNOTATION,
            "true"
        )])));
        assert!(!is_managed(&node(&[(
            CONTROLLER_MANAGED_ANNOTATION,
            "false"
        )])));
        assert!(!is_managed(&node(&[])));
    }

    #[test]
    fn which_pods_want_their_volumes() {
        let managed = node(&[(CONTROLLER_MANAGED_ANNOTATION, "true")]);
        let keeping = node(&[
            (CONTROLLER_MANAGED_ANNOTATION, "true"),
            (KEEP_TERMINATED_POD_VOLUMES_ANNOTATION, "true"),
        ]);
        let running = pod("Running", false, true);
        let done = pod("Succeeded", false, false);
        assert!(pod_wants_volumes(&running, &managed));
        assert!(!pod_wants_volumes(&done, &managed));
        assert!(
            pod_wants_volumes(&done, &keeping),
            "kept for terminated pods"
        );
        assert!(!pod_wants_volumes(&running, &node(&[])), "not our node");
    }
}
