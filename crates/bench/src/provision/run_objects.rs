//! The run's objects: what a cluster has before the first claim (the CSIDriver, one Node with
//! its CSINode listing the driver's topology key, the StorageClass), and the claims themselves.

use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSIDriver, CSINode, StorageClass};
use kube::{Api, Client};
use serde_json::json;

use super::{Error, Scenario};
use crate::harness::ebs;
use crate::harness::objects::{OwnWrites, object};

pub(crate) const NS: &str = "default";
/// The StorageClass every claim names.
pub(crate) const CLASS: &str = "csi-bench-provision";
/// The label on every claim of the run (the claims watch selects it).
pub(crate) const CLAIM_LABEL: &str = "app.kubernetes.io/created-by";
pub(crate) const CLAIM_LABEL_VALUE: &str = "csi-bench-provision";
/// Every claim asks for this much (the EBS minimum; a hostpath volume is a directory).
pub(crate) const CLAIM_SIZE: &str = "1Gi";
/// The one node of the run: the provisioner's topology comes from its labels and CSINode.
pub(crate) const NODE: &str = "node-0";
/// A made-up instance ID for the CSINode (CreateVolume never looks at it).
const EBS_NODE_ID: &str = "i-0000000000provload";

pub(crate) fn claim_name(i: usize) -> String {
    format!("pvc-{i:05}")
}

/// The driver's topology key and the node's value for it.
fn topology(scenario: Scenario) -> (&'static str, &'static str) {
    match scenario {
        Scenario::Hostpath => ("topology.hostpath.csi/node", NODE),
        Scenario::Ebs => (ebs::ZONE_KEY, ebs::ZONE),
    }
}

/// The node ID the driver reports for [`NODE`] (hostpath: its `--node-id`).
pub(crate) fn node_id(scenario: Scenario) -> &'static str {
    match scenario {
        Scenario::Hostpath => NODE,
        Scenario::Ebs => EBS_NODE_ID,
    }
}

fn node(scenario: Scenario) -> Result<Node, Error> {
    let (key, value) = topology(scenario);
    let mut labels = json!({"kubernetes.io/hostname": NODE, key: value});
    if scenario == Scenario::Ebs {
        labels["topology.kubernetes.io/zone"] = json!(ebs::ZONE);
        labels["topology.kubernetes.io/region"] = json!("us-east-1");
    }
    object(json!({"metadata": {"name": NODE, "labels": labels}}))
}

fn csinode(scenario: Scenario) -> Result<CSINode, Error> {
    let (key, _) = topology(scenario);
    object(json!({
        "metadata": {"name": NODE},
        "spec": {"drivers": [{
            "name": scenario.driver_name(),
            "nodeID": node_id(scenario),
            "topologyKeys": [key],
        }]},
    }))
}

fn csidriver(scenario: Scenario) -> Result<CSIDriver, Error> {
    object(json!({
        "metadata": {"name": scenario.driver_name()},
        "spec": {"attachRequired": scenario == Scenario::Ebs, "podInfoOnMount": false},
    }))
}

pub(crate) fn storage_class(scenario: Scenario) -> Result<StorageClass, Error> {
    let parameters = match scenario {
        Scenario::Hostpath => json!({}),
        Scenario::Ebs => json!({"type": "gp3", "csi.storage.k8s.io/fstype": "ext4"}),
    };
    object(json!({
        "metadata": {"name": CLASS},
        "provisioner": scenario.driver_name(),
        "parameters": parameters,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
    }))
}

pub(crate) fn claim(i: usize) -> Result<PersistentVolumeClaim, Error> {
    object(json!({
        "metadata": {"name": claim_name(i), "namespace": NS,
                     "labels": {CLAIM_LABEL: CLAIM_LABEL_VALUE}},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": CLASS,
            "resources": {"requests": {"storage": CLAIM_SIZE}},
        },
    }))
}

/// The CSIDriver, the Node, its CSINode and the StorageClass.
pub(crate) async fn create_cluster(kube: &Client, scenario: Scenario) -> Result<(), Error> {
    let own = OwnWrites::default();
    own.create_object(&Api::all(kube.clone()), &csidriver(scenario)?)
        .await?;
    own.create_object(&Api::all(kube.clone()), &node(scenario)?)
        .await?;
    own.create_object(&Api::all(kube.clone()), &csinode(scenario)?)
        .await?;
    let class = storage_class(scenario)?;
    own.create_object(&Api::all(kube.clone()), &class)
        .await
        .map(drop)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::harness::cli::Named as _;

    #[test]
    fn objects_carry_the_driver_and_its_topology() {
        for &s in Scenario::ALL {
            let sc = storage_class(s).unwrap();
            assert_eq!(sc.provisioner, s.driver_name());
            assert_eq!(sc.volume_binding_mode.as_deref(), Some("Immediate"));
            assert_eq!(sc.reclaim_policy.as_deref(), Some("Delete"));
            let n = node(s).unwrap();
            let c = csinode(s).unwrap();
            let keys = c.spec.drivers[0].topology_keys.clone().unwrap();
            let labels = n.metadata.labels.unwrap();
            assert!(labels.contains_key(&keys[0]), "{s}: {labels:?}");
            assert_eq!(c.spec.drivers[0].name, s.driver_name());
        }
        let pvc = claim(7).unwrap();
        assert_eq!(pvc.metadata.name.as_deref(), Some("pvc-00007"));
        assert_eq!(pvc.spec.unwrap().storage_class_name.as_deref(), Some(CLASS));
    }
}
