//! NodeVolumeLimits for CSI: a node's CSINode says how many volumes of a driver it can use
//! (`spec.drivers[].allocatable.count`); a pod that would push the node past that for any
//! driver is filtered. Volumes are counted once per driver and handle however many pods use
//! them; an unbound claim counts under its class's provisioner, once per claim. Drivers
//! without a count, and nodes without a CSINode, have no limit.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Node, Pod};

use super::{Snapshot, claim_names, node};

pub(crate) const EXCEEDED: &str = "node(s) exceed max volume count";

/// The CSI volumes of a pod: driver → unique volume keys.
pub(super) fn csi_volumes(pod: &Pod, snapshot: &Snapshot) -> BTreeMap<String, BTreeSet<String>> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for name in claim_names(pod) {
        let Some(claim) = snapshot.claim(namespace, &name) else {
            continue;
        };
        let volume_name = claim
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.clone())
            .unwrap_or_default();
        let csi = snapshot
            .volumes
            .get(&volume_name)
            .and_then(|v| v.spec.as_ref())
            .and_then(|s| s.csi.as_ref());
        if let Some(csi) = csi {
            out.entry(csi.driver.clone())
                .or_default()
                .insert(csi.volume_handle.clone());
        } else if volume_name.is_empty()
            && let Some(class) = snapshot.classes.get(&Snapshot::claim_class_name(claim))
        {
            out.entry(class.provisioner.clone())
                .or_default()
                .insert(format!("claim:{namespace}/{name}"));
        }
    }
    out
}

/// Whether `pod`'s new volumes fit `node`'s limits (`None`) or the reason.
pub(crate) fn filter(pod: &Pod, node: &Node, snapshot: &Snapshot) -> Option<String> {
    let wanted = csi_volumes(pod, snapshot);
    if wanted.is_empty() {
        return None;
    }
    let node_name = node::name(node);
    let limits: BTreeMap<&str, i64> = snapshot
        .csinodes
        .get(node_name)
        .map(|c| {
            c.spec
                .drivers
                .iter()
                .filter_map(|d| {
                    let count = d.allocatable.as_ref()?.count?;
                    Some((d.name.as_str(), i64::from(count)))
                })
                .collect()
        })
        .unwrap_or_default();
    if limits.is_empty() {
        return None;
    }
    let mut recounted: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let in_use = if snapshot.is_on(pod, node_name) {
        // Already counted there (assumed): its own volumes must count as new, so count the
        // others again, as kube-scheduler does.
        for other in snapshot.pods_on_node.get(node_name).into_iter().flatten() {
            if super::pod_key(other) == super::pod_key(pod) {
                continue;
            }
            for (driver, keys) in csi_volumes(other, snapshot) {
                recounted.entry(driver).or_default().extend(keys);
            }
        }
        &recounted
    } else {
        snapshot
            .volumes_on_node
            .get(node_name)
            .unwrap_or(&recounted)
    };
    for (driver, keys) in &wanted {
        let Some(limit) = limits.get(driver.as_str()) else {
            continue;
        };
        let used = in_use.get(driver);
        let new = keys
            .iter()
            .filter(|k| used.is_none_or(|u| !u.contains(*k)))
            .count();
        if new == 0 {
            continue;
        }
        let total = used.map_or(0, BTreeSet::len) + new;
        if i64::try_from(total).unwrap_or(i64::MAX) > *limit {
            return Some(EXCEEDED.into());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::sync::Arc;

    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
    use k8s_openapi::api::storage::v1::{CSINode, StorageClass};
    use serde_json::json;

    use super::*;

    fn obj<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> Arc<T> {
        Arc::new(serde_json::from_value(v).unwrap())
    }

    fn pod(name: &str, node: Option<&str>, claims: &[&str]) -> Arc<Pod> {
        let volumes: Vec<_> = claims
            .iter()
            .map(|c| json!({"name": c, "persistentVolumeClaim": {"claimName": c}}))
            .collect();
        obj(json!({"metadata": {"name": name, "namespace": "ns"},
            "spec": {"containers": [], "nodeName": node, "volumes": volumes}}))
    }

    fn bound_claim(name: &str) -> (Arc<PersistentVolumeClaim>, Arc<PersistentVolume>) {
        (
            obj(json!({"metadata": {"name": name, "namespace": "ns"},
                "spec": {"volumeName": format!("pv-{name}")}, "status": {"phase": "Bound"}})),
            obj(json!({"metadata": {"name": format!("pv-{name}")},
                "spec": {"csi": {"driver": "d", "volumeHandle": format!("h-{name}")}}})),
        )
    }

    #[test]
    fn counts_unique_volumes_per_driver() {
        let (c1, v1) = bound_claim("a");
        let (c2, v2) = bound_claim("b");
        let unbound: Arc<PersistentVolumeClaim> =
            obj(json!({"metadata": {"name": "u", "namespace": "ns"},
            "spec": {"storageClassName": "wffc"}}));
        let class: Arc<StorageClass> =
            obj(json!({"metadata": {"name": "wffc"}, "provisioner": "d"}));
        let csinode: Arc<CSINode> = obj(json!({"metadata": {"name": "n"}, "spec": {"drivers": [
            {"name": "d", "nodeID": "n", "allocatable": {"count": 2}}]}}));
        let node: Node = serde_json::from_value(json!({"metadata": {"name": "n"}})).unwrap();
        let on_node = [pod("one", Some("n"), &["a"]), pod("two", Some("n"), &["a"])];
        let snapshot = Snapshot::new(
            vec![Arc::new(node.clone())],
            vec![c1, c2, unbound],
            vec![v1, v2],
            vec![class],
            vec![csinode],
            &on_node,
        );
        // "a" is used twice but counts once: one more fits, two more do not.
        assert_eq!(filter(&pod("p", None, &["b"]), &node, &snapshot), None);
        assert_eq!(filter(&pod("p", None, &["a"]), &node, &snapshot), None);
        assert_eq!(
            filter(&pod("p", None, &["b", "u"]), &node, &snapshot).as_deref(),
            Some(EXCEEDED)
        );
    }
}
