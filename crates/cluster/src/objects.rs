//! The objects a fresh cluster has: the namespaces, the two CSIDrivers and the default
//! StorageClasses. Created when missing; an existing one (a restart on the same data dir, or
//! the user's edit) is left as it is.

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
use kube::api::PostParams;
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::{EBS_DRIVER, Error, HOSTPATH_DRIVER};

/// The default StorageClass's annotation.
const DEFAULT_CLASS_ANNOTATION: &str = "storageclass.kubernetes.io/is-default-class";

/// Every object a cluster starts with, as JSON (kind, name, body).
fn initial_objects() -> Vec<(&'static str, Value)> {
    let mut objects: Vec<(&'static str, Value)> = ["default", "kube-system", "kube-node-lease"]
        .into_iter()
        .map(|ns| ("Namespace", json!({"metadata": {"name": ns}})))
        .collect();
    objects.extend([
        (
            "CSIDriver",
            json!({
                "metadata": {"name": EBS_DRIVER},
                "spec": {"attachRequired": true, "podInfoOnMount": false},
            }),
        ),
        (
            "CSIDriver",
            json!({
                "metadata": {"name": HOSTPATH_DRIVER},
                "spec": {
                    "attachRequired": false,
                    "podInfoOnMount": true,
                    "volumeLifecycleModes": ["Persistent", "Ephemeral"],
                },
            }),
        ),
        (
            "StorageClass",
            json!({
                "metadata": {
                    "name": "ebs-sc",
                    "annotations": {DEFAULT_CLASS_ANNOTATION: "true"},
                },
                "provisioner": EBS_DRIVER,
                "parameters": {"type": "gp3"},
                "volumeBindingMode": "WaitForFirstConsumer",
                "reclaimPolicy": "Delete",
                "allowVolumeExpansion": true,
            }),
        ),
        (
            "StorageClass",
            json!({
                "metadata": {"name": "hostpath"},
                "provisioner": HOSTPATH_DRIVER,
                "volumeBindingMode": "WaitForFirstConsumer",
                "reclaimPolicy": "Delete",
            }),
        ),
        (
            // The in-tree class of every EKS cluster: with migration on, the PV controller
            // hands its claims to ebs.csi.aws.com; off, its in-tree plugin provisions them.
            "StorageClass",
            json!({
                "metadata": {"name": "gp2"},
                "provisioner": "kubernetes.io/aws-ebs",
                "parameters": {"type": "gp2", "fsType": "ext4"},
                "volumeBindingMode": "WaitForFirstConsumer",
                "reclaimPolicy": "Delete",
            }),
        ),
    ]);
    objects
}

/// Creates what is missing; returns the names it created.
pub(crate) async fn ensure(client: &Client) -> Result<Vec<String>, Error> {
    let mut created = Vec::new();
    for (kind, body) in initial_objects() {
        let name = body["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let made = match kind {
            "Namespace" => create(Api::<Namespace>::all(client.clone()), body).await,
            "CSIDriver" => create(Api::<CSIDriver>::all(client.clone()), body).await,
            _ => create(Api::<StorageClass>::all(client.clone()), body).await,
        }
        .map_err(|e| Error::kube(format!("creating {kind} {name}"), e))?;
        if made {
            created.push(format!("{kind} {name}"));
        }
    }
    Ok(created)
}

/// `Ok(false)` when it exists already.
async fn create<K>(api: Api<K>, body: Value) -> Result<bool, kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let object: K = serde_json::from_value(body).map_err(kube::Error::SerdeError)?;
    match api.create(&PostParams::default(), &object).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn the_initial_objects_deserialize() {
        for (kind, body) in initial_objects() {
            match kind {
                "Namespace" => drop(serde_json::from_value::<Namespace>(body).unwrap()),
                "CSIDriver" => drop(serde_json::from_value::<CSIDriver>(body).unwrap()),
                _ => {
                    let sc: StorageClass = serde_json::from_value(body).unwrap();
                    assert_eq!(
                        sc.volume_binding_mode.as_deref(),
                        Some("WaitForFirstConsumer")
                    );
                }
            }
        }
    }
}
