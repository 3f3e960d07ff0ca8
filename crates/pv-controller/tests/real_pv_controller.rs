//! Our PV controller against kube-controller-manager's, on real Kubernetes v1.26: the same
//! scenarios run on two clusters one after the other, (A) with kcm's own
//! `persistentvolume-binder`, `pvc-protection` and `pv-protection` and (B) with kcm running
//! without those three and our `pv-controller` binary running instead (a host process with the
//! admin kubeconfig, `--feature-gates=CSIMigrationAWS=true` as kcm v1.26 has it locked on).
//! Both clusters have kube-scheduler and a real kubelet, which mounts the hostPath and local
//! volumes of the scenarios' pods.
//!
//! The scenarios (the apiserver-lite suites' `binding`, `lifecycle` and `provisioning`), each in
//! its own namespace with its own PV names, run at the same time on one cluster:
//! - `static`: binding by size, access mode, class and selector; a claim nothing fits;
//! - `prebound`: a PV with a `claimRef`, a claim with a `volumeName` (one naming no PV);
//! - `wffc`: WaitForFirstConsumer classes, one with a provisioner nobody serves, one with a
//!   static local volume; the claims wait until a pod uses them; a claim whose pod no node
//!   takes waits for the pod to be scheduled;
//! - `reclaim`: Retain, Delete of PVs no deleter serves (nfs, csi without provisioned-by) and of
//!   an externally provisioned PV;
//! - `protect`: a claim a running pod uses and its PV are deleted and stay until the pod goes;
//! - `migrate`: an in-tree `kubernetes.io/aws-ebs` class and a PV "provisioned" by it;
//! - `default-class`: a claim without a class gets the default class once there is one
//!   (RetroactiveDefaultStorageClass, beta and on in v1.26); one that asks for "" does not;
//! - `lost`: a bound claim whose PV is removed (finalizer taken off, deleted) is Lost;
//! - `safety`: a PV pre-bound (`claimRef`) to a claim it is too small for is not bound; a PV
//!   being deleted is not bound to the claim naming it; a PV a user pre-bound with a uid to a
//!   claim bound elsewhere loses the uid; a Bound claim keeps its `status.capacity` when its PV
//!   grows (an expansion waiting for the node).
//!
//! What the controller side wrote (phases, claimRef, volumeName, annotations, finalizers, the
//! Events on claims and volumes with their reasons, messages and source) is recorded at fixed
//! points, printed, and the two runs must be equal, key by key.
// Test code (helpers included): a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_harness::support::{assert_same_as_kcm, eventually_with_logs, spawn_component};
use k8s_harness::{Cluster, ClusterOptions};
use k8s_openapi::api::core::v1::{
    Event, Namespace, PersistentVolume, PersistentVolumeClaim, Pod, ServiceAccount,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use test_support::objects::create_json;

const NODE: &str = "node-pv";
const NAMESPACES: [&str; 9] = [
    "static",
    "prebound",
    "wffc",
    "reclaim",
    "protect",
    "migrate",
    "default-class",
    "lost",
    "safety",
];
/// PV names start with their scenario's prefix.
const PV_PREFIXES: [&str; 8] = ["st-", "pb-", "wf-", "rc-", "pr-", "mg-", "ls-", "sf-"];
/// How long one step may take before the test fails with the logs' ends.
const PATIENCE: Duration = Duration::from_secs(60);
/// How long a state that should last is watched before it is recorded.
const SETTLE: Duration = Duration::from_secs(3);
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Who runs the PV controllers.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Side {
    Kcm,
    Ours,
}

/// What a scenario needs: the admin client, the logs to show on a time-out, a host dir.
struct Ctx {
    client: Client,
    logs: Vec<PathBuf>,
    host: PathBuf,
    /// What the scenarios recorded, by key.
    record: std::sync::Mutex<BTreeMap<String, Value>>,
}

impl Ctx {
    fn pvcs(&self, ns: &str) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client.clone(), ns)
    }
    fn pvs(&self) -> Api<PersistentVolume> {
        Api::all(self.client.clone())
    }
    fn pods(&self, ns: &str) -> Api<Pod> {
        Api::namespaced(self.client.clone(), ns)
    }
    fn put(&self, key: &str, v: Value) {
        self.record.lock().unwrap().insert(key.to_string(), v);
    }

    /// `probe`'s first `Some` within [`PATIENCE`]; on time-out, panics with the logs' ends.
    async fn eventually<T, F, Fut>(&self, what: &str, probe: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        eventually_with_logs(what, PATIENCE, &self.logs, probe).await
    }

    async fn pv_phase(&self, name: &str, phase: &str) {
        let pvs = self.pvs();
        self.eventually(&format!("PV {name} {phase}"), || {
            let pvs = pvs.clone();
            async move {
                let v = pvs.get_opt(name).await.ok()??;
                (v.status?.phase.as_deref() == Some(phase)).then_some(())
            }
        })
        .await;
    }

    async fn pvc_phase(&self, ns: &str, name: &str, phase: &str) {
        let pvcs = self.pvcs(ns);
        self.eventually(&format!("claim {ns}/{name} {phase}"), || {
            let pvcs = pvcs.clone();
            async move {
                let c = pvcs.get_opt(name).await.ok()??;
                (c.status?.phase.as_deref() == Some(phase)).then_some(())
            }
        })
        .await;
    }

    async fn pvc_gone(&self, ns: &str, name: &str) {
        let pvcs = self.pvcs(ns);
        self.eventually(&format!("claim {ns}/{name} gone"), || {
            let pvcs = pvcs.clone();
            async move { pvcs.get_opt(name).await.ok()?.is_none().then_some(()) }
        })
        .await;
    }

    async fn pv_gone(&self, name: &str) {
        let pvs = self.pvs();
        self.eventually(&format!("PV {name} gone"), || {
            let pvs = pvs.clone();
            async move { pvs.get_opt(name).await.ok()?.is_none().then_some(()) }
        })
        .await;
    }

    /// Waits for an Event with `reason` on the claim `ns/name`.
    async fn claim_event(&self, ns: &str, name: &str, reason: &str) {
        let events: Api<Event> = Api::namespaced(self.client.clone(), ns);
        self.eventually(&format!("Event {reason} on claim {ns}/{name}"), || {
            let events = events.clone();
            async move {
                let list = events.list(&Default::default()).await.ok()?;
                list.items
                    .iter()
                    .any(|e| {
                        e.involved_object.name.as_deref() == Some(name)
                            && e.involved_object.kind.as_deref() == Some("PersistentVolumeClaim")
                            && e.reason.as_deref() == Some(reason)
                    })
                    .then_some(())
            }
        })
        .await;
    }

    async fn pod_running(&self, ns: &str, name: &str) {
        let pods = self.pods(ns);
        self.eventually(&format!("pod {ns}/{name} Running"), || {
            let pods = pods.clone();
            async move {
                let p = pods.get_opt(name).await.ok()??;
                (p.status?.phase.as_deref() == Some("Running")).then_some(())
            }
        })
        .await;
    }

    /// The claim as the controller side wrote it.
    async fn snap_pvc(&self, ns: &str, name: &str) -> Value {
        let Some(c) = self.pvcs(ns).get_opt(name).await.unwrap() else {
            return json!("absent");
        };
        let spec = c.spec.clone().unwrap_or_default();
        let status = c.status.clone().unwrap_or_default();
        json!({
            "phase": status.phase,
            "volumeName": spec.volume_name,
            "capacity": status.capacity.map(|c| c.into_iter().map(|(k, v)| (k, v.0)).collect::<BTreeMap<_, _>>()),
            "accessModes": status.access_modes,
            "annotations": annotations(&c.metadata),
            "finalizers": c.metadata.finalizers,
            "deleting": c.metadata.deletion_timestamp.is_some(),
        })
    }

    /// The volume as the controller side wrote it (claimRef's uid and resourceVersion only as
    /// "set or not": they differ from run to run).
    async fn snap_pv(&self, name: &str) -> Value {
        let Some(v) = self.pvs().get_opt(name).await.unwrap() else {
            return json!("absent");
        };
        let spec = v.spec.clone().unwrap_or_default();
        let status = v.status.clone().unwrap_or_default();
        let claim_ref = spec.claim_ref.map(|r| {
            json!({
                "kind": r.kind, "apiVersion": r.api_version, "namespace": r.namespace,
                "name": r.name, "uid_set": r.uid.is_some(),
                "resourceVersion_set": r.resource_version.is_some(),
            })
        });
        json!({
            "phase": status.phase,
            "message": status.message,
            "reason": status.reason,
            "claimRef": claim_ref,
            "annotations": annotations(&v.metadata),
            "finalizers": v.metadata.finalizers,
            "deleting": v.metadata.deletion_timestamp.is_some(),
        })
    }
}

fn annotations(meta: &ObjectMeta) -> BTreeMap<String, String> {
    let mut a = meta.annotations.clone().unwrap_or_default();
    a.remove(LAST_APPLIED);
    a
}

/// A PV of `size`, `modes`, `class`, `policy` on `source` (a JSON object with one volume
/// source); `extra` is merged into it (labels, claimRef, annotations).
fn pv(name: &str, size: &str, modes: &[&str], class: &str, policy: &str, source: Value) -> Value {
    let mut spec = json!({
        "capacity": {"storage": size},
        "accessModes": modes,
        "storageClassName": class,
        "persistentVolumeReclaimPolicy": policy,
    });
    for (k, v) in source.as_object().unwrap() {
        spec[k] = v.clone();
    }
    json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name}, "spec": spec})
}

fn pvc(ns: &str, name: &str, size: &str, modes: &[&str], class: Option<&str>) -> Value {
    let mut spec = json!({
        "accessModes": modes,
        "resources": {"requests": {"storage": size}},
    });
    if let Some(class) = class {
        spec["storageClassName"] = json!(class);
    }
    json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
           "metadata": {"name": name, "namespace": ns}, "spec": spec})
}

fn pod(ns: &str, name: &str, claim: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
    "spec": {
        "hostNetwork": true,
        "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "app", "image": k8s_harness::PAUSE_IMAGE,
            "imagePullPolicy": "Never",
            "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
    }})
}

fn host_path(dir: &Path) -> Value {
    json!({"hostPath": {"path": dir.to_str().unwrap(), "type": "DirectoryOrCreate"}})
}

fn nfs() -> Value {
    json!({"nfs": {"server": "127.0.0.1", "path": "/exports/none"}})
}

const RWO: &[&str] = &["ReadWriteOnce"];
const RWX: &[&str] = &["ReadWriteMany"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_pv_controller_writes_what_kcms_writes() {
    let t0 = Instant::now();
    let Some(kcm) = run(Side::Kcm).await else {
        return;
    };
    let Some(ours) = run(Side::Ours).await else {
        return;
    };
    println!(
        "kube-controller-manager's PV controllers:\n{}",
        serde_json::to_string_pretty(&kcm).unwrap()
    );
    println!(
        "pv-controller:\n{}",
        serde_json::to_string_pretty(&ours).unwrap()
    );
    println!("both runs took {:?}", t0.elapsed());
    assert_same_as_kcm(&kcm, &ours, |k| k.starts_with("known_differences/"));
    // The scenarios' own claims, whoever runs the controllers.
    assert_eq!(
        kcm["static/claims"]["st-c-size"]["volumeName"],
        json!("st-fit")
    );
    assert_eq!(
        kcm["static/claims"]["st-c-fast"]["volumeName"],
        json!("st-fast")
    );
    assert_eq!(kcm["static/claims"]["st-c-none"]["phase"], json!("Pending"));
    assert_eq!(kcm["protect/while-pod"]["claim"]["deleting"], json!(true));
    assert_eq!(kcm["protect/while-pod"]["pv"]["phase"], json!("Bound"));
    assert_eq!(
        kcm["protect/while-pod"]["pr-pending"]["phase"],
        json!("Released")
    );
    assert_eq!(kcm["wffc/after-pod"]["wf-c-local"]["phase"], json!("Bound"));
    assert_eq!(
        kcm["wffc/after-pod"]["wf-c-ext"]["annotations"]["volume.kubernetes.io/selected-node"],
        json!(NODE)
    );
    assert_eq!(kcm["reclaim"]["rc-csi"]["phase"], json!("Failed"));
    let safety = &kcm["safety"];
    assert_eq!(safety["sf-c-small"]["phase"], json!("Pending"));
    assert_eq!(safety["sf-c-small"]["volumeName"], Value::Null);
    assert_eq!(safety["sf-small"]["claimRef"]["uid_set"], json!(false));
    assert_eq!(safety["sf-c-dying"]["phase"], json!("Pending"));
    assert_eq!(safety["sf-dying"]["claimRef"], Value::Null);
    assert_eq!(safety["sf-stale"]["phase"], json!("Available"));
    assert_eq!(safety["sf-stale"]["claimRef"]["name"], json!("sf-c-owner"));
    assert_eq!(safety["sf-stale"]["claimRef"]["uid_set"], json!(false));
    assert_eq!(safety["sf-c-grow"]["capacity"]["storage"], json!("2Gi"));
    assert_eq!(
        kcm["default-class/after"]["df-c-later"]["storageClassName"],
        json!("df-default")
    );
    assert_eq!(kcm["reclaim"]["rc-external"]["phase"], json!("Released"));
    assert_eq!(
        kcm["migrate"]["mg-c-new"]["annotations"]["volume.kubernetes.io/storage-provisioner"],
        json!("ebs.csi.aws.com")
    );
    assert_eq!(
        kcm["migrate"]["mg-pv"]["annotations"]["pv.kubernetes.io/migrated-to"],
        json!("ebs.csi.aws.com")
    );
    assert!(
        kcm["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e.as_str().unwrap().contains("FailedBinding")),
        "{}",
        kcm["events"]
    );
}

/// One cluster with `side` running the PV controllers, every scenario at once; what they
/// recorded, with the Events. `None`: the cluster could not start here (skipped).
async fn run(side: Side) -> Option<BTreeMap<String, Value>> {
    let controllers = match side {
        Side::Kcm => "*",
        Side::Ours => "*,-persistentvolume-binder,-pvc-protection,-pv-protection",
    };
    let t0 = Instant::now();
    let cluster = Cluster::start_or_skip(
        ClusterOptions::full(controllers, NODE).controller_manager_arg("--v=4"),
    )
    .await?;
    let work = tempfile::tempdir().unwrap();
    let mut logs = vec![
        cluster.log_path("kube-controller-manager"),
        cluster.log_path("kube-scheduler"),
        cluster.log_path("kubelet"),
    ];
    let _ours = (side == Side::Ours).then(|| {
        let log = work.path().join("pv-controller.log");
        logs.push(log.clone());
        spawn_component(
            Path::new(env!("CARGO_BIN_EXE_pv-controller")),
            &[
                format!("--kubeconfig={}", cluster.admin_kubeconfig().display()),
                "--leader-elect=false".into(),
                "--feature-gates=CSIMigrationAWS=true".into(),
                "--v=4".into(),
            ],
            &log,
        )
    });
    let client = cluster.admin_client().await.unwrap();
    let ctx = Ctx {
        client: client.clone(),
        logs,
        host: work.path().to_path_buf(),
        record: Default::default(),
    };
    // Namespaces, and their default ServiceAccounts (the admission of pods needs them).
    let nss: Api<Namespace> = Api::all(client.clone());
    for ns in NAMESPACES {
        create_json(
            &nss,
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        )
        .await;
    }
    for ns in NAMESPACES {
        let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
        ctx.eventually(&format!("ServiceAccount {ns}/default"), || {
            let sas = sas.clone();
            async move { sas.get_opt("default").await.ok()?.map(|_| ()) }
        })
        .await;
    }
    let started = Instant::now();
    tokio::join!(
        timed(side, "static", static_binding(&ctx)),
        timed(side, "prebound", prebound(&ctx)),
        timed(side, "wffc", wffc(&ctx)),
        timed(side, "reclaim", reclaim(&ctx)),
        timed(side, "protect", protect(&ctx)),
        timed(side, "migrate", migrate(&ctx)),
        timed(side, "default-class", default_class(&ctx)),
        timed(side, "lost", lost(&ctx)),
        timed(side, "safety", safety(&ctx)),
    );
    // Events are written after the objects: give the last ones a moment.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (events, wordings, timing) = events(&client).await;
    ctx.put("events", events);
    ctx.put("known_differences/WaitForPodScheduled by timing", timing);
    ctx.put("known_differences/ExternalProvisioning wording", wordings);
    println!(
        "{side:?}: scenarios {:?}, whole run {:?}",
        started.elapsed(),
        t0.elapsed()
    );
    Some(ctx.record.into_inner().unwrap())
}

/// Runs a scenario and prints how long it took.
async fn timed(side: Side, name: &str, scenario: impl std::future::Future<Output = ()>) {
    let t0 = Instant::now();
    scenario.await;
    println!("{side:?}: scenario {name} {:?}", t0.elapsed());
}

/// Every Event on a claim or volume of the scenarios: `kind ns/name type reason source: message`,
/// each once (a repeat is the same fact); the wordings of `ExternalProvisioning` seen; the
/// `WaitForPodScheduled` Events that depend on timing.
async fn events(client: &Client) -> (Value, Value, Value) {
    let list = Api::<Event>::all(client.clone())
        .list(&Default::default())
        .await
        .unwrap();
    let mut out = BTreeSet::new();
    let mut wordings = BTreeSet::new();
    let mut timing = BTreeSet::new();
    for e in list.items {
        let o = &e.involved_object;
        let kind = o.kind.clone().unwrap_or_default();
        let name = o.name.clone().unwrap_or_default();
        let ours = match kind.as_str() {
            "PersistentVolumeClaim" => {
                NAMESPACES.contains(&o.namespace.as_deref().unwrap_or_default())
            }
            "PersistentVolume" => PV_PREFIXES.iter().any(|p| name.starts_with(p)),
            _ => false,
        };
        if !ours {
            continue;
        }
        let reason = e.reason.unwrap_or_default();
        let mut message = e.message.unwrap_or_default();
        if reason == "WaitForPodScheduled" && name != "wf-c-stuck" {
            // Timing: kcm syncs a claim when it changes and every 15 s, not when a pod that
            // uses it is created, so it writes this only when a resync falls between the
            // pod's creation and its scheduling; ours passes over the claims on pod changes too.
            timing.insert(format!("{kind} {name}: {message}"));
            continue;
        }
        if let Some(provisioner) = external_provisioner(&reason, &message) {
            wordings.insert(message.clone());
            message = format!("<waiting for external provisioner {provisioner}>");
        }
        out.insert(format!(
            "{kind} {}/{name} {} {reason} [{}]: {message}",
            o.namespace.clone().unwrap_or_default(),
            e.type_.unwrap_or_default(),
            e.source.and_then(|s| s.component).unwrap_or_default(),
        ));
    }
    (json!(out), json!(wordings), json!(timing))
}

/// The provisioner an `ExternalProvisioning` Event names. Its wording is a known difference:
/// kcm v1.26 writes `waiting for a volume to be created, either by external provisioner "X" or
/// manually created by system administrator`, ours the wording of kcm v1.28 and later
/// (kubernetes PR 118262), `Waiting for a volume to be created either by the external
/// provisioner 'X' or manually by the system administrator. If volume creation is delayed, ...`.
/// Compared: the reason and the provisioner; printed: both wordings.
fn external_provisioner(reason: &str, message: &str) -> Option<String> {
    if reason != "ExternalProvisioning" {
        return None;
    }
    let (_, rest) = message.split_once("external provisioner ")?;
    let quote = rest.chars().next().filter(|c| *c == '"' || *c == '\'')?;
    let rest = &rest[1..];
    Some(rest[..rest.find(quote)?].to_string())
}

/// Static binding by size, access mode, class and selector; a claim nothing fits.
async fn static_binding(ctx: &Ctx) {
    let ns = "static";
    let pvs = ctx.pvs();
    let dir = |n: &str| host_path(&ctx.host.join(n));
    create_json(&pvs, pv("st-big", "10Gi", RWO, "", "Retain", dir("st-big"))).await;
    create_json(&pvs, pv("st-fit", "2Gi", RWO, "", "Retain", dir("st-fit"))).await;
    create_json(&pvs, pv("st-rwx", "1Gi", RWX, "", "Retain", dir("st-rwx"))).await;
    create_json(
        &pvs,
        pv("st-gold", "1Gi", RWO, "gold", "Retain", dir("st-gold")),
    )
    .await;
    let mut fast = pv("st-fast", "1Gi", RWO, "", "Retain", dir("st-fast"));
    fast["metadata"]["labels"] = json!({"tier": "fast"});
    create_json(&pvs, fast).await;
    let names = ["st-big", "st-fit", "st-rwx", "st-gold", "st-fast"];
    for n in names {
        ctx.pv_phase(n, "Available").await;
    }
    let pvcs = ctx.pvcs(ns);
    let mut sel = pvc(ns, "st-c-fast", "1Gi", RWO, Some(""));
    sel["spec"]["selector"] = json!({"matchLabels": {"tier": "fast"}});
    let claims = [
        sel,
        pvc(ns, "st-c-size", "1Gi", RWO, Some("")),
        pvc(ns, "st-c-rwx", "500Mi", RWX, Some("")),
        pvc(ns, "st-c-gold", "1Gi", RWO, Some("gold")),
    ];
    // One at a time: which volume each gets does not depend on the order of the queue.
    for c in claims {
        let name = c["metadata"]["name"].as_str().unwrap().to_string();
        create_json(&pvcs, c).await;
        ctx.pvc_phase(ns, &name, "Bound").await;
    }
    create_json(&pvcs, pvc(ns, "st-c-none", "100Gi", RWO, Some(""))).await;
    ctx.claim_event(ns, "st-c-none", "FailedBinding").await;
    tokio::time::sleep(SETTLE).await;
    let mut claims = BTreeMap::new();
    for c in [
        "st-c-fast",
        "st-c-size",
        "st-c-rwx",
        "st-c-gold",
        "st-c-none",
    ] {
        claims.insert(c, ctx.snap_pvc(ns, c).await);
    }
    let mut vols = BTreeMap::new();
    for n in names {
        vols.insert(n, ctx.snap_pv(n).await);
    }
    ctx.put("static/claims", json!(claims));
    ctx.put("static/volumes", json!(vols));
}

/// A PV pre-bound to a claim by `claimRef`, a claim pre-bound by `volumeName`, and one naming a
/// PV that does not exist. Class `pb` (no such StorageClass: binding needs none), so the claims
/// of `static`, which ask for class "", never see these volumes.
async fn prebound(ctx: &Ctx) {
    let ns = "prebound";
    let pvs = ctx.pvs();
    let dir = |n: &str| host_path(&ctx.host.join(n));
    let mut by_ref = pv("pb-ref", "1Gi", RWO, "pb", "Retain", dir("pb-ref"));
    by_ref["spec"]["claimRef"] = json!({"namespace": ns, "name": "pb-c-ref"});
    create_json(&pvs, by_ref).await;
    create_json(
        &pvs,
        pv("pb-vol", "2Gi", RWO, "pb", "Retain", dir("pb-vol")),
    )
    .await;
    // A better fit for pb-c-ref than its own (the claimRef wins).
    create_json(
        &pvs,
        pv("pb-decoy", "1Gi", RWO, "pb", "Retain", dir("pb-decoy")),
    )
    .await;
    for n in ["pb-ref", "pb-vol", "pb-decoy"] {
        ctx.pv_phase(n, "Available").await;
    }
    let before = ctx.snap_pv("pb-ref").await;
    let pvcs = ctx.pvcs(ns);
    let mut c_vol = pvc(ns, "pb-c-vol", "1Gi", RWO, Some("pb"));
    c_vol["spec"]["volumeName"] = json!("pb-vol");
    let mut c_missing = pvc(ns, "pb-c-missing", "1Gi", RWO, Some("pb"));
    c_missing["spec"]["volumeName"] = json!("pb-nothing");
    create_json(&pvcs, c_vol).await;
    ctx.pvc_phase(ns, "pb-c-vol", "Bound").await;
    create_json(&pvcs, pvc(ns, "pb-c-ref", "500Mi", RWO, Some("pb"))).await;
    ctx.pvc_phase(ns, "pb-c-ref", "Bound").await;
    create_json(&pvcs, c_missing).await;
    tokio::time::sleep(SETTLE).await;
    let mut r = BTreeMap::new();
    r.insert("pb-ref before its claim", before);
    for c in ["pb-c-ref", "pb-c-vol", "pb-c-missing"] {
        r.insert(c, ctx.snap_pvc(ns, c).await);
    }
    for n in ["pb-ref", "pb-vol", "pb-decoy"] {
        r.insert(n, ctx.snap_pv(n).await);
    }
    ctx.put("prebound", json!(r));
}

/// WaitForFirstConsumer: a class whose provisioner nobody serves and a class of static local
/// volumes; the claims wait until a pod uses them, the real kubelet mounts the local volume.
async fn wffc(ctx: &Ctx) {
    let ns = "wffc";
    let classes: Api<StorageClass> = Api::all(ctx.client.clone());
    for (name, provisioner) in [
        ("wf-ext", "example.com/nobody"),
        ("wf-local", "kubernetes.io/no-provisioner"),
    ] {
        create_json(
            &classes,
            json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                "metadata": {"name": name}, "provisioner": provisioner,
                "volumeBindingMode": "WaitForFirstConsumer"}),
        )
        .await;
    }
    let local_dir = ctx.host.join("wf-local");
    std::fs::create_dir_all(&local_dir).unwrap();
    let mut local = pv(
        "wf-local",
        "1Gi",
        RWO,
        "wf-local",
        "Retain",
        json!({"local": {"path": local_dir.to_str().unwrap()}}),
    );
    local["spec"]["nodeAffinity"] = json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": [NODE]}]}]}});
    create_json(&ctx.pvs(), local).await;
    ctx.pv_phase("wf-local", "Available").await;
    let pvcs = ctx.pvcs(ns);
    create_json(&pvcs, pvc(ns, "wf-c-ext", "1Gi", RWO, Some("wf-ext"))).await;
    create_json(&pvcs, pvc(ns, "wf-c-local", "1Gi", RWO, Some("wf-local"))).await;
    create_json(&pvcs, pvc(ns, "wf-c-stuck", "1Gi", RWO, Some("wf-ext"))).await;
    for c in ["wf-c-ext", "wf-c-local", "wf-c-stuck"] {
        ctx.claim_event(ns, c, "WaitForFirstConsumer").await;
    }
    tokio::time::sleep(SETTLE).await;
    let mut before = BTreeMap::new();
    for c in ["wf-c-ext", "wf-c-local", "wf-c-stuck"] {
        before.insert(c, ctx.snap_pvc(ns, c).await);
    }
    ctx.put("wffc/before-pod", json!(before));

    let pods = ctx.pods(ns);
    create_json(&pods, pod(ns, "wf-pod-ext", "wf-c-ext")).await;
    create_json(&pods, pod(ns, "wf-pod-local", "wf-c-local")).await;
    // A pod no node can take: its claim waits for the scheduler (kcm says so at its next
    // resync of the claim, within 15 s).
    let mut stuck = pod(ns, "wf-pod-stuck", "wf-c-stuck");
    stuck["spec"]["nodeSelector"] = json!({"example.com/no-such-node": "x"});
    create_json(&pods, stuck).await;
    ctx.pvc_phase(ns, "wf-c-local", "Bound").await;
    ctx.pod_running(ns, "wf-pod-local").await;
    ctx.claim_event(ns, "wf-c-ext", "ExternalProvisioning")
        .await;
    ctx.claim_event(ns, "wf-c-stuck", "WaitForPodScheduled")
        .await;
    tokio::time::sleep(SETTLE).await;
    let mut after = BTreeMap::new();
    for c in ["wf-c-ext", "wf-c-local", "wf-c-stuck"] {
        after.insert(c, ctx.snap_pvc(ns, c).await);
    }
    after.insert("wf-local", ctx.snap_pv("wf-local").await);
    ctx.put("wffc/after-pod", json!(after));
}

/// Claims deleted: Retain keeps the volume Released; Delete without a deleter (nfs, a csi
/// volume nobody provisioned) and Delete of an externally provisioned volume.
async fn reclaim(ctx: &Ctx) {
    let ns = "reclaim";
    let pvs = ctx.pvs();
    let csi = json!({"csi": {"driver": "nobody.example.com", "volumeHandle": "h-1"}});
    let mut external = pv(
        "rc-external",
        "1Gi",
        RWO,
        "rc-external",
        "Delete",
        csi.clone(),
    );
    external["metadata"]["annotations"] =
        json!({"pv.kubernetes.io/provisioned-by": "example.com/nobody"});
    let vols = [
        pv(
            "rc-retain",
            "1Gi",
            RWO,
            "rc-retain",
            "Retain",
            host_path(&ctx.host.join("rc-retain")),
        ),
        pv("rc-nfs", "1Gi", RWO, "rc-nfs", "Delete", nfs()),
        pv("rc-csi", "1Gi", RWO, "rc-csi", "Delete", csi),
        external,
    ];
    let names = ["rc-retain", "rc-nfs", "rc-csi", "rc-external"];
    for v in vols {
        create_json(&pvs, v).await;
    }
    for n in names {
        ctx.pv_phase(n, "Available").await;
    }
    let pvcs = ctx.pvcs(ns);
    for n in names {
        create_json(&pvcs, pvc(ns, &format!("{n}-c"), "1Gi", RWO, Some(n))).await;
    }
    for n in names {
        ctx.pvc_phase(ns, &format!("{n}-c"), "Bound").await;
        ctx.pv_phase(n, "Bound").await;
    }
    for n in names {
        pvcs.delete(&format!("{n}-c"), &DeleteParams::default())
            .await
            .unwrap();
    }
    for n in names {
        ctx.pvc_gone(ns, &format!("{n}-c")).await;
        let pvs = pvs.clone();
        ctx.eventually(&format!("PV {n} no longer Bound"), || {
            let pvs = pvs.clone();
            async move {
                let v = pvs.get_opt(n).await.ok()??;
                let phase = v.status?.phase?;
                (phase != "Bound").then_some(())
            }
        })
        .await;
    }
    tokio::time::sleep(SETTLE).await;
    let mut r = BTreeMap::new();
    for n in names {
        r.insert(n, ctx.snap_pv(n).await);
    }
    ctx.put("reclaim", json!(r));
}

/// A claim a running pod uses is deleted, then its volume: both stay (finalizers) until the
/// pod is gone; an unused claim, and one only an unschedulable pod names, go at once.
async fn protect(ctx: &Ctx) {
    let ns = "protect";
    let pvs = ctx.pvs();
    for n in ["pr-used", "pr-idle", "pr-pending"] {
        create_json(
            &pvs,
            pv(n, "1Gi", RWO, n, "Retain", host_path(&ctx.host.join(n))),
        )
        .await;
    }
    for n in ["pr-used", "pr-idle", "pr-pending"] {
        ctx.pv_phase(n, "Available").await;
    }
    let pvcs = ctx.pvcs(ns);
    for n in ["pr-used", "pr-idle", "pr-pending"] {
        create_json(&pvcs, pvc(ns, &format!("{n}-c"), "1Gi", RWO, Some(n))).await;
    }
    for n in ["pr-used", "pr-idle", "pr-pending"] {
        ctx.pvc_phase(ns, &format!("{n}-c"), "Bound").await;
    }
    let pods = ctx.pods(ns);
    create_json(&pods, pod(ns, "pr-pod", "pr-used-c")).await;
    // A pod no node takes does not hold its claim (the kubelet never starts it).
    let mut pending = pod(ns, "pr-pod-pending", "pr-pending-c");
    pending["spec"]["nodeSelector"] = json!({"example.com/no-such-node": "x"});
    create_json(&pods, pending).await;
    ctx.pod_running(ns, "pr-pod").await;

    let mut bound = BTreeMap::new();
    bound.insert("claim", ctx.snap_pvc(ns, "pr-used-c").await);
    bound.insert("pv", ctx.snap_pv("pr-used").await);
    ctx.put("protect/bound", json!(bound));

    pvcs.delete("pr-used-c", &DeleteParams::default())
        .await
        .unwrap();
    for c in ["pr-idle-c", "pr-pending-c"] {
        pvcs.delete(c, &DeleteParams::default()).await.unwrap();
    }
    ctx.pvc_gone(ns, "pr-idle-c").await;
    ctx.pvc_gone(ns, "pr-pending-c").await;
    pvs.delete("pr-used", &DeleteParams::default())
        .await
        .unwrap();
    tokio::time::sleep(SETTLE).await;
    let mut during = BTreeMap::new();
    during.insert("claim", ctx.snap_pvc(ns, "pr-used-c").await);
    during.insert("pv", ctx.snap_pv("pr-used").await);
    during.insert("pr-idle", ctx.snap_pv("pr-idle").await);
    during.insert("pr-pending", ctx.snap_pv("pr-pending").await);
    ctx.put("protect/while-pod", json!(during));

    pods.delete("pr-pod", &DeleteParams::default())
        .await
        .unwrap();
    ctx.pvc_gone(ns, "pr-used-c").await;
    ctx.pv_gone("pr-used").await;
}

/// An in-tree kubernetes.io/aws-ebs class (migrated to ebs.csi.aws.com) and a volume that
/// class's in-tree provisioner made.
async fn migrate(ctx: &Ctx) {
    let ns = "migrate";
    let classes: Api<StorageClass> = Api::all(ctx.client.clone());
    create_json(
        &classes,
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": "mg-ebs"}, "provisioner": "kubernetes.io/aws-ebs",
            "parameters": {"type": "gp2"}}),
    )
    .await;
    let mut made = pv(
        "mg-pv",
        "1Gi",
        RWO,
        "mg-ebs",
        "Retain",
        json!({"awsElasticBlockStore": {"volumeID": "aws://us-east-1a/vol-0123456789abcdef0", "fsType": "ext4"}}),
    );
    made["metadata"]["annotations"] =
        json!({"pv.kubernetes.io/provisioned-by": "kubernetes.io/aws-ebs"});
    made["spec"]["claimRef"] = json!({"namespace": ns, "name": "mg-c-static"});
    create_json(&ctx.pvs(), made).await;
    ctx.pv_phase("mg-pv", "Available").await;
    let pvcs = ctx.pvcs(ns);
    create_json(&pvcs, pvc(ns, "mg-c-new", "1Gi", RWO, Some("mg-ebs"))).await;
    create_json(&pvcs, pvc(ns, "mg-c-static", "1Gi", RWO, Some("mg-ebs"))).await;
    ctx.claim_event(ns, "mg-c-new", "ExternalProvisioning")
        .await;
    ctx.pvc_phase(ns, "mg-c-static", "Bound").await;
    tokio::time::sleep(SETTLE).await;
    let mut r = BTreeMap::new();
    for c in ["mg-c-new", "mg-c-static"] {
        r.insert(c, ctx.snap_pvc(ns, c).await);
    }
    r.insert("mg-pv", ctx.snap_pv("mg-pv").await);
    ctx.put("migrate", json!(r));
}

/// A claim created without a class while there is no default class: FailedBinding; once a
/// class is marked default (and the claim synced again) it gets that class and waits for the
/// class's provisioner. A claim asking for class "" keeps it.
async fn default_class(ctx: &Ctx) {
    let ns = "default-class";
    let pvcs = ctx.pvcs(ns);
    // 100Gi: more than any volume of `static` (class ""), which these claims could take.
    create_json(&pvcs, pvc(ns, "df-c-later", "100Gi", RWO, None)).await;
    create_json(&pvcs, pvc(ns, "df-c-none", "100Gi", RWO, Some(""))).await;
    ctx.claim_event(ns, "df-c-later", "FailedBinding").await;
    let mut before = BTreeMap::new();
    before.insert("df-c-later", ctx.snap_pvc(ns, "df-c-later").await);
    ctx.put("default-class/before", json!(before));
    let classes: Api<StorageClass> = Api::all(ctx.client.clone());
    create_json(
        &classes,
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": "df-default",
                "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
            "provisioner": "example.com/default"}),
    )
    .await;
    // The class arrives with the claim's next sync: a change of the claim (or the resync).
    for c in ["df-c-later", "df-c-none"] {
        pvcs.patch(
            c,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"poke": "1"}}})),
        )
        .await
        .unwrap();
    }
    ctx.claim_event(ns, "df-c-later", "ExternalProvisioning")
        .await;
    tokio::time::sleep(SETTLE).await;
    let mut after = BTreeMap::new();
    for c in ["df-c-later", "df-c-none"] {
        let mut snap = ctx.snap_pvc(ns, c).await;
        let class = pvcs.get(c).await.unwrap().spec.unwrap().storage_class_name;
        snap["storageClassName"] = json!(class);
        after.insert(c, snap);
    }
    ctx.put("default-class/after", json!(after));
}

/// A bound claim whose volume goes (its pv-protection finalizer taken off by hand, then
/// deleted): the claim is Lost, with a Warning Event.
async fn lost(ctx: &Ctx) {
    let ns = "lost";
    let pvs = ctx.pvs();
    create_json(
        &pvs,
        pv(
            "ls-pv",
            "1Gi",
            RWO,
            "ls",
            "Retain",
            host_path(&ctx.host.join("ls-pv")),
        ),
    )
    .await;
    ctx.pv_phase("ls-pv", "Available").await;
    create_json(&ctx.pvcs(ns), pvc(ns, "ls-c", "1Gi", RWO, Some("ls"))).await;
    ctx.pvc_phase(ns, "ls-c", "Bound").await;
    ctx.pv_phase("ls-pv", "Bound").await;
    pvs.delete("ls-pv", &DeleteParams::default()).await.unwrap();
    pvs.patch(
        "ls-pv",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    ctx.pv_gone("ls-pv").await;
    ctx.pvc_phase(ns, "ls-c", "Lost").await;
    tokio::time::sleep(SETTLE).await;
    ctx.put("lost", ctx.snap_pvc(ns, "ls-c").await);
}

/// Storage safety (no claim bound to a volume it must not get, no capacity it does not have),
/// four cases at once:
/// - `sf-small`, pre-bound by `claimRef` to `sf-c-small` but smaller than its request: not
///   bound (kcm's findMatchingVolume checks the size before the pre-binding); the claim (class
///   "", 50Gi: more than any volume of `static`) stays Pending with FailedBinding;
/// - `sf-dying`, being deleted (held by a finalizer of ours), named by `sf-c-dying`'s
///   `volumeName`: not bound, VolumeMismatch;
/// - `sf-stale`, created by a user with a `claimRef` (uid included) to `sf-c-owner`, which is
///   bound to `sf-chosen`: the uid goes, the ref stays, Available;
/// - `sf-c-grow`, Bound to `sf-grow` (2Gi), whose PV then grows to 4Gi as a resizer does while
///   the node part is pending: the claim's `status.capacity` stays 2Gi through its next sync.
async fn safety(ctx: &Ctx) {
    let ns = "safety";
    let pvs = ctx.pvs();
    let pvcs = ctx.pvcs(ns);
    let dir = |n: &str| host_path(&ctx.host.join(n));

    let mut small = pv("sf-small", "20Gi", RWO, "", "Retain", dir("sf-small"));
    small["spec"]["claimRef"] = json!({"namespace": ns, "name": "sf-c-small"});
    create_json(&pvs, small).await;
    let mut dying = pv("sf-dying", "1Gi", RWO, "sf", "Retain", dir("sf-dying"));
    dying["metadata"]["finalizers"] = json!(["example.com/hold"]);
    create_json(&pvs, dying).await;
    create_json(
        &pvs,
        pv("sf-chosen", "1Gi", RWO, "sf", "Retain", dir("sf-chosen")),
    )
    .await;
    create_json(
        &pvs,
        pv("sf-grow", "2Gi", RWO, "sf-grow", "Retain", dir("sf-grow")),
    )
    .await;
    for n in ["sf-small", "sf-dying", "sf-chosen", "sf-grow"] {
        ctx.pv_phase(n, "Available").await;
    }
    // Deleted once pv-protection has added its finalizer (both sides do), which it then takes
    // off again (not bound); ours holds the volume in Terminating.
    ctx.eventually("sf-dying protected", || {
        let pvs = pvs.clone();
        async move {
            let v = pvs.get_opt("sf-dying").await.ok()??;
            v.metadata
                .finalizers?
                .iter()
                .any(|f| f == "kubernetes.io/pv-protection")
                .then_some(())
        }
    })
    .await;
    pvs.delete("sf-dying", &DeleteParams::default())
        .await
        .unwrap();
    ctx.eventually("sf-dying held only by its own finalizer", || {
        let pvs = pvs.clone();
        async move {
            let v = pvs.get_opt("sf-dying").await.ok()??;
            (v.metadata.deletion_timestamp.is_some()
                && v.metadata.finalizers? == ["example.com/hold"])
            .then_some(())
        }
    })
    .await;

    create_json(&pvcs, pvc(ns, "sf-c-small", "50Gi", RWO, Some(""))).await;
    let mut c_dying = pvc(ns, "sf-c-dying", "1Gi", RWO, Some("sf"));
    c_dying["spec"]["volumeName"] = json!("sf-dying");
    create_json(&pvcs, c_dying).await;
    let mut c_owner = pvc(ns, "sf-c-owner", "1Gi", RWO, Some("sf"));
    c_owner["spec"]["volumeName"] = json!("sf-chosen");
    create_json(&pvcs, c_owner).await;
    create_json(&pvcs, pvc(ns, "sf-c-grow", "1Gi", RWO, Some("sf-grow"))).await;
    ctx.pvc_phase(ns, "sf-c-owner", "Bound").await;
    ctx.pvc_phase(ns, "sf-c-grow", "Bound").await;
    ctx.claim_event(ns, "sf-c-small", "FailedBinding").await;
    ctx.claim_event(ns, "sf-c-dying", "VolumeMismatch").await;

    let owner = pvcs.get("sf-c-owner").await.unwrap();
    let mut stale = pv("sf-stale", "1Gi", RWO, "sf", "Retain", dir("sf-stale"));
    stale["spec"]["claimRef"] = json!({"kind": "PersistentVolumeClaim", "apiVersion": "v1",
        "namespace": ns, "name": "sf-c-owner", "uid": owner.metadata.uid});
    create_json(&pvs, stale).await;
    ctx.eventually("sf-stale's ref without uid", || {
        let pvs = pvs.clone();
        async move {
            let v = pvs.get_opt("sf-stale").await.ok()??;
            let uid = v.spec?.claim_ref?.uid;
            (uid.is_none() && v.status?.phase.as_deref() == Some("Available")).then_some(())
        }
    })
    .await;

    // The expansion: the PV grows, the claim says the node part is pending, then the claim
    // changes (a label) so that both controllers sync it now rather than at their resync.
    let pp = PatchParams::default();
    pvs.patch(
        "sf-grow",
        &pp,
        &Patch::Merge(json!({"spec": {"capacity": {"storage": "4Gi"}}})),
    )
    .await
    .unwrap();
    pvcs.patch_status(
        "sf-c-grow",
        &pp,
        &Patch::Merge(json!({"status": {"conditions": [
            {"type": "FileSystemResizePending", "status": "True"}]}})),
    )
    .await
    .unwrap();
    pvcs.patch(
        "sf-c-grow",
        &pp,
        &Patch::Merge(json!({"metadata": {"labels": {"poke": "1"}}})),
    )
    .await
    .unwrap();
    tokio::time::sleep(SETTLE).await;

    let mut r = BTreeMap::new();
    for c in ["sf-c-small", "sf-c-dying", "sf-c-owner", "sf-c-grow"] {
        r.insert(c, ctx.snap_pvc(ns, c).await);
    }
    for n in ["sf-small", "sf-dying", "sf-chosen", "sf-stale", "sf-grow"] {
        r.insert(n, ctx.snap_pv(n).await);
    }
    ctx.put("safety", json!(r));
}
