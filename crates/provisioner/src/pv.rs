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
    PROVISIONED_BY_ANNOTATION, PROVISIONER_IDENTITY_ATTRIBUTE, PV_FINALIZER,
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
    /// This provisioner's [`identity`], stamped into the volume attributes.
    pub identity: &'a str,
}

/// The identity of a provisioner started now for `driver`, as the Go sidecar makes it at
/// start-up: `<unix time in ms>-<random 0..9999>-<driver>`.
pub fn identity(driver: &str) -> String {
    use std::hash::{BuildHasher, Hasher};
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    // RandomState is seeded from the OS per process: enough for a tie-breaker.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(millis);
    let random = h.finish() % 10_000;
    format!("{millis}-{random}-{driver}")
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
    // The deletion-secret annotations are written always, empty without a provisioner
    // secret, as the Go sidecar writes them: a PV with both is deleted from them alone.
    let deletion = secret(SecretKind::Provisioner).unwrap_or_default();
    let annotations = BTreeMap::from([
        (PROVISIONED_BY_ANNOTATION.to_string(), i.driver.to_string()),
        (
            DELETION_SECRET_NAME_ANNOTATION.to_string(),
            deletion.name.unwrap_or_default(),
        ),
        (
            DELETION_SECRET_NAMESPACE_ANNOTATION.to_string(),
            deletion.namespace.unwrap_or_default(),
        ),
    ]);
    // The identity first: the driver's volume context wins a clash, as in Go.
    let mut attributes = BTreeMap::from([(
        PROVISIONER_IDENTITY_ATTRIBUTE.to_string(),
        i.identity.to_string(),
    )]);
    attributes.extend(
        i.volume
            .volume_context
            .iter()
            .map(|(k, v)| (k.clone(), v.clone())),
    );
    let csi = CSIPersistentVolumeSource {
        driver: i.driver.to_string(),
        volume_handle: i.volume.volume_id.clone(),
        fs_type: i.fs_type.clone().filter(|f| !f.is_empty()),
        volume_attributes: Some(attributes),
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
    fn the_identity_is_time_random_driver() {
        let id = identity("ebs.csi.aws.com");
        let parts: Vec<&str> = id.splitn(3, '-').collect();
        assert_eq!(parts.len(), 3, "{id}");
        let millis: u128 = parts[0].parse().unwrap();
        assert!(millis > 1_600_000_000_000, "{id}");
        assert!(parts[1].parse::<u32>().unwrap() < 10_000, "{id}");
        assert_eq!(parts[2], "ebs.csi.aws.com");
    }

    #[test]
    fn quantities_print_as_binary_si() {
        assert_eq!(binary_quantity(2 << 30).0, "2Gi");
        assert_eq!(binary_quantity(3 << 29).0, "1536Mi");
        assert_eq!(binary_quantity(1000).0, "1000");
        assert_eq!(binary_quantity(0).0, "0");
    }
}
