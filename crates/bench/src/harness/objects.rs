//! The objects a scenario writes itself: built from the JSON it wrote, created, given a status
//! and deleted through one [`OwnWrites`], which counts each write by "verb resource" (the
//! keys of the audit tally, [`super::writes`]). A run compares the count with what the API
//! server's audit trail attributes to the benchmark's User-Agent: a mismatch means the write
//! accounting of the parties under test is off too.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::Error;

/// A typed object from JSON the benchmark wrote; `Error::Object` names its kind and name.
pub fn object<K>(value: Value) -> Result<K, Error>
where
    K: Resource<DynamicType = ()> + DeserializeOwned,
{
    let name = value["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    serde_json::from_value(value).map_err(|e| Error::Object {
        kind: kind_of::<K>(),
        name,
        reason: e.to_string(),
    })
}

fn kind_of<K: Resource<DynamicType = ()>>() -> &'static str {
    // k8s-openapi's kinds are 'static constants; `Resource::kind` hands out a Cow of them.
    match K::kind(&()) {
        std::borrow::Cow::Borrowed(kind) => kind,
        std::borrow::Cow::Owned(_) => "object",
    }
}

/// A claim and the volume bound to it, for [`OwnWrites::create_bound`].
pub struct BoundPair<'a> {
    pub namespace: &'a str,
    pub claim: &'a str,
    pub volume: &'a str,
    /// Both capacities ("1Gi").
    pub size: &'a str,
    pub labels: Option<Value>,
    pub csi: Value,
}

/// The benchmark's own writes, counted by "verb resource".
#[derive(Debug, Default)]
pub struct OwnWrites {
    /// Said before every error ("through-adc"), or empty.
    context: String,
    counts: Mutex<BTreeMap<String, u64>>,
}

impl OwnWrites {
    /// Counts the writes of `context` (a scenario's name: it starts every error message).
    pub fn new(context: impl Into<String>) -> Self {
        Self {
            context: context.into(),
            counts: Mutex::default(),
        }
    }

    fn count<K: Resource<DynamicType = ()>>(&self, verb: &str) {
        let key = format!("{verb} {}", K::plural(&()));
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        *counts.entry(key).or_default() += 1;
    }

    /// The error of a failed call, built only when one fails.
    fn failed<'a, K: Resource<DynamicType = ()>>(
        &'a self,
        doing: &'a str,
        name: &'a str,
    ) -> impl FnOnce(kube::Error) -> Error + 'a {
        move |source| {
            let kind = kind_of::<K>();
            let op = if self.context.is_empty() {
                format!("{doing} {kind} {name}")
            } else {
                format!("{}: {doing} {kind} {name}", self.context)
            };
            Error::Kube { op, source }
        }
    }

    /// Creates the object `value` describes; the API server's copy comes back.
    pub async fn create<K>(&self, api: &Api<K>, value: Value) -> Result<K, Error>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + Debug,
    {
        self.create_object(api, &object(value)?).await
    }

    /// Creates `obj`; the API server's copy comes back.
    pub async fn create_object<K>(&self, api: &Api<K>, obj: &K) -> Result<K, Error>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + Debug,
    {
        let name = obj.meta().name.clone().unwrap_or_default();
        self.count::<K>("create");
        api.create(&PostParams::default(), obj)
            .await
            .map_err(self.failed::<K>("creating", &name))
    }

    /// Merges `status` into the object's status subresource (a create drops the status).
    pub async fn set_status<K>(&self, api: &Api<K>, name: &str, status: Value) -> Result<(), Error>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
    {
        self.count::<K>("patch");
        let patch = Patch::Merge(json!({ "status": status }));
        api.patch_status(name, &PatchParams::default(), &patch)
            .await
            .map_err(self.failed::<K>("setting the status of", name))?;
        Ok(())
    }

    /// A claim and a CSI volume bound to each other, as the PV controller leaves them: the
    /// claim, then the volume whose `claimRef` carries the claim's uid, then both statuses
    /// `Bound`. `labels` go on both; `csi` is the volume's `spec.csi`.
    pub async fn create_bound(&self, client: &Client, pair: BoundPair<'_>) -> Result<(), Error> {
        let BoundPair {
            namespace,
            claim,
            volume,
            size,
            labels,
            csi,
        } = pair;
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
        let volumes: Api<PersistentVolume> = Api::all(client.clone());
        let created = self
            .create(
                &claims,
                json!({
                    "metadata": {
                        "name": claim, "namespace": namespace, "labels": labels,
                        "annotations": {"pv.kubernetes.io/bind-completed": "yes"},
                    },
                    "spec": {
                        "accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem",
                        "resources": {"requests": {"storage": size}},
                        "storageClassName": "", "volumeName": volume,
                    },
                }),
            )
            .await?;
        self.create(
            &volumes,
            json!({
                "metadata": {"name": volume, "labels": labels},
                "spec": {
                    "capacity": {"storage": size},
                    "accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem",
                    "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                    "claimRef": {
                        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                        "namespace": namespace, "name": claim, "uid": created.metadata.uid,
                    },
                    "csi": csi,
                },
            }),
        )
        .await?;
        self.set_status(&volumes, volume, json!({"phase": "Bound"}))
            .await?;
        let bound = json!({"phase": "Bound", "accessModes": ["ReadWriteOnce"], "capacity": {"storage": size}});
        self.set_status(&claims, claim, bound).await
    }

    pub async fn delete<K>(&self, api: &Api<K>, name: &str) -> Result<(), Error>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
    {
        self.count::<K>("delete");
        api.delete(name, &DeleteParams::default())
            .await
            .map_err(self.failed::<K>("deleting", name))?;
        Ok(())
    }

    /// Every write so far.
    pub fn total(&self) -> u64 {
        self.by_request().values().sum()
    }

    /// Writes so far by "verb resource" ("create persistentvolumes").
    pub fn by_request(&self) -> BTreeMap<String, u64> {
        self.counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use k8s_openapi::api::core::v1::PersistentVolume;

    #[test]
    fn a_malformed_object_names_its_kind_and_name() {
        let bad = json!({"metadata": {"name": "pv-1"}, "spec": {"capacity": 5}});
        let err = object::<PersistentVolume>(bad).unwrap_err().to_string();
        assert!(
            err.contains("PersistentVolume") && err.contains("pv-1"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn every_write_is_counted_and_a_failure_names_the_run_and_object() {
        let dir = crate::harness::api::run_dir("csi-bench-objects-", None).unwrap();
        let (server, _) = crate::harness::api::start(dir.path()).await.unwrap();
        let client = crate::harness::api::client(&server, "csi-bench-test/1").unwrap();
        let pvs: Api<PersistentVolume> = Api::all(client);
        let own = OwnWrites::new("through-adc");
        let pv = json!({
            "metadata": {"name": "pv-1"},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                     "hostPath": {"path": "/tmp"}},
        });
        own.create(&pvs, pv.clone()).await.unwrap();
        own.set_status(&pvs, "pv-1", json!({"phase": "Bound"}))
            .await
            .unwrap();
        let status = pvs.get("pv-1").await.unwrap().status.unwrap();
        assert_eq!(status.phase.as_deref(), Some("Bound"));
        let err = own.create(&pvs, pv).await.unwrap_err().to_string();
        assert!(
            err.starts_with("through-adc: creating PersistentVolume pv-1: "),
            "{err}"
        );
        own.delete(&pvs, "pv-1").await.unwrap();
        let expected = [
            ("create persistentvolumes", 2),
            ("delete persistentvolumes", 1),
            ("patch persistentvolumes", 1),
        ]
        .map(|(k, n)| (k.to_owned(), n));
        assert_eq!(own.by_request(), BTreeMap::from(expected));
        assert_eq!(own.total(), 4);
        server.shutdown().await.unwrap();
    }
}
