//! The bench's objects on a ready cluster: N claim + pod pairs (or N claims alone) created at
//! once and timed to Ready (Bound), then everything deleted and waited for until gone.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use futures::future::try_join_all;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{StorageClass, VolumeAttachment};
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use super::measure::{self, Latency};
use super::report::{PodNumbers, ProvisionNumbers};
use super::scenarios::IMMEDIATE_CLASS;
use super::timeline::PodTrail;
use super::watch::{GoalWatch, LABEL, until_gone};
use cluster::kube_ops::delete_if_present;
use cluster::{EBS_DRIVER, Error, RunningCluster};

const NS: &str = "default";

pub(crate) fn claim_name(i: usize) -> String {
    format!("bench-{i:03}")
}

fn label() -> serde_json::Value {
    json!({ LABEL: "true" })
}

fn claim(i: usize, class: &str) -> Result<PersistentVolumeClaim, Error> {
    serde_json::from_value(json!({
        "metadata": {"name": claim_name(i), "namespace": NS, "labels": label()},
        "spec": {
            "storageClassName": class,
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }))
    .map_err(|e| Error::Config(format!("building claim {}: {e}", claim_name(i))))
}

/// No nodeSelector: the scheduler spreads the pods.
fn pod(i: usize) -> Result<Pod, Error> {
    serde_json::from_value(json!({
        "metadata": {"name": claim_name(i), "namespace": NS, "labels": label()},
        "spec": {
            "containers": [{
                "name": "app",
                "image": "busybox",
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            }],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim_name(i)}}],
        },
    }))
    .map_err(|e| Error::Config(format!("building pod {}: {e}", claim_name(i))))
}

fn pod_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn claim_bound(c: &PersistentVolumeClaim) -> bool {
    c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
}

/// Each name's latency from its start to when the watch saw it reach the goal.
fn latencies(
    started: &[(String, Instant)],
    reached: &std::collections::HashMap<String, Instant>,
) -> (Latency, Option<Instant>) {
    let mut samples = Vec::new();
    let mut last = None;
    for (name, start) in started {
        if let Some(at) = reached.get(name) {
            samples.push(at.saturating_duration_since(*start));
            last = last.max(Some(*at));
        }
    }
    (measure::latency(&samples), last)
}

/// N claim + pod pairs on `class`, all at once; returns when every pod is Ready, with each
/// pod's trail for the time line (its `stages` are drawn by the caller from the audit record).
/// The audit record is cleared at the first create, so what it holds afterwards is the
/// window's.
pub(crate) async fn pods_to_ready(
    cluster: &RunningCluster,
    client: &Client,
    class: &str,
    n: usize,
    sequential: bool,
    patience: Duration,
) -> Result<(PodNumbers, Vec<PodTrail>), Error> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NS);
    let mut watch = GoalWatch::spawn(pods.clone(), pod_ready);
    watch.synced(patience).await?;
    let objects: Vec<(PersistentVolumeClaim, Pod)> = (0..n)
        .map(|i| Ok((claim(i, class)?, pod(i)?)))
        .collect::<Result<_, Error>>()?;
    cluster.audit_clear();
    let t0 = Instant::now();
    let create = |(c, p): (PersistentVolumeClaim, Pod)| {
        let (pods, claims) = (pods.clone(), claims.clone());
        async move {
            let name = p.metadata.name.clone().unwrap_or_default();
            create(&claims, &c, "claim").await?;
            let start = Instant::now();
            create(&pods, &p, "pod").await?;
            Ok::<_, Error>((name, start))
        }
    };
    let what = format!("{n} pods on {class} Ready");
    let started = create_and_wait(objects, create, &mut watch, sequential, &what, patience).await?;
    let (ready, last) = latencies(&started, &watch.times());
    let mut pods_per_node = BTreeMap::new();
    for node in cluster.node_names() {
        pods_per_node.insert(node, 0);
    }
    let listed = pods
        .list(&ListParams::default().labels(super::watch::LABEL_SELECTOR))
        .await
        .map_err(|e| Error::kube("listing the bench's pods", e))?;
    let mut node_of = HashMap::new();
    for p in listed.items {
        if let Some(node) = p.spec.and_then(|s| s.node_name) {
            *pods_per_node.entry(node.clone()).or_default() += 1;
            node_of.insert(p.metadata.name.unwrap_or_default(), node);
        }
    }
    let trails = trails(client, &started, &node_of).await?;
    let numbers = PodNumbers {
        ready,
        all_ready_s: last.map_or(0.0, |l| l.saturating_duration_since(t0).as_secs_f64()),
        pods_per_node,
        stages: Vec::new(),
    };
    Ok((numbers, trails))
}

/// Each pod's PV (from the PVs' claimRefs) and the VolumeAttachment name its volume gets on
/// its node, for the time line.
async fn trails(
    client: &Client,
    started: &[(String, Instant)],
    node_of: &HashMap<String, String>,
) -> Result<Vec<PodTrail>, Error> {
    let volumes = Api::<PersistentVolume>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| Error::kube("listing PersistentVolumes", e))?;
    let mut volume_of = HashMap::new();
    for pv in volumes.items {
        let spec = pv.spec.unwrap_or_default();
        let (Some(claim), Some(csi)) = (spec.claim_ref.and_then(|c| c.name), spec.csi) else {
            continue;
        };
        volume_of.insert(claim, (pv.metadata.name.unwrap_or_default(), csi));
    }
    Ok(started
        .iter()
        .map(|(name, created)| {
            let volume = volume_of.get(name);
            let attachment = volume.zip(node_of.get(name)).map(|((_, csi), node)| {
                volume_plugins::names::volume_attachment_name(&csi.volume_handle, &csi.driver, node)
            });
            PodTrail {
                name: name.clone(),
                created: *created,
                volume: volume.map(|(pv, _)| pv.clone()),
                attachment,
            }
        })
        .collect())
}

/// The Immediate class for `ebs.csi.aws.com` the provisioning scenario uses.
pub(crate) async fn create_immediate_class(client: &Client) -> Result<(), Error> {
    let sc: StorageClass = serde_json::from_value(json!({
        "metadata": {"name": IMMEDIATE_CLASS},
        "provisioner": EBS_DRIVER,
        "parameters": {"type": "gp3"},
        "volumeBindingMode": "Immediate",
        "reclaimPolicy": "Delete",
    }))
    .map_err(|e| Error::Config(format!("building StorageClass {IMMEDIATE_CLASS}: {e}")))?;
    create(&Api::all(client.clone()), &sc, "StorageClass").await
}

/// Creates `obj`; the error names the `kind` and the object.
async fn create<K>(api: &Api<K>, obj: &K, kind: &str) -> Result<(), Error>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let meta = obj.meta();
    let name = match &meta.namespace {
        Some(ns) => format!("{ns}/{}", meta.name.as_deref().unwrap_or_default()),
        None => meta.name.clone().unwrap_or_default(),
    };
    api.create(&PostParams::default(), obj)
        .await
        .map_err(|e| Error::kube(format!("creating {kind} {name}"), e))?;
    Ok(())
}

/// N claims on `class`, all at once, until every one is Bound. Clears the audit record at
/// the first create, like [`pods_to_ready`].
pub(crate) async fn claims_to_bound(
    cluster: &RunningCluster,
    client: &Client,
    class: &str,
    n: usize,
    sequential: bool,
    patience: Duration,
) -> Result<ProvisionNumbers, Error> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NS);
    let mut watch = GoalWatch::spawn(claims.clone(), claim_bound);
    watch.synced(patience).await?;
    let objects: Vec<PersistentVolumeClaim> =
        (0..n).map(|i| claim(i, class)).collect::<Result<_, _>>()?;
    cluster.audit_clear();
    let t0 = Instant::now();
    let create = |c: PersistentVolumeClaim| {
        let claims = claims.clone();
        async move {
            let name = c.metadata.name.clone().unwrap_or_default();
            let start = Instant::now();
            create(&claims, &c, "claim").await?;
            Ok::<_, Error>((name, start))
        }
    };
    let what = format!("{n} claims on {class} Bound");
    let started = create_and_wait(objects, create, &mut watch, sequential, &what, patience).await?;
    let (bound, last) = latencies(&started, &watch.times());
    let all_bound_s = last.map_or(0.0, |l| l.saturating_duration_since(t0).as_secs_f64());
    Ok(ProvisionNumbers {
        bound,
        all_bound_s,
        claims_per_s: if all_bound_s > 0.0 {
            n as f64 / all_bound_s
        } else {
            0.0
        },
    })
}

/// Creates every item (`create` returns its name and the instant its timing starts) all at
/// once, or one at a time each once the one before reached the goal; returns when all did.
async fn create_and_wait<T, F, Fut>(
    items: Vec<T>,
    create: F,
    watch: &mut GoalWatch,
    sequential: bool,
    what: &str,
    patience: Duration,
) -> Result<Vec<(String, Instant)>, Error>
where
    F: Fn(T) -> Fut,
    Fut: std::future::Future<Output = Result<(String, Instant), Error>>,
{
    let started = if sequential {
        let mut started = Vec::new();
        for item in items {
            let (name, start) = create(item).await?;
            watch
                .reached(std::slice::from_ref(&name), what, patience)
                .await?;
            started.push((name, start));
        }
        started
    } else {
        try_join_all(items.into_iter().map(create)).await?
    };
    let names: Vec<String> = started.iter().map(|(n, _)| n.clone()).collect();
    watch.reached(&names, what, patience).await?;
    Ok(started)
}

fn names<K: kube::Resource>(items: Vec<K>) -> Vec<String> {
    items
        .into_iter()
        .map(|o| o.meta().name.clone().unwrap_or_default())
        .collect()
}

/// Deletes the bench's pods, then its claims, and waits until the pods, claims, every PV and
/// every VolumeAttachment are gone (the volumes deleted by their provisioner, detached first
/// where they were attached). Returns how long it took.
pub(crate) async fn clean_up(client: &Client, patience: Duration) -> Result<Duration, Error> {
    let started = Instant::now();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NS);
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let (mine, all) = (
        ListParams::default().labels(super::watch::LABEL_SELECTOR),
        ListParams::default(),
    );
    delete_all(&pods, &mine, "the bench's pods").await?;
    until_gone("the bench's pods gone", patience, || {
        list_names(&pods, &mine, "the bench's pods")
    })
    .await?;
    delete_all(&claims, &mine, "the bench's claims").await?;
    until_gone(
        "the bench's claims, every PV and VolumeAttachment gone",
        patience,
        || async {
            let mut left = list_names(&claims, &mine, "the bench's claims").await?;
            let pvs = list_names(&pvs, &all, "PVs").await?;
            left.extend(pvs.into_iter().map(|n| format!("PV {n}")));
            let vas = list_names(&vas, &all, "VolumeAttachments").await?;
            left.extend(vas.into_iter().map(|n| format!("VolumeAttachment {n}")));
            Ok(left)
        },
    )
    .await?;
    Ok(started.elapsed())
}

/// The names of what `api` lists with `params`; `what` names them in errors.
async fn list_names<K>(api: &Api<K>, params: &ListParams, what: &str) -> Result<Vec<String>, Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let listed = api
        .list(params)
        .await
        .map_err(|e| Error::kube(format!("listing {what}"), e))?;
    Ok(names(listed.items))
}

/// Deletes, all at once, every object `api` lists with `params`.
async fn delete_all<K>(api: &Api<K>, params: &ListParams, what: &str) -> Result<(), Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let listed = list_names(api, params, what).await?;
    try_join_all(listed.iter().map(|name| async move {
        delete_if_present(api, name, &format!("{what}: {NS}/{name}")).await
    }))
    .await?;
    Ok(())
}
