//! The few Kubernetes calls a demo makes, with waits that say what they were waiting for
//! (and the pod's last Events) when they run out of time.

use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::Error;

/// The node agent's annotation on a pod: its volumes' host paths by volume name (JSON).
pub const VOLUME_PATHS_ANNOTATION: &str = "csi.rs/volume-paths";

/// Polls `check` until it returns `Some`, at most `patience`; the error names `what` and the
/// last progress `check` reported through `Err` of its inner result.
pub async fn wait_for<T, F, Fut>(what: &str, patience: Duration, mut check: F) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>, Error>>,
{
    let started = Instant::now();
    let mut progress = String::from("nothing seen yet");
    loop {
        match check().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => progress = e.to_string(),
        }
        if started.elapsed() > patience {
            return Err(Error::Timeout {
                what: what.to_string(),
                waited: patience,
                progress,
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn from_json<K: serde::de::DeserializeOwned>(v: Value) -> Result<K, Error> {
    serde_json::from_value(v)
        .map_err(|e| Error::kube("building an object", kube::Error::SerdeError(e)))
}

/// A 1Gi ReadWriteOnce claim of `class` (`None`: no class, for a pre-bound static PV) bound to
/// `volume` when given.
pub async fn create_claim(
    client: &Client,
    name: &str,
    class: Option<&str>,
    volume: Option<&str>,
) -> Result<PersistentVolumeClaim, Error> {
    let mut spec = json!({
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "1Gi"}},
        "storageClassName": class.unwrap_or(""),
    });
    if let Some(v) = volume {
        spec["volumeName"] = json!(v);
    }
    let claim =
        from_json(json!({"metadata": {"name": name, "namespace": "default"}, "spec": spec}))?;
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &claim)
        .await
        .map_err(|e| Error::kube(format!("creating PersistentVolumeClaim default/{name}"), e))
}

/// A pod using claim `claim` as volume `data`, held to `node` by a nodeSelector (the scheduler
/// binds it).
pub async fn create_pod(
    client: &Client,
    name: &str,
    claim: &str,
    node: &str,
) -> Result<Pod, Error> {
    let pod = from_json(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [{
                "name": "app",
                "image": "busybox",
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            }],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
        },
    }))?;
    Api::<Pod>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &pod)
        .await
        .map_err(|e| Error::kube(format!("creating Pod default/{name}"), e))
}

/// Creates a cluster-scoped PersistentVolume from JSON.
pub async fn create_pv(client: &Client, body: Value) -> Result<PersistentVolume, Error> {
    let pv: PersistentVolume = from_json(body)?;
    let name = pv.metadata.name.clone().unwrap_or_default();
    Api::<PersistentVolume>::all(client.clone())
        .create(&PostParams::default(), &pv)
        .await
        .map_err(|e| Error::kube(format!("creating PersistentVolume {name}"), e))
}

/// The pod once its Ready condition is True; on timeout the error carries its last Events.
pub async fn wait_pod_ready(client: &Client, name: &str, patience: Duration) -> Result<Pod, Error> {
    let pods = Api::<Pod>::namespaced(client.clone(), "default");
    let ready = wait_for(&format!("pod {name} Ready"), patience, || async {
        let pod = pods
            .get(name)
            .await
            .map_err(|e| Error::kube(format!("reading pod {name}"), e))?;
        let is_ready = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        Ok(is_ready.then_some(pod))
    })
    .await;
    match ready {
        Ok(pod) => Ok(pod),
        Err(Error::Timeout {
            what,
            waited,
            progress,
        }) => Err(Error::Timeout {
            what,
            waited,
            progress: format!("{progress}; last events: {}", events_of(client, name).await),
        }),
        Err(e) => Err(e),
    }
}

/// The pod's Events, oldest first, as `Reason: message` lines joined by "; ".
pub async fn events_of(client: &Client, pod: &str) -> String {
    let events = Api::<Event>::namespaced(client.clone(), "default")
        .list(&ListParams::default().fields(&format!("involvedObject.name={pod}")))
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    events
        .iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(pod))
        .map(|e| {
            format!(
                "{}: {}",
                e.reason.as_deref().unwrap_or("?"),
                e.message.as_deref().unwrap_or("")
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Deletes a pod and waits until it is gone (its volumes unmounted by the node agent).
pub async fn delete_pod(client: &Client, name: &str, patience: Duration) -> Result<(), Error> {
    let pods = Api::<Pod>::namespaced(client.clone(), "default");
    delete_and_wait(&pods, "pod", name, patience).await
}

/// Deletes `name` (`what` names it in errors: `pod default/x`); one already gone is fine.
pub async fn delete_if_present<K>(api: &Api<K>, name: &str, what: &str) -> Result<(), Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(Error::kube(format!("deleting {what}"), e)),
    }
}

/// [`delete_if_present`], then waits until the object is gone (finalizers done).
async fn delete_and_wait<K>(
    api: &Api<K>,
    kind: &str,
    name: &str,
    patience: Duration,
) -> Result<(), Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    delete_if_present(api, name, &format!("{kind} {name}")).await?;
    wait_for(&format!("{kind} {name} gone"), patience, || async {
        api.get_opt(name)
            .await
            .map(|o| o.is_none().then_some(()))
            .map_err(|e| Error::kube(format!("reading {kind} {name}"), e))
    })
    .await
}

/// The host path of the pod's volume `data`, from the node agent's annotation.
pub fn data_path(pod: &Pod) -> Result<PathBuf, Error> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let paths = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(VOLUME_PATHS_ANNOTATION))
        .ok_or_else(|| {
            Error::Check(format!(
                "pod {name} has no {VOLUME_PATHS_ANNOTATION} annotation"
            ))
        })?;
    let paths: Value = serde_json::from_str(paths)
        .map_err(|e| Error::Check(format!("pod {name}: {VOLUME_PATHS_ANNOTATION}: {e}")))?;
    paths["data"].as_str().map(PathBuf::from).ok_or_else(|| {
        Error::Check(format!(
            "pod {name}: {VOLUME_PATHS_ANNOTATION} has no \"data\""
        ))
    })
}

/// The PV bound to claim `claim`, once it is bound.
pub async fn bound_volume(
    client: &Client,
    claim: &str,
    patience: Duration,
) -> Result<PersistentVolume, Error> {
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), "default");
    let pv_name = wait_for(&format!("claim {claim} Bound"), patience, || async {
        let c = claims
            .get(claim)
            .await
            .map_err(|e| Error::kube(format!("reading claim {claim}"), e))?;
        Ok(c.spec.and_then(|s| s.volume_name).filter(|n| !n.is_empty()))
    })
    .await?;
    Api::<PersistentVolume>::all(client.clone())
        .get(&pv_name)
        .await
        .map_err(|e| Error::kube(format!("reading PersistentVolume {pv_name}"), e))
}

/// VolumeAttachments of PV `pv`.
pub async fn attachments_of(client: &Client, pv: &str) -> Result<Vec<VolumeAttachment>, Error> {
    let all = Api::<VolumeAttachment>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| Error::kube("listing VolumeAttachments", e))?;
    Ok(all
        .items
        .into_iter()
        .filter(|va| va.spec.source.persistent_volume_name.as_deref() == Some(pv))
        .collect())
}

/// Every VolumeAttachment.
pub async fn all_attachments(client: &Client) -> Result<Vec<VolumeAttachment>, Error> {
    Api::<VolumeAttachment>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .map_err(|e| Error::kube("listing VolumeAttachments", e))
}

/// `node=attached` for each VolumeAttachment, for printing.
pub fn describe_attachments(vas: &[VolumeAttachment]) -> String {
    if vas.is_empty() {
        return "none".into();
    }
    vas.iter()
        .map(|va| {
            format!(
                "{} ({} on {}, attached={})",
                va.metadata.name.as_deref().unwrap_or("?"),
                va.spec.attacher,
                va.spec.node_name,
                va.status.as_ref().is_some_and(|s| s.attached)
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Deletes a claim and waits until it is gone.
pub async fn delete_claim(client: &Client, name: &str, patience: Duration) -> Result<(), Error> {
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), "default");
    delete_and_wait(&claims, "claim", name, patience).await
}
