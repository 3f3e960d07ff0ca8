//! The objects a load run creates and deletes: Nodes with CSINodes, PersistentVolumes and
//! VolumeAttachments, written with bounded parallelism and counted (the run subtracts nothing
//! it did itself from the attacher's writes: the API server attributes by User-Agent, and this
//! count cross-checks that).

use k8s_openapi::api::core::v1::{Node, PersistentVolume};
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use kube::{Api, Client};
use serde_json::json;

use crate::Error;
use crate::harness::api::bounded;
pub(crate) use crate::harness::objects::OwnWrites;

/// Label on every PV and VolumeAttachment a run creates; the watches select on it.
pub(crate) const LOAD_LABEL: &str = "app.kubernetes.io/created-by";
pub(crate) const LOAD_LABEL_VALUE: &str = "csi-bench-attacher";

pub(crate) fn node_name(i: usize) -> String {
    format!("load-node-{i:03}")
}

/// Differs from the Node name on purpose: an attacher must take the ID from CSINode.
pub(crate) fn node_id(i: usize) -> String {
    format!("load-node-id-{i:03}")
}

pub(crate) fn pv_name(i: usize) -> String {
    format!("load-pv-{i:05}")
}

pub(crate) fn va_name(i: usize) -> String {
    format!("load-va-{i:05}")
}

pub(crate) fn volume_handle(i: usize) -> String {
    format!("load-vol-{i:05}")
}

/// Volume `i` is attached to node `i % nodes` (round robin).
pub(crate) fn node_of(i: usize, nodes: usize) -> usize {
    i % nodes.max(1)
}

/// Creates and deletes the run's objects.
pub(crate) struct Objects<'a> {
    pub(crate) client: Client,
    pub(crate) driver: &'a str,
    pub(crate) count: usize,
    pub(crate) nodes: usize,
    pub(crate) parallelism: usize,
    pub(crate) own: &'a OwnWrites,
}

impl Objects<'_> {
    /// Nodes and their CSINodes (one driver entry each, with the node ID).
    pub(crate) async fn create_nodes(&self) -> Result<(), Error> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let csinodes: Api<CSINode> = Api::all(self.client.clone());
        bounded(0..self.nodes, self.parallelism, |i| {
            let (nodes, csinodes) = (&nodes, &csinodes);
            async move {
                let name = node_name(i);
                self.own
                    .create(nodes, json!({"metadata": {"name": name}}))
                    .await?;
                let csinode = json!({
                    "metadata": {"name": name},
                    "spec": {"drivers": [{"name": self.driver, "nodeID": node_id(i)}]},
                });
                self.own.create(csinodes, csinode).await.map(drop)
            }
        })
        .await
    }

    /// PVs first, then the VolumeAttachments that name them.
    pub(crate) async fn create_volumes(&self) -> Result<(), Error> {
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        bounded(0..self.count, self.parallelism, |i| {
            let pvs = &pvs;
            async move {
                let pv = json!({
                    "metadata": {"name": pv_name(i), "labels": {LOAD_LABEL: LOAD_LABEL_VALUE}},
                    "spec": {
                        "capacity": {"storage": "1Gi"},
                        "accessModes": ["ReadWriteOnce"],
                        "persistentVolumeReclaimPolicy": "Retain",
                        "csi": {"driver": self.driver, "volumeHandle": volume_handle(i), "fsType": "ext4"},
                    },
                });
                self.own.create(pvs, pv).await.map(drop)
            }
        })
        .await?;
        let vas: Api<VolumeAttachment> = Api::all(self.client.clone());
        bounded(0..self.count, self.parallelism, |i| {
            let vas = &vas;
            async move {
                let va = json!({
                    "metadata": {"name": va_name(i), "labels": {LOAD_LABEL: LOAD_LABEL_VALUE}},
                    "spec": {
                        "attacher": self.driver,
                        "nodeName": node_name(node_of(i, self.nodes)),
                        "source": {"persistentVolumeName": pv_name(i)},
                    },
                });
                self.own.create(vas, va).await.map(drop)
            }
        })
        .await
    }

    pub(crate) async fn delete_vas(&self) -> Result<(), Error> {
        let vas: Api<VolumeAttachment> = Api::all(self.client.clone());
        bounded(0..self.count, self.parallelism, |i| {
            let vas = &vas;
            async move { self.own.delete(vas, &va_name(i)).await }
        })
        .await
    }

    pub(crate) async fn delete_pvs(&self) -> Result<(), Error> {
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        bounded(0..self.count, self.parallelism, |i| {
            let pvs = &pvs;
            async move { self.own.delete(pvs, &pv_name(i)).await }
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn creates_counts_and_deletes_every_object() {
        apiserver::install_crypto_provider();
        let api = apiserver::ApiServer::start(apiserver::Config::default())
            .await
            .unwrap();
        let own = OwnWrites::default();
        let objects = Objects {
            client: crate::harness::api::client(&api, super::super::USER_AGENT).unwrap(),
            driver: "load.csi.test",
            count: 25,
            nodes: 4,
            parallelism: 8,
            own: &own,
        };
        objects.create_nodes().await.unwrap();
        objects.create_volumes().await.unwrap();
        assert_eq!(own.total(), 2 * 4 + 2 * 25);
        assert_eq!(own.by_request().get("create volumeattachments"), Some(&25));

        let client = api.client();
        let csinodes: Vec<CSINode> = Api::all(client.clone())
            .list(&Default::default())
            .await
            .unwrap()
            .items;
        assert_eq!(csinodes.len(), 4);
        let drivers = &csinodes[0].spec.drivers;
        assert_eq!(drivers[0].name, "load.csi.test");
        assert_eq!(drivers[0].node_id, node_id(0));

        let vas: Vec<VolumeAttachment> = Api::all(client.clone())
            .list(&Default::default())
            .await
            .unwrap()
            .items;
        assert_eq!(vas.len(), 25);
        let va7 = vas
            .iter()
            .find(|v| v.metadata.name.as_deref() == Some("load-va-00007"))
            .unwrap();
        assert_eq!(va7.spec.attacher, "load.csi.test");
        assert_eq!(va7.spec.node_name, node_name(7 % 4));
        assert_eq!(
            va7.spec.source.persistent_volume_name.as_deref(),
            Some("load-pv-00007")
        );
        let pv: PersistentVolume = Api::all(client.clone()).get("load-pv-00007").await.unwrap();
        let spec = pv.spec.unwrap();
        let csi = spec.csi.unwrap();
        assert_eq!(csi.volume_handle, "load-vol-00007");
        assert_eq!(csi.fs_type.as_deref(), Some("ext4"));
        assert_eq!(spec.access_modes.unwrap(), vec!["ReadWriteOnce".to_owned()]);

        // Our own writes carry our User-Agent in the server's audit.
        let audit = api.audit();
        let ours = audit
            .iter()
            .filter(|r| {
                r.user_agent == super::super::USER_AGENT
                    && crate::harness::writes::is_write(&r.verb)
            })
            .count();
        assert_eq!(ours as u64, own.total());

        objects.delete_vas().await.unwrap();
        objects.delete_pvs().await.unwrap();
        assert_eq!(own.total(), 2 * 4 + 4 * 25);
        let left: Vec<VolumeAttachment> = Api::all(client)
            .list(&Default::default())
            .await
            .unwrap()
            .items;
        assert!(left.is_empty(), "no finalizers: deletes are immediate");
    }
}
