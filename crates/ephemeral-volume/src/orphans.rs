//! The garbage collector's part for claims, on clusters without one (apiserver-lite, so
//! csi-cluster): a claim whose ownerReferences all name Pods, none of which exists any more
//! (no pod of that name, or one with another UID: a new pod of the same name is not the
//! owner), is deleted, as the garbage collector's background deletion would. A claim with any
//! other owner (a StatefulSet, say) is left to whoever handles that owner.
//!
//! The pod cache may lag behind the claim cache (a pod created just before its claim), so a
//! pod the cache lacks is read from the API server before its claims go, as the garbage
//! collector reads an owner it has not seen. The delete carries the claim's UID as a
//! precondition: a claim of the same name made in between stays.

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::Api;
use kube::api::{DeleteParams, Preconditions};

use crate::context::Ctx;

/// Whether every reference of `claim` is a v1 Pod (and there is at least one).
fn owned_by_pods_only(claim: &PersistentVolumeClaim) -> bool {
    let refs = claim
        .metadata
        .owner_references
        .as_deref()
        .unwrap_or_default();
    !refs.is_empty()
        && refs
            .iter()
            .all(|r| r.kind == "Pod" && r.api_version == "v1")
}

/// Deletes the claims whose owner pods are all gone; returns each attempt's backoff key,
/// fingerprint and outcome.
pub(crate) async fn collect(ctx: &Ctx) -> Vec<(String, String, bool)> {
    let mut outcomes = Vec::new();
    for claim in ctx.caches.claims.list() {
        if claim.metadata.deletion_timestamp.is_some() || !owned_by_pods_only(&claim) {
            continue;
        }
        let namespace = claim.metadata.namespace.as_deref().unwrap_or_default();
        let name = claim.metadata.name.as_deref().unwrap_or_default();
        let refs = claim
            .metadata
            .owner_references
            .as_deref()
            .unwrap_or_default();
        let cached_owner = refs.iter().any(|r| {
            ctx.caches
                .pods
                .get_namespaced(namespace, &r.name)
                .is_some_and(|p| p.metadata.uid.as_deref() == Some(r.uid.as_str()))
        });
        if cached_owner {
            continue;
        }
        let key = format!("orphan/{namespace}/{name}");
        let print = claim.metadata.resource_version.clone().unwrap_or_default();
        if ctx.failures.backing_off(&key, &print) {
            continue;
        }
        let result = delete_if_orphaned(ctx, &claim, namespace, name).await;
        if let Err(e) = &result {
            tracing::warn!(claim = %format!("{namespace}/{name}"), error = %e, "deleting a claim whose pods are gone failed; retried with backoff");
        }
        outcomes.push((key, print, result.is_ok()));
    }
    outcomes
}

async fn delete_if_orphaned(
    ctx: &Ctx,
    claim: &PersistentVolumeClaim,
    namespace: &str,
    name: &str,
) -> Result<(), kube::Error> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
    for r in claim.metadata.owner_references.iter().flatten() {
        if let Some(p) = pods.get_opt(&r.name).await? {
            if p.metadata.uid.as_deref() == Some(r.uid.as_str()) {
                return Ok(());
            }
        }
    }
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), namespace);
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: claim.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::background()
    };
    let result = claims.delete(name, &params).await;
    ctx.forget(namespace, name);
    match result {
        Ok(_) => {
            tracing::info!(claim = %format!("{namespace}/{name}"), "deleted a claim whose owner pods are gone");
            Ok(())
        }
        // Gone already, or replaced by a claim of the same name (precondition failed).
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn claim(owners: serde_json::Value) -> PersistentVolumeClaim {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "c", "namespace": "ns", "ownerReferences": owners}
        }))
        .unwrap()
    }

    #[test]
    fn only_claims_owned_by_pods_alone_are_collected() {
        let pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u"});
        let set = serde_json::json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "s", "uid": "v"});
        assert!(owned_by_pods_only(&claim(serde_json::json!([pod.clone()]))));
        assert!(!owned_by_pods_only(&claim(serde_json::json!([pod, set]))));
        assert!(!owned_by_pods_only(&claim(serde_json::json!([]))));
        assert!(!owned_by_pods_only(&PersistentVolumeClaim::default()));
    }
}
