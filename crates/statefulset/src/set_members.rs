//! The objects a set owns, built as Kubernetes' StatefulSet controller builds them: pod
//! `<set>-<ordinal>` from `spec.template` (labels plus the pod-name and pod-index labels,
//! hostname = pod name, subdomain = `spec.serviceName`, a controller ownerReference), and per
//! `volumeClaimTemplates` entry a claim `<template>-<set>-<ordinal>` (labels of the set's
//! selector), wired into the pod as the volume named after the template.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use serde_json::{Value, json};

use crate::{Error, labels};

pub(crate) fn set_name(set: &StatefulSet) -> &str {
    set.metadata.name.as_deref().unwrap_or_default()
}

pub(crate) fn pod_name(set: &StatefulSet, ordinal: i32) -> String {
    format!("{}-{ordinal}", set_name(set))
}

/// The ordinal of a pod of `set`, from its name.
pub(crate) fn ordinal_of(set_name: &str, pod_name: &str) -> Option<i32> {
    let rest = pod_name.strip_prefix(set_name)?.strip_prefix('-')?;
    if rest.is_empty() || !rest.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    rest.parse().ok()
}

pub(crate) fn claim_templates(set: &StatefulSet) -> Vec<&PersistentVolumeClaim> {
    set.spec
        .as_ref()
        .and_then(|s| s.volume_claim_templates.as_ref())
        .map(|t| t.iter().collect())
        .unwrap_or_default()
}

pub(crate) fn claim_name(
    template: &PersistentVolumeClaim,
    set: &StatefulSet,
    ordinal: i32,
) -> String {
    format!(
        "{}-{}-{ordinal}",
        template.metadata.name.as_deref().unwrap_or_default(),
        set_name(set)
    )
}

/// The ownerReference that makes `set` the controller of an object.
pub(crate) fn owner_reference(set: &StatefulSet, controller: bool) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "name": set_name(set),
        "uid": set.metadata.uid,
        "controller": controller,
        "blockOwnerDeletion": true,
    })
}

/// The uid of the StatefulSet that controls `meta`'s object, if one does.
pub(crate) fn controller_set_uid(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Option<&str> {
    meta.owner_references
        .as_ref()?
        .iter()
        .find(|o| o.kind == "StatefulSet" && o.api_version.starts_with("apps/"))
        .map(|o| o.uid.as_str())
}

fn invalid(set: &StatefulSet, reason: impl Into<String>) -> Error {
    Error::Invalid {
        set: set_name(set).to_string(),
        reason: reason.into(),
    }
}

/// Pod `ordinal` of `set`.
pub(crate) fn pod(set: &StatefulSet, ordinal: i32) -> Result<Pod, Error> {
    let spec = set
        .spec
        .as_ref()
        .ok_or_else(|| invalid(set, "spec is missing"))?;
    let template = serde_json::to_value(&spec.template)
        .map_err(|e| invalid(set, format!("spec.template: {e}")))?;
    let name = pod_name(set, ordinal);
    let mut metadata = template
        .get("metadata")
        .cloned()
        .unwrap_or_else(|| json!({}));
    metadata["name"] = json!(name);
    metadata["namespace"] = json!(set.metadata.namespace);
    if metadata.get("labels").is_none_or(Value::is_null) {
        metadata["labels"] = json!({});
    }
    metadata["labels"][labels::POD_NAME] = json!(name);
    metadata["labels"][labels::POD_INDEX] = json!(ordinal.to_string());
    metadata["ownerReferences"] = json!([owner_reference(set, true)]);
    let mut pod_spec = template.get("spec").cloned().unwrap_or_else(|| json!({}));
    pod_spec["hostname"] = json!(name);
    if let Some(service) = spec.service_name.as_deref().filter(|s| !s.is_empty()) {
        pod_spec["subdomain"] = json!(service);
    }
    let templates = claim_templates(set);
    if !templates.is_empty() {
        let mut volumes: Vec<Value> = pod_spec
            .get("volumes")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for t in templates {
            let volume_name = t.metadata.name.clone().unwrap_or_default();
            volumes.retain(|v| v.get("name").and_then(Value::as_str) != Some(volume_name.as_str()));
            volumes.push(json!({
                "name": volume_name,
                "persistentVolumeClaim": {"claimName": claim_name(t, set, ordinal)},
            }));
        }
        pod_spec["volumes"] = json!(volumes);
    }
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": pod_spec,
    }))
    .map_err(|e| invalid(set, format!("spec.template is not a pod template: {e}")))
}

/// The claims of pod `ordinal`, one per `volumeClaimTemplates` entry. `owned`: the set owns
/// them (`whenDeleted: Delete`), so they go with it.
pub(crate) fn claims(
    set: &StatefulSet,
    ordinal: i32,
    owned: bool,
) -> Result<Vec<PersistentVolumeClaim>, Error> {
    let selector_labels = set
        .spec
        .as_ref()
        .and_then(|s| s.selector.match_labels.clone())
        .unwrap_or_default();
    claim_templates(set)
        .into_iter()
        .map(|t| {
            let mut claim = t.clone();
            claim.metadata.name = Some(claim_name(t, set, ordinal));
            claim.metadata.namespace = set.metadata.namespace.clone();
            claim.metadata.resource_version = None;
            claim.metadata.uid = None;
            claim.metadata.creation_timestamp = None;
            claim.status = None;
            let mut l = claim.metadata.labels.take().unwrap_or_default();
            l.extend(selector_labels.clone());
            claim.metadata.labels = Some(l);
            if owned {
                let owner = serde_json::from_value(owner_reference(set, false))
                    .map_err(|e| invalid(set, format!("ownerReference: {e}")))?;
                claim.metadata.owner_references = Some(vec![owner]);
            }
            Ok(claim)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn set() -> StatefulSet {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "u-1"},
            "spec": {
                "replicas": 3,
                "serviceName": "nginx",
                "selector": {"matchLabels": {"app": "nginx"}},
                "template": {
                    "metadata": {"labels": {"app": "nginx"}},
                    "spec": {"containers": [{"name": "c", "image": "nginx",
                        "volumeMounts": [{"name": "www", "mountPath": "/usr/share/nginx/html"}]}]}
                },
                "volumeClaimTemplates": [{
                    "metadata": {"name": "www"},
                    "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "hostpath",
                        "resources": {"requests": {"storage": "1Gi"}}}
                }]
            }
        }))
        .unwrap()
    }

    #[test]
    fn pods_and_claims_are_named_and_wired_as_kubernetes_does() {
        let s = set();
        let p = pod(&s, 2).unwrap();
        assert_eq!(p.metadata.name.as_deref(), Some("web-2"));
        let l = p.metadata.labels.as_ref().unwrap();
        assert_eq!(l["app"], "nginx");
        assert_eq!(l[labels::POD_NAME], "web-2");
        assert_eq!(l[labels::POD_INDEX], "2");
        let owner = &p.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!((owner.uid.as_str(), owner.controller), ("u-1", Some(true)));
        let spec = p.spec.unwrap();
        assert_eq!(spec.hostname.as_deref(), Some("web-2"));
        assert_eq!(spec.subdomain.as_deref(), Some("nginx"));
        let v = &spec.volumes.unwrap()[0];
        assert_eq!(v.name, "www");
        assert_eq!(
            v.persistent_volume_claim.as_ref().unwrap().claim_name,
            "www-web-2"
        );
        let c = claims(&s, 2, false).unwrap();
        assert_eq!(c[0].metadata.name.as_deref(), Some("www-web-2"));
        assert_eq!(c[0].metadata.labels.as_ref().unwrap()["app"], "nginx");
        assert!(c[0].metadata.owner_references.is_none());
        assert!(
            claims(&s, 0, true).unwrap()[0]
                .metadata
                .owner_references
                .is_some()
        );
    }

    #[test]
    fn ordinals_come_from_names() {
        assert_eq!(ordinal_of("web", "web-12"), Some(12));
        assert_eq!(ordinal_of("web", "web-x"), None);
        assert_eq!(ordinal_of("web", "webby-1"), None);
        assert_eq!(ordinal_of("web", "web-"), None);
    }
}
