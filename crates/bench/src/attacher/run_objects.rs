//! The objects a load run creates and deletes: Nodes with CSINodes, PersistentVolumes and
//! VolumeAttachments, written with bounded parallelism and counted (the run subtracts nothing
//! it did itself from the attacher's writes: the API server attributes by User-Agent, and this
//! count cross-checks that).

use std::collections::BTreeMap;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::{Node, PersistentVolume};
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::Error;
use crate::harness::api::bounded;

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

/// What this run wrote, by "verb resource" (the same keys the audit tally uses).
#[derive(Debug, Default)]
pub(crate) struct OwnWrites(Mutex<BTreeMap<String, u64>>);

impl OwnWrites {
    fn add(&self, key: &str) {
        *self
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key.to_owned())
            .or_default() += 1;
    }

    pub(crate) fn total(&self) -> u64 {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .sum()
    }

    #[cfg(test)]
    pub(crate) fn by_request(&self) -> BTreeMap<String, u64> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Builds a typed object from JSON we wrote ourselves.
fn object<K: DeserializeOwned>(
    kind: &str,
    name: &str,
    value: serde_json::Value,
) -> Result<K, Error> {
    serde_json::from_value(value).map_err(|e| Error::Config(format!("building {kind} {name}: {e}")))
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
    async fn create<K>(&self, api: &Api<K>, resource: &str, obj: K) -> Result<(), Error>
    where
        K: kube::Resource + Clone + DeserializeOwned + serde::Serialize + std::fmt::Debug,
    {
        let name = obj.meta().name.clone().unwrap_or_default();
        self.own.add(&format!("create {resource}"));
        api.create(&PostParams::default(), &obj)
            .await
            .map_err(|source| Error::Kube {
                op: format!("creating {resource} {name}"),
                source,
            })?;
        Ok(())
    }

    async fn delete<K>(&self, api: &Api<K>, resource: &str, name: String) -> Result<(), Error>
    where
        K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug,
    {
        self.own.add(&format!("delete {resource}"));
        api.delete(&name, &DeleteParams::default())
            .await
            .map_err(|source| Error::Kube {
                op: format!("deleting {resource} {name}"),
                source,
            })?;
        Ok(())
    }

    /// Nodes and their CSINodes (one driver entry each, with the node ID).
    pub(crate) async fn create_nodes(&self) -> Result<(), Error> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let csinodes: Api<CSINode> = Api::all(self.client.clone());
        bounded(0..self.nodes, self.parallelism, |i| {
            let (nodes, csinodes) = (&nodes, &csinodes);
            async move {
                let name = node_name(i);
                let node = object(
                    "Node",
                    &name,
                    json!({
                        "apiVersion": "v1", "kind": "Node",
                        "metadata": {"name": name},
                    }),
                )?;
                self.create(nodes, "nodes", node).await?;
                let csinode = object(
                    "CSINode",
                    &name,
                    json!({
                        "apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
                        "metadata": {"name": name},
                        "spec": {"drivers": [{"name": self.driver, "nodeID": node_id(i)}]},
                    }),
                )?;
                self.create(csinodes, "csinodes", csinode).await
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
                let name = pv_name(i);
                let pv = object("PersistentVolume", &name, json!({
                    "apiVersion": "v1", "kind": "PersistentVolume",
                    "metadata": {"name": name, "labels": {LOAD_LABEL: LOAD_LABEL_VALUE}},
                    "spec": {
                        "capacity": {"storage": "1Gi"},
                        "accessModes": ["ReadWriteOnce"],
                        "persistentVolumeReclaimPolicy": "Retain",
                        "csi": {"driver": self.driver, "volumeHandle": volume_handle(i), "fsType": "ext4"},
                    },
                }))?;
                self.create(pvs, "persistentvolumes", pv).await
            }
        })
        .await?;
        let vas: Api<VolumeAttachment> = Api::all(self.client.clone());
        bounded(0..self.count, self.parallelism, |i| {
            let vas = &vas;
            async move {
                let name = va_name(i);
                let va = object(
                    "VolumeAttachment",
                    &name,
                    json!({
                        "apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
                        "metadata": {"name": name, "labels": {LOAD_LABEL: LOAD_LABEL_VALUE}},
                        "spec": {
                            "attacher": self.driver,
                            "nodeName": node_name(node_of(i, self.nodes)),
                            "source": {"persistentVolumeName": pv_name(i)},
                        },
                    }),
                )?;
                self.create(vas, "volumeattachments", va).await
            }
        })
        .await
    }

    pub(crate) async fn delete_vas(&self) -> Result<(), Error> {
        let vas: Api<VolumeAttachment> = Api::all(self.client.clone());
        bounded(0..self.count, self.parallelism, |i| {
            let vas = &vas;
            async move { self.delete(vas, "volumeattachments", va_name(i)).await }
        })
        .await
    }

    pub(crate) async fn delete_pvs(&self) -> Result<(), Error> {
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        bounded(0..self.count, self.parallelism, |i| {
            let pvs = &pvs;
            async move { self.delete(pvs, "persistentvolumes", pv_name(i)).await }
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
