//! The objects of a run, as a cluster would have them once the scheduler and the PV controller
//! are done: Nodes whose attach/detach is controller-managed (with CSINodes, which the attacher
//! reads the node ID from), the CSIDriver, PVCs bound to CSI PVs (both `Bound`, the PV's
//! `claimRef` carrying the PVC's uid), and pods already on their nodes, each with one PVC.
//! Written with bounded parallelism; every write is counted to cross-check the audit trail.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, CSINode};
use kube::{Api, Client};
use serde_json::json;

use super::nodes::Expected;
use super::{Error, Scenario};
use crate::harness::api::bounded;
use crate::harness::objects::{BoundPair, OwnWrites};

/// Label on every Node and pod a run creates; the watches select on it.
pub(crate) const LOAD_LABEL: &str = "app.kubernetes.io/created-by";
pub(crate) const LOAD_LABEL_VALUE: &str = "csi-bench-adc";
/// The annotation that hands a node's attach/detach to the ADC (the kubelet sets it with
/// `--enable-controller-attach-detach`, the default).
pub(crate) const CONTROLLER_MANAGED: &str =
    "volumes.kubernetes.io/controller-managed-attach-detach";
const NAMESPACE: &str = "default";

pub(crate) fn node_name(i: usize) -> String {
    format!("node-{i}")
}

/// Differs from the Node name on purpose: the attacher must take it from CSINode.
fn node_id(i: usize) -> String {
    format!("node-id-{i}")
}

fn pvc_name(i: usize) -> String {
    format!("pvc-{i:05}")
}

fn pv_name(i: usize) -> String {
    format!("pv-{i:05}")
}

fn pod_name(i: usize) -> String {
    format!("pod-{i:05}")
}

fn volume_handle(i: usize) -> String {
    format!("vol-{i:05}")
}

/// Pod `i` runs on node `i % nodes`.
fn node_of(i: usize, nodes: usize) -> usize {
    i % nodes.max(1)
}

/// The unique volume names (`kubernetes.io/csi/DRIVER^HANDLE`) expected in each node's
/// `volumesAttached` once every pod's volume is attached.
pub(crate) fn expected(driver: &str, pods: usize, nodes: usize) -> Expected {
    let mut map: Expected = (0..nodes)
        .map(|n| (node_name(n), BTreeSet::new()))
        .collect();
    for i in 0..pods {
        map.entry(node_name(node_of(i, nodes))).or_default().insert(
            volume_plugins::names::csi_unique_volume_name(driver, &volume_handle(i)),
        );
    }
    map
}

/// Creates a run's objects.
pub(crate) struct Objects<'a> {
    pub(crate) client: Client,
    pub(crate) scenario: Scenario,
    pub(crate) driver: &'a str,
    pub(crate) pods: usize,
    pub(crate) nodes: usize,
    pub(crate) parallelism: usize,
    /// Writes made, for the cross-check against the audit trail.
    pub(crate) own: OwnWrites,
}

impl Objects<'_> {
    /// Nodes with CSINodes, and the CSIDriver with the scenario's attachRequired.
    pub(crate) async fn create_cluster(&self) -> Result<(), Error> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let csinodes: Api<CSINode> = Api::all(self.client.clone());
        bounded(0..self.nodes, self.parallelism, |i| {
            let (nodes, csinodes) = (&nodes, &csinodes);
            async move {
                let name = node_name(i);
                self.own.create(nodes, json!({
                    "metadata": {
                        "name": name,
                        "labels": {LOAD_LABEL: LOAD_LABEL_VALUE, "kubernetes.io/hostname": name},
                        "annotations": {CONTROLLER_MANAGED: "true"},
                    },
                }))
                .await?;
                let csinode = json!({
                    "metadata": {"name": name},
                    "spec": {"drivers": [{"name": self.driver, "nodeID": node_id(i)}]},
                });
                self.own.create(csinodes, csinode).await.map(drop)
            }
        })
        .await?;
        let drivers: Api<CSIDriver> = Api::all(self.client.clone());
        self.own.create(&drivers, json!({
            "metadata": {"name": self.driver},
            "spec": {"attachRequired": self.scenario.attach_required(), "podInfoOnMount": false},
        }))
        .await
        .map(drop)
    }

    /// For each volume: the PVC, then the PV whose claimRef names the PVC's uid, then both
    /// statuses `Bound` (what the PV controller leaves behind).
    pub(crate) async fn create_volumes(&self) -> Result<(), Error> {
        bounded(0..self.pods, self.parallelism, |i| {
            let (claim, volume) = (pvc_name(i), pv_name(i));
            let csi =
                json!({"driver": self.driver, "volumeHandle": volume_handle(i), "fsType": "ext4"});
            async move {
                let pair = BoundPair {
                    namespace: NAMESPACE,
                    claim: &claim,
                    volume: &volume,
                    size: "1Gi",
                    labels: None,
                    csi,
                };
                self.own.create_bound(&self.client, pair).await
            }
        })
        .await
    }

    /// The pods, already scheduled (`spec.nodeName`), one PVC volume each.
    pub(crate) async fn create_pods(&self) -> Result<(), Error> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), NAMESPACE);
        bounded(0..self.pods, self.parallelism, |i| {
            let pods = &pods;
            async move {
                self.own.create(pods, json!({
                    "metadata": {
                        "name": pod_name(i), "namespace": NAMESPACE,
                        "labels": {LOAD_LABEL: LOAD_LABEL_VALUE},
                    },
                    "spec": {
                        "nodeName": node_name(node_of(i, self.nodes)),
                        "containers": [{
                            "name": "app", "image": "registry.k8s.io/pause:3.9",
                            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                        }],
                        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": pvc_name(i)}}],
                    },
                }))
                .await
                .map(drop)
            }
        })
        .await
    }

    pub(crate) fn writes(&self) -> u64 {
        self.own.total()
    }
}

/// Writes per object kind the setup makes, for the docs and the test: Node + CSINode per node,
/// one CSIDriver, PVC + PV + two statuses per volume.
#[cfg(test)]
pub(crate) fn setup_writes(pods: usize, nodes: usize) -> u64 {
    (2 * nodes + 1 + 4 * pods) as u64
}

/// Names of the VolumeAttachments a run's volumes would get, to check the ADC's.
pub(crate) fn va_names(driver: &str, pods: usize, nodes: usize) -> BTreeMap<String, usize> {
    (0..pods)
        .map(|i| {
            let name = volume_plugins::names::volume_attachment_name(
                &volume_handle(i),
                driver,
                &node_name(node_of(i, nodes)),
            );
            (name, i)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};

    #[test]
    fn expected_volumes_go_round_robin() {
        let e = expected("mock.csi.rs", 5, 2);
        assert_eq!(e.len(), 2);
        assert_eq!(
            e["node-0"],
            BTreeSet::from([
                "kubernetes.io/csi/mock.csi.rs^vol-00000".to_owned(),
                "kubernetes.io/csi/mock.csi.rs^vol-00002".to_owned(),
                "kubernetes.io/csi/mock.csi.rs^vol-00004".to_owned(),
            ])
        );
        assert_eq!(e["node-1"].len(), 2);
        // More nodes than pods: the empty nodes are there, expecting nothing.
        assert_eq!(expected("d", 1, 3)["node-2"].len(), 0);
        assert_eq!(va_names("d", 4, 2).len(), 4);
    }

    #[tokio::test]
    async fn creates_bound_volumes_and_scheduled_pods() {
        apiserver::install_crypto_provider();
        let api = apiserver::ApiServer::start(apiserver::Config::default())
            .await
            .unwrap();
        let objects = Objects {
            client: api.client(),
            scenario: Scenario::ThroughAdc,
            driver: "mock.csi.rs",
            pods: 7,
            nodes: 3,
            parallelism: 4,
            own: OwnWrites::new("through-adc"),
        };
        objects.create_cluster().await.unwrap();
        objects.create_volumes().await.unwrap();
        assert_eq!(objects.writes(), setup_writes(7, 3));
        objects.create_pods().await.unwrap();
        assert_eq!(objects.writes(), setup_writes(7, 3) + 7);

        let client = api.client();
        let node: Node = Api::all(client.clone()).get("node-2").await.unwrap();
        assert_eq!(
            node.metadata.annotations.unwrap()[CONTROLLER_MANAGED],
            "true"
        );
        let driver: CSIDriver = Api::all(client.clone()).get("mock.csi.rs").await.unwrap();
        assert_eq!(driver.spec.attach_required, Some(false));

        let pvc: PersistentVolumeClaim = Api::namespaced(client.clone(), NAMESPACE)
            .get("pvc-00005")
            .await
            .unwrap();
        assert_eq!(pvc.status.unwrap().phase.as_deref(), Some("Bound"));
        assert_eq!(pvc.spec.unwrap().volume_name.as_deref(), Some("pv-00005"));
        let pv: PersistentVolume = Api::all(client.clone()).get("pv-00005").await.unwrap();
        assert_eq!(pv.status.unwrap().phase.as_deref(), Some("Bound"));
        let spec = pv.spec.unwrap();
        let claim = spec.claim_ref.unwrap();
        assert_eq!(claim.uid, pvc.metadata.uid);
        assert_eq!(claim.name.as_deref(), Some("pvc-00005"));
        assert_eq!(spec.csi.unwrap().volume_handle, "vol-00005");

        let pod: Pod = Api::namespaced(client, NAMESPACE)
            .get("pod-00005")
            .await
            .unwrap();
        let spec = pod.spec.unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("node-2"));
        let claim = spec.volumes.unwrap()[0]
            .persistent_volume_claim
            .clone()
            .unwrap();
        assert_eq!(claim.claim_name, "pvc-00005");
    }
}
