//! The Kubernetes objects tests across the workspace create the same way: a labelled Node, a
//! CSINode, a claim. Each builder sets only what its doc says; a test changes the rest on
//! the value it gets.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Node, PersistentVolumeClaim, PersistentVolumeClaimSpec, VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver, CSINodeSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

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

#[cfg(test)]
mod tests {
    use super::*;

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
    }
}
