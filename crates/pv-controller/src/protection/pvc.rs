//! The `kubernetes.io/pvc-protection` finalizer.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};

use super::{Writer, finalizers_patch, unless_gone};
use crate::Error;
use crate::names::PVC_PROTECTION_FINALIZER;

/// Whether a pod holds the claims it names: it is scheduled (the kubelet only starts pods
/// bound to a node, and refuses a claim being deleted for a new one), whatever its phase, as
/// kcm v1.26: a Succeeded or Failed pod's volumes are still mounted until the kubelet has
/// torn them down, and only the pod's deletion says it has.
fn pod_holds_claims(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty())
}

/// The claims a pod names: its `persistentVolumeClaim` volumes and the claims
/// `<pod>-<volume>` of its generic ephemeral volumes.
pub(crate) fn claims_of(pod: &Pod) -> impl Iterator<Item = (String, String)> + '_ {
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let pod_name = pod.metadata.name.clone().unwrap_or_default();
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(move |v| match (&v.persistent_volume_claim, &v.ephemeral) {
            (Some(c), _) => Some(c.claim_name.clone()),
            (None, Some(_)) => Some(format!("{pod_name}-{}", v.name)),
            (None, None) => None,
        })
        .map(move |claim| (namespace.clone(), claim))
}

/// For each claim, `(namespace, claim)` → the sorted names of the pods in its namespace that
/// use it (a `persistentVolumeClaim` volume, or a generic ephemeral volume, whose claim is
/// `<pod>-<volume>`) and are not scheduled yet: kcm's `findNonScheduledPodsByPVC`, for the
/// `WaitForPodScheduled` Event. Built once per pass: asking the pod list per claim was
/// 5,000 × 5,000 checks per pass in a 5,000-pod burst.
pub(crate) fn unscheduled_pods_by_claim(
    pods: &[Arc<Pod>],
) -> HashMap<(String, String), Vec<String>> {
    let mut out: HashMap<(String, String), Vec<String>> = HashMap::new();
    for p in pods {
        let scheduled = p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .is_some_and(|n| !n.is_empty());
        let (Some(namespace), Some(pod_name)) = (&p.metadata.namespace, &p.metadata.name) else {
            continue;
        };
        if scheduled {
            continue;
        }
        for v in p.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
            let claim = match (&v.persistent_volume_claim, &v.ephemeral) {
                (Some(c), _) => c.claim_name.clone(),
                (None, Some(_)) => format!("{pod_name}-{}", v.name),
                (None, None) => continue,
            };
            let names = out.entry((namespace.clone(), claim)).or_default();
            if !names.contains(pod_name) {
                names.push(pod_name.clone());
            }
        }
    }
    for names in out.values_mut() {
        names.sort();
    }
    out
}

/// `(namespace, claim)` of every claim a pod holds.
pub(crate) fn claims_in_use(pods: &[Arc<Pod>]) -> HashSet<(String, String)> {
    pods.iter()
        .filter(|p| pod_holds_claims(p))
        .flat_map(|p| claims_of(p).collect::<Vec<_>>())
        .collect()
}

pub(crate) async fn sync(
    ctx: &impl Writer,
    claim: &PersistentVolumeClaim,
    in_use: &HashSet<(String, String)>,
) -> Result<(), Error> {
    let namespace = claim.metadata.namespace.clone().unwrap_or_default();
    let name = claim.metadata.name.clone().unwrap_or_default();
    let finalizers = claim.metadata.finalizers.clone().unwrap_or_default();
    let has = finalizers.iter().any(|f| f == PVC_PROTECTION_FINALIZER);
    let deleting = claim.metadata.deletion_timestamp.is_some();
    let list = if !deleting && !has {
        let mut list = finalizers.clone();
        list.push(PVC_PROTECTION_FINALIZER.to_string());
        list
    } else if deleting && has {
        if in_use.contains(&(namespace.clone(), name.clone()))
            || used_now(ctx, &namespace, &name).await?
        {
            return Ok(());
        }
        finalizers
            .iter()
            .filter(|f| *f != PVC_PROTECTION_FINALIZER)
            .cloned()
            .collect()
    } else {
        return Ok(());
    };
    let patch = finalizers_patch(&list, claim.metadata.resource_version.as_deref());
    let written = Api::<PersistentVolumeClaim>::namespaced(ctx.client().clone(), &namespace)
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await;
    let Some(updated) = unless_gone(written).map_err(|e| {
        Error::kube(
            format!("updating the finalizers of PersistentVolumeClaim {namespace}/{name}"),
            e,
        )
    })?
    else {
        tracing::debug!(claim = %format!("{namespace}/{name}"), "pvc-protection finalizer: the claim is already gone");
        return Ok(());
    };
    tracing::info!(claim = %format!("{namespace}/{name}"), removed = deleting, "pvc-protection finalizer");
    ctx.remember_claim(updated);
    Ok(())
}

/// The API server's word (not the cache's) before a finalizer goes: a pod created a moment ago
/// may not be in the cache yet (kcm asks the same way).
async fn used_now(ctx: &impl Writer, namespace: &str, claim: &str) -> Result<bool, Error> {
    let api: Api<Pod> = Api::namespaced(ctx.client().clone(), namespace);
    let pods = api
        .list(&ListParams::default())
        .await
        .map_err(|e| Error::kube(format!("listing pods in {namespace}"), e))?;
    Ok(pods
        .items
        .iter()
        .filter(|p| pod_holds_claims(p))
        .any(|p| claims_of(p).any(|(_, c)| c == claim)))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use serde_json::json;

    fn pod(node: &str, phase: &str) -> Arc<Pod> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": "p", "namespace": "ns"},
                "spec": {"nodeName": node, "containers": [], "volumes": [
                    {"name": "v", "persistentVolumeClaim": {"claimName": "data"}}
                ]},
                "status": {"phase": phase}
            }))
            .unwrap(),
        )
    }

    #[test]
    fn unscheduled_pods_are_found_by_claim_and_ephemeral_volume() {
        let mk = |name: &str, node: Option<&str>, volumes: serde_json::Value| -> Arc<Pod> {
            Arc::new(
                serde_json::from_value(serde_json::json!({
                    "metadata": {"name": name, "namespace": "ns"},
                    "spec": {"nodeName": node, "containers": [], "volumes": volumes}
                }))
                .unwrap(),
            )
        };
        let uses = serde_json::json!([{"name": "v", "persistentVolumeClaim": {"claimName": "c"}}]);
        let pods = vec![
            mk("b", None, uses.clone()),
            mk("a", Some(""), uses.clone()),
            mk("on-node", Some("n1"), uses.clone()),
            mk(
                "other",
                None,
                serde_json::json!([{"name": "v", "persistentVolumeClaim": {"claimName": "x"}}]),
            ),
            mk(
                "eph",
                None,
                serde_json::json!([{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}]),
            ),
        ];
        let by_claim = unscheduled_pods_by_claim(&pods);
        let of = |ns: &str, c: &str| by_claim.get(&(ns.to_string(), c.to_string())).cloned();
        assert_eq!(of("ns", "c"), Some(vec!["a".to_string(), "b".to_string()]));
        assert_eq!(of("other-ns", "c"), None);
        assert_eq!(of("ns", "eph-scratch"), Some(vec!["eph".to_string()]));
    }

    #[test]
    fn scheduled_pods_hold_their_claims_until_they_are_gone() {
        let key = ("ns".to_string(), "data".to_string());
        assert!(claims_in_use(&[pod("n1", "Running")]).contains(&key));
        assert!(claims_in_use(&[pod("n1", "Pending")]).contains(&key));
        assert!(claims_in_use(&[pod("", "Pending")]).is_empty());
        // Finished, but the node may still be unmounting: held until the pod is deleted.
        assert!(claims_in_use(&[pod("n1", "Succeeded")]).contains(&key));
        assert!(claims_in_use(&[pod("n1", "Failed")]).contains(&key));
        // A generic ephemeral volume's claim is held the same way.
        let eph: Arc<Pod> = Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": "web", "namespace": "ns"},
                "spec": {"nodeName": "n1", "containers": [], "volumes": [
                    {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}
                ]},
            }))
            .unwrap(),
        );
        assert!(claims_in_use(&[eph]).contains(&("ns".to_string(), "web-scratch".to_string())));
    }
}
