//! The objects a fresh cluster has: the namespaces, the two CSIDrivers and the default
//! StorageClasses, and a CSIDriver and StorageClass per `--driver`. Created when missing; an
//! existing one (a restart on the same data dir, or the user's edit) is left as it is, except
//! a CSIDriver whose `attachRequired` differs from what this run's flags say: that one is
//! replaced (the field is immutable in Kubernetes, so delete and create), since a driver
//! whose CSIDriver disagrees with the attacher that runs would leave pods waiting forever.

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::{EBS_DRIVER, Error, HOSTPATH_DRIVER};

/// The default StorageClass's annotation.
const DEFAULT_CLASS_ANNOTATION: &str = "storageclass.kubernetes.io/is-default-class";

/// Every object a cluster starts with, as JSON (kind, name, body); the hostpath CSIDriver says
/// `attachRequired: hostpath_attach`.
fn initial_objects(hostpath_attach: bool) -> Vec<(&'static str, Value)> {
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
                    "attachRequired": hostpath_attach,
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

/// A `--driver` driver's CSIDriver and its StorageClass, named after the driver
/// (`WaitForFirstConsumer`, so a node-local driver's volume is made where the pod goes).
pub(crate) fn driver_objects(driver: &str, attach_required: bool) -> Vec<(&'static str, Value)> {
    vec![
        (
            "CSIDriver",
            json!({
                "metadata": {"name": driver},
                "spec": {
                    "attachRequired": attach_required,
                    "podInfoOnMount": true,
                    "volumeLifecycleModes": ["Persistent"],
                },
            }),
        ),
        (
            "StorageClass",
            json!({
                "metadata": {"name": driver},
                "provisioner": driver,
                "volumeBindingMode": "WaitForFirstConsumer",
                "reclaimPolicy": "Delete",
            }),
        ),
    ]
}

/// Creates what is missing (the initial objects, then `extra`); returns what it created or
/// replaced ("CSIDriver x", "replaced CSIDriver x (attachRequired false → true)").
pub(crate) async fn ensure(
    client: &Client,
    hostpath_attach: bool,
    extra: Vec<(&'static str, Value)>,
) -> Result<Vec<String>, Error> {
    let mut done = Vec::new();
    for (kind, body) in initial_objects(hostpath_attach).into_iter().chain(extra) {
        let name = body["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let outcome = match kind {
            "Namespace" => create(Api::<Namespace>::all(client.clone()), body)
                .await
                .map(|made| made.then(|| format!("{kind} {name}"))),
            "CSIDriver" => {
                done.extend(ensure_csidriver(client, &name, body).await?);
                continue;
            }
            _ => create(Api::<StorageClass>::all(client.clone()), body)
                .await
                .map(|made| made.then(|| format!("{kind} {name}"))),
        }
        .map_err(|e| Error::kube(format!("creating {kind} {name}"), e))?;
        done.extend(outcome);
    }
    Ok(done)
}

/// Creates the CSIDriver, or replaces an existing one whose `attachRequired` differs.
async fn ensure_csidriver(
    client: &Client,
    name: &str,
    body: Value,
) -> Result<Option<String>, Error> {
    let api = Api::<CSIDriver>::all(client.clone());
    let failed = |action: &str, e| Error::kube(format!("{action} CSIDriver {name}"), e);
    let want = body["spec"]["attachRequired"].as_bool().unwrap_or(true);
    if create(api.clone(), body.clone())
        .await
        .map_err(|e| failed("creating", e))?
    {
        return Ok(Some(format!("CSIDriver {name}")));
    }
    let Some(existing) = api.get_opt(name).await.map_err(|e| failed("reading", e))? else {
        return Ok(None);
    };
    // Kubernetes' default for an unset attachRequired is true.
    let have = existing.spec.attach_required.unwrap_or(true);
    if have == want {
        return Ok(None);
    }
    tracing::warn!(csidriver = %name, from = have, to = want, "attachRequired differs from the flags: replacing the CSIDriver");
    api.delete(name, &DeleteParams::default())
        .await
        .map_err(|e| failed("deleting", e))?;
    // The delete may take a moment to be visible to create.
    let patience = std::time::Duration::from_secs(5);
    let started = std::time::Instant::now();
    while !create(api.clone(), body.clone())
        .await
        .map_err(|e| failed("creating", e))?
    {
        if started.elapsed() > patience {
            return Err(Error::Timeout {
                what: format!("replacing CSIDriver {name}"),
                waited: patience,
                progress: "it still exists after it was deleted".into(),
            });
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    Ok(Some(format!(
        "replaced CSIDriver {name} (attachRequired {have} → {want})"
    )))
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
        for (kind, body) in initial_objects(false)
            .into_iter()
            .chain(driver_objects("hostpath.example.com", true))
        {
            match kind {
                "Namespace" => drop(serde_json::from_value::<Namespace>(body).unwrap()),
                "CSIDriver" => drop(serde_json::from_value::<CSIDriver>(body).unwrap()),
                _ => {
                    let sc: StorageClass = serde_json::from_value(body).unwrap();
                    assert!(sc.provisioner.contains('.'), "{}", sc.provisioner);
                    assert_eq!(
                        sc.volume_binding_mode.as_deref(),
                        Some("WaitForFirstConsumer")
                    );
                }
            }
        }
    }

    #[test]
    fn the_hostpath_csidriver_follows_the_flag() {
        for want in [false, true] {
            let driver = initial_objects(want)
                .into_iter()
                .filter(|(k, _)| *k == "CSIDriver")
                .map(|(_, b)| serde_json::from_value::<CSIDriver>(b).unwrap())
                .find(|d| d.metadata.name.as_deref() == Some(HOSTPATH_DRIVER))
                .unwrap();
            assert_eq!(driver.spec.attach_required, Some(want));
        }
        let (_, d) = &driver_objects("x.example.com", true)[0];
        assert_eq!(d["spec"]["attachRequired"], true);
    }
}
