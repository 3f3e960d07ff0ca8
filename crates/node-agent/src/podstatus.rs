//! Pod status, as far as storage goes (the kubelet's status manager, without containers):
//! once every storage volume of a pod is published, the pod becomes `Running` with the
//! conditions `kubectl wait --for=condition=Ready` looks for, and the host paths of its
//! volumes in the [`VOLUME_PATHS_ANNOTATION`] annotation. A pod being deleted is confirmed
//! deleted (grace period 0) once its volumes are gone, as the kubelet does after its
//! containers stopped.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::{Api, Client};
use serde_json::json;
use tokio::sync::mpsc;

/// The pod annotation with the host path of each volume: a JSON object, pod volume name →
/// path (the publish path, or the block device link).
pub const VOLUME_PATHS_ANNOTATION: &str = "csi.rs/volume-paths";

/// Whether the pod already shows what [`mark_ready`] writes, with these paths.
pub fn is_marked_ready(pod: &Pod, paths: &BTreeMap<String, String>) -> bool {
    let status = pod.status.as_ref();
    let running = status.and_then(|s| s.phase.as_deref()) == Some("Running");
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    let annotated = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(VOLUME_PATHS_ANNOTATION))
        .and_then(|v| serde_json::from_str::<BTreeMap<String, String>>(v).ok())
        .is_some_and(|v| &v == paths);
    running && ready && annotated
}

/// The annotation first (so whoever sees Ready finds the paths), then the status subresource.
/// An annotation the API server forbids (a node's credentials under NodeRestriction) is left
/// out; the status is still written.
pub async fn mark_ready(
    client: &Client,
    pod: &Pod,
    paths: &BTreeMap<String, String>,
) -> Result<(), kube::Error> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let params = PatchParams::default();
    let value = serde_json::to_string(paths).unwrap_or_else(|_| "{}".into());
    match api
        .patch(
            name,
            &params,
            &Patch::Merge(json!({"metadata": {"annotations": {VOLUME_PATHS_ANNOTATION: value}}})),
        )
        .await
    {
        Ok(_) => {}
        // Running as the node itself (`system:node:<name>`), NodeRestriction lets it write a
        // pod's status but not its metadata, as for the kubelet. The annotation is our
        // addition for tools and tests; Ready is the status, which follows.
        Err(kube::Error::Api(e)) if e.code == 403 => {
            tracing::debug!(pod = %name, reason = %e.message, "the volume-paths annotation is not ours to write here; status only");
        }
        Err(e) => return Err(e),
    }
    let now = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let condition = |t: &str| json!({"type": t, "status": "True", "lastProbeTime": null, "lastTransitionTime": now});
    let containers: Vec<serde_json::Value> = pod
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|c| {
            json!({
                "name": c.name,
                "image": c.image.clone().unwrap_or_default(),
                "imageID": "",
                "ready": true,
                "started": true,
                "restartCount": 0,
                "state": {"running": {"startedAt": now}},
            })
        })
        .collect();
    api.patch_status(
        name,
        &params,
        &Patch::Merge(json!({
            "status": {
                "phase": "Running",
                "startTime": pod.status.as_ref().and_then(|s| s.start_time.clone()).map_or_else(|| json!(now), |t| json!(t)),
                // The agent runs no pod network; loopback is an address every API server
                // accepts, and csi-cluster's nodes all live on it.
                "hostIP": "127.0.0.1",
                "conditions": [
                    condition("PodReadyToStartContainers"),
                    condition("Initialized"),
                    condition("Ready"),
                    condition("ContainersReady"),
                    condition("PodScheduled"),
                ],
                "containerStatuses": containers,
            }
        })),
    )
    .await?;
    Ok(())
}

/// Confirms a pod's deletion (grace period 0, only this pod: UID precondition).
pub async fn confirm_deleted(client: &Client, pod: &Pod) -> Result<(), kube::Error> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: pod.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Writes pod statuses and deletion confirmations in the background, at most one write per
/// pod at a time; a failed write is tried again on a later pass.
pub struct StatusManager {
    client: Client,
    /// Pods (UID) with a write in flight.
    posting: HashSet<String>,
    /// Pods whose deletion was confirmed (kept while the pod is still in the cache).
    confirmed: HashSet<String>,
    /// The volume paths each pod was marked Ready with: the watch cache shows a write only a
    /// moment later, and a pass in between must not post the same status again.
    posted: HashMap<String, BTreeMap<String, String>>,
    done_tx: mpsc::UnboundedSender<(String, bool)>,
    done_rx: mpsc::UnboundedReceiver<(String, bool)>,
    /// Writes in flight at once (the others queue here, not as open requests).
    writing: Arc<tokio::sync::Semaphore>,
}

/// Pod writes in flight at once.
const MAX_CONCURRENT_WRITES: usize = 8;

impl std::fmt::Debug for StatusManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusManager")
            .field("posting", &self.posting.len())
            .field("confirmed", &self.confirmed.len())
            .finish_non_exhaustive()
    }
}

impl StatusManager {
    pub fn new(client: Client) -> Self {
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        Self {
            client,
            posting: HashSet::new(),
            confirmed: HashSet::new(),
            posted: HashMap::new(),
            writing: Arc::new(tokio::sync::Semaphore::new(MAX_CONCURRENT_WRITES)),
            done_tx,
            done_rx,
        }
    }

    /// Waits for the next finished write (for the caller's `select!`).
    pub async fn next_done(&mut self) -> Option<(String, bool)> {
        self.done_rx.recv().await
    }

    /// Applies a finished write.
    pub fn done(&mut self, uid: &str, ok: bool) {
        self.posting.remove(uid);
        if !ok {
            self.confirmed.remove(uid);
            self.posted.remove(uid);
        }
    }

    /// Applies every write that finished meanwhile.
    pub fn collect_done(&mut self) {
        while let Ok((uid, ok)) = self.done_rx.try_recv() {
            self.done(&uid, ok);
        }
    }

    /// Marks the pod Ready with these volume paths, unless it shows them already.
    pub fn post_ready(&mut self, pod: &Arc<Pod>, uid: &str, paths: BTreeMap<String, String>) {
        if self.posting.contains(uid)
            || self.posted.get(uid) == Some(&paths)
            || is_marked_ready(pod, &paths)
        {
            return;
        }
        self.posting.insert(uid.to_string());
        self.posted.insert(uid.to_string(), paths.clone());
        let (client, pod, tx, uid) = (
            self.client.clone(),
            pod.clone(),
            self.done_tx.clone(),
            uid.to_string(),
        );
        let writing = self.writing.clone();
        tokio::spawn(async move {
            let _turn = writing.acquire_owned().await;
            let r = mark_ready(&client, &pod, &paths).await;
            if let Err(e) = &r {
                tracing::warn!(pod_uid = %uid, error = %e, "posting the pod status failed; retried on a later pass");
            }
            let _ = tx.send((uid, r.is_ok()));
        });
    }

    /// Confirms the deletion of a pod being deleted (once).
    pub fn confirm_deletion(&mut self, pod: Arc<Pod>, uid: &str) {
        if self.confirmed.contains(uid) || self.posting.contains(uid) {
            return;
        }
        self.confirmed.insert(uid.to_string());
        self.posting.insert(uid.to_string());
        let (client, tx, uid) = (self.client.clone(), self.done_tx.clone(), uid.to_string());
        let writing = self.writing.clone();
        tokio::spawn(async move {
            let _turn = writing.acquire_owned().await;
            let r = confirm_deleted(&client, &pod).await;
            if let Err(e) = &r {
                tracing::warn!(pod_uid = %uid, error = %e, "confirming the pod's deletion failed; retried");
            }
            let _ = tx.send((uid, r.is_ok()));
        });
    }

    /// Forgets pods that left the cache.
    pub fn retain(&mut self, alive: &HashSet<String>) {
        self.confirmed.retain(|uid| alive.contains(uid));
        self.posted.retain(|uid, _| alive.contains(uid));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus};

    #[test]
    fn marked_ready_needs_phase_condition_and_the_same_paths() {
        let paths: BTreeMap<String, String> = [("data".to_string(), "/p".to_string())].into();
        let mut pod = Pod::default();
        assert!(!is_marked_ready(&pod, &paths));
        pod.status = Some(PodStatus {
            phase: Some("Running".into()),
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        assert!(!is_marked_ready(&pod, &paths), "no annotation yet");
        pod.metadata.annotations = Some(
            [(
                VOLUME_PATHS_ANNOTATION.to_string(),
                r#"{"data":"/p"}"#.to_string(),
            )]
            .into(),
        );
        assert!(is_marked_ready(&pod, &paths));
        let other: BTreeMap<String, String> = [("data".to_string(), "/q".to_string())].into();
        assert!(!is_marked_ready(&pod, &other));
    }
}
