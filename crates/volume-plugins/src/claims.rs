//! A pod's `persistentVolumeClaim` → the PV bound to it, as Kubernetes' `CreateVolumeSpec`
//! resolves it. The attach/detach controller and the node agent both resolve claims here, so
//! they agree on when a claim's volume exists and which PV it is.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod, Volume};

use component_runtime::ObjectCache;

/// Why a claim has no usable PV.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimProblem {
    /// Not yet: the PVC or PV is not there, or not bound. It may resolve later; the message
    /// says what is missing.
    Pending(String),
    /// Never as written: the PVC names a PV whose `claimRef` points at another claim.
    /// `pv`: the PV's name.
    Mismatch { pv: String, reason: String },
    /// A generic ephemeral volume's claim exists but the pod does not control it.
    NotOwned(String),
}

/// The PV bound to claim `namespace/claim`: the PVC must be `Bound` with a `volumeName`, the
/// PV must be there, and its `claimRef` (if any) must point back at this PVC (name, namespace
/// and, when both have one, UID).
pub fn bound_pv(
    pvcs: &ObjectCache<PersistentVolumeClaim>,
    pvs: &ObjectCache<PersistentVolume>,
    namespace: &str,
    claim: &str,
) -> Result<Arc<PersistentVolume>, ClaimProblem> {
    let pvc = pvcs
        .get_namespaced(namespace, claim)
        .ok_or_else(|| ClaimProblem::Pending(format!("PVC {namespace}/{claim} not found")))?;
    let pv_name = pvc
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .filter(|n| !n.is_empty());
    let phase = pvc.status.as_ref().and_then(|s| s.phase.as_deref());
    let (Some(pv_name), Some("Bound")) = (pv_name, phase) else {
        return Err(ClaimProblem::Pending(format!(
            "PVC {namespace}/{claim} is not bound yet"
        )));
    };
    let pv = pvs.get(&pv_name).ok_or_else(|| {
        ClaimProblem::Pending(format!("PV {pv_name} of PVC {namespace}/{claim} not found"))
    })?;
    if let Some(claim_ref) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) {
        let uid_differs = matches!(
            (&claim_ref.uid, &pvc.metadata.uid),
            (Some(a), Some(b)) if a != b
        );
        if claim_ref.name.as_deref() != Some(claim)
            || claim_ref.namespace.as_deref() != Some(namespace)
            || uid_differs
        {
            return Err(ClaimProblem::Mismatch {
                reason: format!(
                    "PVC {namespace}/{claim} names PV {pv_name}, but the PV's spec.claimRef points at another claim"
                ),
                pv: pv_name,
            });
        }
    }
    Ok(pv)
}

/// The claim of a generic ephemeral volume: `<pod>-<volume>` (Kubernetes'
/// `ephemeral.VolumeClaimName`).
pub fn ephemeral_claim_name(pod: &Pod, volume: &Volume) -> String {
    format!(
        "{}-{}",
        pod.metadata.name.as_deref().unwrap_or_default(),
        volume.name
    )
}

/// The name of the claim a generic ephemeral volume of `pod` resolves to, when the claim
/// exists and the pod controls it (the ephemeral-volume controller made it for the pod: an
/// ownerReference with `controller: true` and the pod's UID). A claim of that name the pod
/// does not control is someone else's and never used for it (Kubernetes'
/// `ephemeral.VolumeIsForPod`): [`ClaimProblem::NotOwned`].
pub fn ephemeral_claim(
    pvcs: &ObjectCache<PersistentVolumeClaim>,
    pod: &Pod,
    volume: &Volume,
) -> Result<String, ClaimProblem> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
    let claim = ephemeral_claim_name(pod, volume);
    let Some(pvc) = pvcs.get_namespaced(namespace, &claim) else {
        return Err(ClaimProblem::Pending(format!(
            "waiting for PVC {namespace}/{claim} of generic ephemeral volume \"{}\" (the ephemeral-volume controller creates it)",
            volume.name
        )));
    };
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let controlled = pvc
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.uid == uid && o.kind == "Pod");
    if !controlled {
        return Err(ClaimProblem::NotOwned(format!(
            "PVC {namespace}/{claim} was not created for pod {namespace}/{pod_name} (pod is not owner)"
        )));
    }
    Ok(claim)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ObjectReference, PersistentVolumeClaimSpec, PersistentVolumeClaimStatus,
        PersistentVolumeSpec,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pvc(volume: Option<&str>, phase: &str) -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some("c".into()),
                namespace: Some("ns".into()),
                uid: Some("uid-c".into()),
                ..Default::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                volume_name: volume.map(str::to_string),
                ..Default::default()
            }),
            status: Some(PersistentVolumeClaimStatus {
                phase: Some(phase.into()),
                ..Default::default()
            }),
        }
    }

    fn pv(claim: &str, uid: &str) -> PersistentVolume {
        PersistentVolume {
            metadata: ObjectMeta {
                name: Some("pv-1".into()),
                ..Default::default()
            },
            spec: Some(PersistentVolumeSpec {
                claim_ref: Some(ObjectReference {
                    name: Some(claim.into()),
                    namespace: Some("ns".into()),
                    uid: Some(uid.into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn resolve(
        pvcs: Vec<PersistentVolumeClaim>,
        pvs: Vec<PersistentVolume>,
    ) -> Result<Arc<PersistentVolume>, ClaimProblem> {
        bound_pv(
            &ObjectCache::from_objects(pvcs),
            &ObjectCache::from_objects(pvs),
            "ns",
            "c",
        )
    }

    #[test]
    fn a_bound_claim_resolves_to_its_pv() {
        let got = resolve(vec![pvc(Some("pv-1"), "Bound")], vec![pv("c", "uid-c")]).unwrap();
        assert_eq!(got.metadata.name.as_deref(), Some("pv-1"));
    }

    #[test]
    fn missing_or_unbound_claims_are_pending_and_a_foreign_pv_is_a_mismatch() {
        let pending = |r: Result<_, ClaimProblem>, want: &str| match r {
            Err(ClaimProblem::Pending(m)) => assert!(m.contains(want), "{m}"),
            other => panic!("expected pending ({want}), got {other:?}"),
        };
        pending(resolve(vec![], vec![]), "PVC ns/c not found");
        pending(resolve(vec![pvc(None, "Pending")], vec![]), "not bound yet");
        pending(
            resolve(vec![pvc(Some("pv-1"), "Pending")], vec![]),
            "not bound yet",
        );
        pending(
            resolve(vec![pvc(Some("pv-1"), "Bound")], vec![]),
            "PV pv-1 of PVC ns/c not found",
        );
        for foreign in [pv("other", "uid-c"), pv("c", "uid-other")] {
            match resolve(vec![pvc(Some("pv-1"), "Bound")], vec![foreign]) {
                Err(ClaimProblem::Mismatch { pv, reason }) => {
                    assert_eq!(pv, "pv-1");
                    assert!(reason.contains("claimRef"), "{reason}");
                }
                other => panic!("expected a mismatch, got {other:?}"),
            }
        }
    }
}
