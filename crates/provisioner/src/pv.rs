//! CreateVolumeResponse → the PersistentVolume, pre-bound to its claim.

use std::collections::BTreeMap;

use csi_spec::v1::Volume;
use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    ObjectReference, PersistentVolume, PersistentVolumeClaim, PersistentVolumeSpec,
    SecretReference, VolumeNodeAffinity,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::secrets::SecretKind;
use crate::{
    DELETION_SECRET_NAME_ANNOTATION, DELETION_SECRET_NAMESPACE_ANNOTATION,
    PROVISIONED_BY_ANNOTATION, PV_FINALIZER,
};

/// Everything the PV is made of.
#[derive(Debug, Clone)]
pub struct Inputs<'a> {
    pub pvc: &'a PersistentVolumeClaim,
    /// The claim's class as stored (not translated): reclaim policy, mount options, name.
    pub class: &'a StorageClass,
    pub driver: &'a str,
    pub pv_name: &'a str,
    pub volume: &'a Volume,
    /// The request's required bytes: the capacity when the driver answers 0.
    pub requested_bytes: i64,
    /// `None` for block volumes.
    pub fs_type: Option<String>,
    /// Resolved secret references by kind (the provisioner's becomes the deletion annotations).
    pub secrets: BTreeMap<SecretKindKey, SecretReference>,
}

/// [`SecretKind`] as a map key.
pub type SecretKindKey = u8;

/// The key of `kind` in [`Inputs::secrets`].
pub fn key(kind: SecretKind) -> SecretKindKey {
    SecretKind::ALL
        .iter()
        .position(|k| *k == kind)
        .and_then(|i| u8::try_from(i).ok())
        .unwrap_or(u8::MAX)
}

/// `2147483648` → `2Gi`, as `resource.NewQuantity(n, BinarySI)` prints.
pub fn binary_quantity(bytes: i64) -> Quantity {
    const SUFFIXES: [(&str, u32); 6] = [
        ("Ei", 60),
        ("Pi", 50),
        ("Ti", 40),
        ("Gi", 30),
        ("Mi", 20),
        ("Ki", 10),
    ];
    for (suffix, shift) in SUFFIXES {
        let unit = 1i64 << shift;
        if bytes != 0 && bytes % unit == 0 {
            return Quantity(format!("{}{suffix}", bytes / unit));
        }
    }
    Quantity(bytes.to_string())
}

/// The CSI PV (a migrated class's PV is translated back by `migration`).
pub fn build(i: &Inputs<'_>) -> PersistentVolume {
    let pvc_spec = i.pvc.spec.clone().unwrap_or_default();
    let capacity = if i.volume.capacity_bytes > 0 {
        i.volume.capacity_bytes
    } else {
        i.requested_bytes
    };
    let secret = |kind| i.secrets.get(&key(kind)).cloned();
    let mut annotations =
        BTreeMap::from([(PROVISIONED_BY_ANNOTATION.to_string(), i.driver.to_string())]);
    if let Some(s) = secret(SecretKind::Provisioner) {
        annotations.insert(
            DELETION_SECRET_NAME_ANNOTATION.into(),
            s.name.unwrap_or_default(),
        );
        annotations.insert(
            DELETION_SECRET_NAMESPACE_ANNOTATION.into(),
            s.namespace.unwrap_or_default(),
        );
    }
    let attributes: BTreeMap<String, String> = i
        .volume
        .volume_context
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let csi = CSIPersistentVolumeSource {
        driver: i.driver.to_string(),
        volume_handle: i.volume.volume_id.clone(),
        fs_type: i.fs_type.clone().filter(|f| !f.is_empty()),
        volume_attributes: (!attributes.is_empty()).then_some(attributes),
        controller_publish_secret_ref: secret(SecretKind::ControllerPublish),
        node_stage_secret_ref: secret(SecretKind::NodeStage),
        node_publish_secret_ref: secret(SecretKind::NodePublish),
        controller_expand_secret_ref: secret(SecretKind::ControllerExpand),
        node_expand_secret_ref: secret(SecretKind::NodeExpand),
        read_only: None,
    };
    let reclaim = i
        .class
        .reclaim_policy
        .clone()
        .unwrap_or_else(|| "Delete".into());
    // Only a volume we will delete needs guarding until DeleteVolume succeeded.
    let finalizers = (reclaim == "Delete").then(|| vec![PV_FINALIZER.to_string()]);
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(i.pv_name.to_string()),
            annotations: Some(annotations),
            finalizers,
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            access_modes: pvc_spec.access_modes.clone(),
            capacity: Some([("storage".to_string(), binary_quantity(capacity))].into()),
            claim_ref: Some(ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("PersistentVolumeClaim".into()),
                namespace: i.pvc.metadata.namespace.clone(),
                name: i.pvc.metadata.name.clone(),
                uid: i.pvc.metadata.uid.clone(),
                ..Default::default()
            }),
            csi: Some(csi),
            mount_options: i.class.mount_options.clone().filter(|m| !m.is_empty()),
            node_affinity: node_affinity(i.volume),
            persistent_volume_reclaim_policy: Some(reclaim),
            storage_class_name: i.class.metadata.name.clone(),
            volume_mode: Some(pvc_spec.volume_mode.unwrap_or_else(|| "Filesystem".into())),
            ..Default::default()
        }),
        status: None,
    }
}

/// One term per accessible topology segment (a node matching any segment can use the volume).
fn node_affinity(volume: &Volume) -> Option<VolumeNodeAffinity> {
    let terms: Vec<NodeSelectorTerm> = volume
        .accessible_topology
        .iter()
        .filter(|t| !t.segments.is_empty())
        .map(|t| {
            let sorted: BTreeMap<_, _> = t.segments.iter().collect();
            NodeSelectorTerm {
                match_expressions: Some(
                    sorted
                        .into_iter()
                        .map(|(k, v)| NodeSelectorRequirement {
                            key: k.clone(),
                            operator: "In".into(),
                            values: Some(vec![v.clone()]),
                        })
                        .collect(),
                ),
                match_fields: None,
            }
        })
        .collect();
    (!terms.is_empty()).then_some(VolumeNodeAffinity {
        required: Some(NodeSelector {
            node_selector_terms: terms,
        }),
    })
}

/// Whether `pv` is the one we make for `pvc` (a 409 on create is then success).
pub fn is_ours_for(
    pv: &PersistentVolume,
    pvc: &PersistentVolumeClaim,
    provisioned_by: &str,
) -> bool {
    let by = pv
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(PROVISIONED_BY_ANNOTATION))
        .map(String::as_str);
    let claim_uid = pv
        .spec
        .as_ref()
        .and_then(|s| s.claim_ref.as_ref())
        .and_then(|c| c.uid.as_deref());
    by == Some(provisioned_by) && claim_uid.is_some() && claim_uid == pvc.metadata.uid.as_deref()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_print_as_binary_si() {
        assert_eq!(binary_quantity(2 << 30).0, "2Gi");
        assert_eq!(binary_quantity(3 << 29).0, "1536Mi");
        assert_eq!(binary_quantity(1000).0, "1000");
        assert_eq!(binary_quantity(0).0, "0");
    }
}
