//! The Kubernetes objects tests across the workspace create the same way: a labelled Node, a
//! CSINode, a CSIDriver, a CSI PersistentVolume, a claim, a VolumeAttachment. Each builder sets
//! only what its doc says; a test changes the rest on the value it gets. [`create_json`]
//! creates an object a test wrote as JSON.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, Node, PersistentVolume, PersistentVolumeClaim,
    PersistentVolumeClaimSpec, PersistentVolumeSpec, VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::{
    CSIDriver, CSIDriverSpec, CSINode, CSINodeDriver, CSINodeSpec, VolumeAttachment,
    VolumeAttachmentSource, VolumeAttachmentSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// Creates `obj` (JSON of a `K`) through `api` (an `Api` or a reference to one) and returns what
/// the server stored; panics naming the kind and the name when it is not a `K` or the server
/// refuses it.
pub async fn create_json<K>(
    api: impl std::borrow::Borrow<kube::Api<K>>,
    obj: serde_json::Value,
) -> K
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
{
    let (what, obj) = typed::<K>(obj);
    api.borrow()
        .create(&kube::api::PostParams::default(), &obj)
        .await
        .unwrap_or_else(|e| panic!("creating {what}: {e}"))
}

/// `obj` as a `K`, and `Kind "name"` for messages; panics naming them when it is not one.
fn typed<K>(obj: serde_json::Value) -> (String, K)
where
    K: kube::Resource<DynamicType = ()> + serde::de::DeserializeOwned,
{
    let what = format!("{} {}", K::kind(&()), obj["metadata"]["name"]);
    match serde_json::from_value(obj) {
        Ok(k) => (what, k),
        Err(e) => panic!("{what}: {e}"),
    }
}

/// Metadata with a name only.
pub fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        ..ObjectMeta::default()
    }
}

/// A Node with `labels` and nothing else (no status: not Ready until a test says so).
pub fn node(name: &str, labels: &[(&str, &str)]) -> Node {
    Node {
        metadata: ObjectMeta {
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            ..meta(name)
        },
        ..Node::default()
    }
}

/// A CSINode for `node` with one entry per `(driver, nodeID)`, without topology keys.
pub fn csinode(node: &str, drivers: &[(&str, &str)]) -> CSINode {
    CSINode {
        metadata: meta(node),
        spec: CSINodeSpec {
            drivers: drivers
                .iter()
                .map(|(name, id)| CSINodeDriver {
                    name: (*name).into(),
                    node_id: (*id).into(),
                    ..CSINodeDriver::default()
                })
                .collect(),
        },
    }
}

/// A CSINode for `node` with one driver and the topology keys it reports (what the
/// provisioner reads to build a volume's accessible topology).
pub fn csinode_with_topology(node: &str, driver: &str, node_id: &str, keys: &[&str]) -> CSINode {
    let mut c = csinode(node, &[(driver, node_id)]);
    for d in &mut c.spec.drivers {
        d.topology_keys = Some(keys.iter().map(|k| (*k).to_owned()).collect());
    }
    c
}

/// A ReadWriteOnce claim in `namespace` for `size` (a quantity: "1Gi") of `class` (`None`:
/// no `storageClassName`, the default class decides).
pub fn claim(
    namespace: &str,
    name: &str,
    class: Option<&str>,
    size: &str,
) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            namespace: Some(namespace.into()),
            ..meta(name)
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            storage_class_name: class.map(Into::into),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_owned(),
                    Quantity(size.into()),
                )])),
                ..VolumeResourceRequirements::default()
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        ..PersistentVolumeClaim::default()
    }
}

/// A CSIDriver object for `name` with `spec.attachRequired` set; everything else unset (the
/// API server's defaults).
pub fn csidriver(name: &str, attach_required: bool) -> CSIDriver {
    CSIDriver {
        metadata: meta(name),
        spec: CSIDriverSpec {
            attach_required: Some(attach_required),
            ..CSIDriverSpec::default()
        },
    }
}

/// A 1Gi ReadWriteOnce PersistentVolume of CSI driver `driver` with volume handle `handle`; no
/// class, no claim, no reclaim policy (the API server's default: Retain).
pub fn csi_pv(name: &str, driver: &str, handle: &str) -> PersistentVolume {
    PersistentVolume {
        metadata: meta(name),
        spec: Some(PersistentVolumeSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            capacity: Some(BTreeMap::from([(
                "storage".to_owned(),
                Quantity("1Gi".into()),
            )])),
            csi: Some(CSIPersistentVolumeSource {
                driver: driver.into(),
                volume_handle: handle.into(),
                ..CSIPersistentVolumeSource::default()
            }),
            ..PersistentVolumeSpec::default()
        }),
        ..PersistentVolume::default()
    }
}

/// A VolumeAttachment of PersistentVolume `pv` to `node` for `attacher`, without status.
pub fn volume_attachment(name: &str, attacher: &str, pv: &str, node: &str) -> VolumeAttachment {
    VolumeAttachment {
        metadata: meta(name),
        spec: VolumeAttachmentSpec {
            attacher: attacher.into(),
            node_name: node.into(),
            source: VolumeAttachmentSource {
                persistent_volume_name: Some(pv.into()),
                inline_volume_spec: None,
            },
        },
        status: None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn json_is_typed_and_named() {
        let (what, n) = typed::<Node>(serde_json::json!({"metadata": {"name": "n1"}}));
        assert_eq!(what, "Node \"n1\"");
        assert_eq!(n.metadata.name.as_deref(), Some("n1"));
    }

    #[test]
    #[should_panic(expected = "Node \"n1\": invalid type")]
    fn json_that_is_not_the_kind_is_named() {
        typed::<Node>(serde_json::json!({"metadata": {"name": "n1"}, "spec": 5}));
    }

    #[test]
    fn builders_set_what_they_say() {
        let n = node("n1", &[("zone", "a")]);
        assert_eq!(n.metadata.name.as_deref(), Some("n1"));
        assert_eq!(n.metadata.labels.unwrap()["zone"], "a");
        assert!(n.status.is_none());

        let c = csinode("n1", &[("d1", "id-1"), ("d2", "id-2")]);
        let ids: Vec<(&str, &str)> = c
            .spec
            .drivers
            .iter()
            .map(|d| (d.name.as_str(), d.node_id.as_str()))
            .collect();
        assert_eq!(ids, [("d1", "id-1"), ("d2", "id-2")]);
        assert!(c.spec.drivers[0].topology_keys.is_none());
        let t = csinode_with_topology("n1", "d1", "id-1", &["zone"]);
        assert_eq!(
            t.spec.drivers[0].topology_keys,
            Some(vec!["zone".to_owned()])
        );

        let pvc = claim("ns", "c1", None, "2Gi");
        assert_eq!(pvc.metadata.namespace.as_deref(), Some("ns"));
        let spec = pvc.spec.unwrap();
        assert_eq!(spec.storage_class_name, None);
        assert_eq!(spec.access_modes, Some(vec!["ReadWriteOnce".to_owned()]));
        assert_eq!(
            spec.resources.unwrap().requests.unwrap()["storage"].0,
            "2Gi"
        );
        let classed = claim("ns", "c2", Some("fast"), "1Gi");
        assert_eq!(
            classed.spec.unwrap().storage_class_name.as_deref(),
            Some("fast")
        );

        let d = csidriver("d1", false);
        assert_eq!(d.metadata.name.as_deref(), Some("d1"));
        assert_eq!(d.spec.attach_required, Some(false));
        assert!(d.spec.pod_info_on_mount.is_none());

        let pv = csi_pv("pv1", "d1", "vol-1").spec.unwrap();
        let csi = pv.csi.unwrap();
        assert_eq!(
            (csi.driver.as_str(), csi.volume_handle.as_str()),
            ("d1", "vol-1")
        );
        assert_eq!(pv.capacity.unwrap()["storage"].0, "1Gi");
        assert_eq!(pv.access_modes, Some(vec!["ReadWriteOnce".to_owned()]));
        assert!(pv.claim_ref.is_none() && pv.storage_class_name.is_none());

        let va = volume_attachment("va1", "d1", "pv1", "n1");
        assert_eq!(va.metadata.name.as_deref(), Some("va1"));
        assert_eq!(
            (va.spec.attacher.as_str(), va.spec.node_name.as_str()),
            ("d1", "n1")
        );
        assert_eq!(
            va.spec.source.persistent_volume_name.as_deref(),
            Some("pv1")
        );
        assert!(va.status.is_none());
    }
}
