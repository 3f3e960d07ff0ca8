//! The desired state of the world, from the pods bound to this node (the kubelet's
//! `desiredStateOfWorldPopulator`): every pod that is neither finished nor being deleted wants
//! each of its storage volumes mounted. Recomputed from the watch caches on every pass, so a
//! change to a PVC, PV or CSIDriver is seen without bookkeeping.

use k8s_openapi::api::core::v1::Pod;

use super::cache::{DesiredStateOfWorld, PodToMount};
use super::volume_spec::{SpecContext, SpecOutcome, volume_to_mount};

/// Whether the pod's volumes should be mounted: not finished, not being deleted.
pub fn pod_wants_volumes(pod: &Pod) -> bool {
    if pod.metadata.deletion_timestamp.is_some() {
        return false;
    }
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    !matches!(phase, Some("Succeeded") | Some("Failed"))
}

pub fn populate<'a>(
    ctx: &SpecContext<'_>,
    pods: impl IntoIterator<Item = &'a std::sync::Arc<Pod>>,
) -> DesiredStateOfWorld {
    let mut dsw = DesiredStateOfWorld::default();
    for pod in pods {
        if !pod_wants_volumes(pod) {
            continue;
        }
        let Some(uid) = pod.metadata.uid.clone() else {
            continue;
        };
        let mut entry = PodToMount {
            pod: pod.clone(),
            uid,
            volumes: Vec::new(),
            unresolved: Vec::new(),
            keep_only: Vec::new(),
        };
        let volumes = pod
            .spec
            .as_ref()
            .and_then(|s| s.volumes.as_ref())
            .map(Vec::as_slice)
            .unwrap_or_default();
        for volume in volumes {
            match volume_to_mount(ctx, pod, volume) {
                SpecOutcome::Mount(v) => entry.volumes.push(*v),
                SpecOutcome::NotOurs => {}
                SpecOutcome::Pending(why) | SpecOutcome::Failed(why) => {
                    entry.unresolved.push((volume.name.clone(), why));
                }
                SpecOutcome::KeepOnly(v, why) => entry.keep_only.push((*v, why)),
            }
        }
        dsw.add_pod(entry);
    }
    dsw
}
