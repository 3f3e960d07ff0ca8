//! Which PVs we delete, and with what: a Released PV with reclaim policy Delete that we
//! provisioned (or an in-tree PV migrated to our driver).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PersistentVolume, SecretReference};

use crate::{
    DELETION_SECRET_NAME_ANNOTATION, DELETION_SECRET_NAMESPACE_ANNOTATION, Error,
    MIGRATED_TO_ANNOTATION, PROVISIONED_BY_ANNOTATION,
};

/// What DeleteVolume needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    pub volume_handle: String,
    pub secret: SecretSource,
    pub migrated: bool,
}

/// Where DeleteVolume's secret comes from, as the Go sidecar decides it.
#[derive(Debug, Clone, PartialEq)]
pub enum SecretSource {
    /// The PV carries both `provisioner-deletion-secret-*` annotations (every PV the Go
    /// sidecar v3+ or we write has them): the secret they name, `None` when they are empty
    /// (no secret) or only one of them is.
    Annotated(Option<SecretReference>),
    /// A PV without them (written by an older provisioner): the provisioner secret of the
    /// PV's StorageClass, resolved for the claim in its claimRef, if the class still exists.
    FromClass,
}

fn annotation<'a>(pv: &'a PersistentVolume, key: &str) -> Option<&'a str> {
    pv.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// Whether `driver` provisioned `pv` (directly, or for a migrated in-tree class).
pub fn is_ours(pv: &PersistentVolume, driver: &str) -> bool {
    match annotation(pv, PROVISIONED_BY_ANNOTATION) {
        Some(by) if by == driver => true,
        Some(by) => {
            csi_translation::csi_name_from_in_tree_name(by).ok() == Some(driver)
                && annotation(pv, MIGRATED_TO_ANNOTATION) == Some(driver)
        }
        None => false,
    }
}

/// The DeleteVolume target when `pv` should be deleted now, `Ok(None)` when not.
pub fn target(pv: &PersistentVolume, driver: &str) -> Result<Option<Target>, Error> {
    let spec = pv.spec.clone().unwrap_or_default();
    let phase = pv.status.as_ref().and_then(|s| s.phase.as_deref());
    let released = phase == Some("Released") || phase == Some("Failed");
    if !released
        || spec.persistent_volume_reclaim_policy.as_deref() != Some("Delete")
        || !is_ours(pv, driver)
    {
        return Ok(None);
    }
    let (handle, migrated) = match &spec.csi {
        Some(csi) if csi.driver == driver => (csi.volume_handle.clone(), false),
        Some(_) => return Ok(None),
        None => {
            let csi_pv = crate::migration::to_csi(pv)?;
            let handle = csi_pv
                .spec
                .and_then(|s| s.csi)
                .map(|c| c.volume_handle)
                .unwrap_or_default();
            (handle, true)
        }
    };
    let secret = match (
        annotation(pv, DELETION_SECRET_NAME_ANNOTATION),
        annotation(pv, DELETION_SECRET_NAMESPACE_ANNOTATION),
    ) {
        (Some(name), Some(ns)) if !name.is_empty() && !ns.is_empty() => {
            SecretSource::Annotated(Some(SecretReference {
                name: Some(name.into()),
                namespace: Some(ns.into()),
            }))
        }
        (Some(_), Some(_)) => SecretSource::Annotated(None),
        _ => SecretSource::FromClass,
    };
    Ok(Some(Target {
        volume_handle: handle,
        secret,
        migrated,
    }))
}

/// Whether `pv`'s required node affinity admits node `node` with `labels`: what a provisioner
/// deployed on that node (`--node-deployment`) checks before it deletes a volume, since only
/// the driver on the volume's node can delete it. A PV without node affinity is on no node in
/// particular, so no node-deployed provisioner claims it.
pub fn on_node(pv: &PersistentVolume, node: &str, labels: &BTreeMap<String, String>) -> bool {
    let Some(terms) = pv
        .spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
        .map(|r| &r.node_selector_terms)
    else {
        return false;
    };
    component_runtime::node_selector::terms_match(terms, node, labels)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn pv_on(key: &str, value: &str) -> PersistentVolume {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pv"},
            "spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": key, "operator": "In", "values": [value]}]}
            ]}}}
        }))
        .unwrap()
    }

    fn released(annotations: serde_json::Value) -> PersistentVolume {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pv", "annotations": annotations},
            "spec": {"persistentVolumeReclaimPolicy": "Delete",
                     "csi": {"driver": "d", "volumeHandle": "h"}},
            "status": {"phase": "Released"},
        }))
        .unwrap()
    }

    #[test]
    fn the_deletion_secret_comes_from_the_annotations_when_the_pv_has_both() {
        let secret = |a| target(&released(a), "d").unwrap().unwrap().secret;
        assert_eq!(
            secret(serde_json::json!({
                PROVISIONED_BY_ANNOTATION: "d",
                DELETION_SECRET_NAME_ANNOTATION: "s",
                DELETION_SECRET_NAMESPACE_ANNOTATION: "ns",
            })),
            SecretSource::Annotated(Some(SecretReference {
                name: Some("s".into()),
                namespace: Some("ns".into())
            }))
        );
        // Empty (the Go sidecar's "no secret"), or only one of them: no secret.
        assert_eq!(
            secret(serde_json::json!({
                PROVISIONED_BY_ANNOTATION: "d",
                DELETION_SECRET_NAME_ANNOTATION: "",
                DELETION_SECRET_NAMESPACE_ANNOTATION: "",
            })),
            SecretSource::Annotated(None)
        );
        assert_eq!(
            secret(serde_json::json!({
                PROVISIONED_BY_ANNOTATION: "d",
                DELETION_SECRET_NAME_ANNOTATION: "s",
                DELETION_SECRET_NAMESPACE_ANNOTATION: "",
            })),
            SecretSource::Annotated(None)
        );
        // Neither: the class's.
        assert_eq!(
            secret(serde_json::json!({PROVISIONED_BY_ANNOTATION: "d"})),
            SecretSource::FromClass
        );
        assert_eq!(
            secret(serde_json::json!({
                PROVISIONED_BY_ANNOTATION: "d",
                DELETION_SECRET_NAME_ANNOTATION: "s",
            })),
            SecretSource::FromClass
        );
    }

    #[test]
    fn a_volume_is_on_the_node_its_affinity_names() {
        let labels: BTreeMap<String, String> =
            [("topology.hostpath.csi/node".to_string(), "n1".to_string())].into();
        assert!(on_node(
            &pv_on("topology.hostpath.csi/node", "n1"),
            "n1",
            &labels
        ));
        assert!(!on_node(
            &pv_on("topology.hostpath.csi/node", "n2"),
            "n1",
            &labels
        ));
        assert!(!on_node(&pv_on("other", "n1"), "n1", &labels));
        let mut no_affinity = pv_on("k", "v");
        no_affinity.spec.as_mut().unwrap().node_affinity = None;
        assert!(!on_node(&no_affinity, "n1", &labels));
    }
}
