//! Our ephemeral volume controller against kube-controller-manager's, on real Kubernetes
//! v1.26: the same scenarios run on two control planes one after the other, (A) with kcm's own
//! `ephemeral-volume` controller and (B) with kcm running without it and our
//! `csi-ephemeral-volume-controller` binary running instead (a host process with the admin
//! kubeconfig). No scheduler and no node: the controller works on pods whatever their node.
//!
//! Scenarios, in namespace `ev`:
//! - `web`: a pod with an emptyDir and two generic ephemeral volumes, one whose template has
//!   labels, annotations and a full spec, one with a bare template;
//! - `clash`: a claim `clash-scratch` made by someone else before the pod `clash` whose
//!   volume `scratch` needs that name: not adopted, a Warning Event on the pod; once that
//!   claim is deleted the pod gets its own.
//!
//! What the controller side wrote (each claim's name, labels, annotations, ownerReferences
//! with the owner's UID replaced by `<pod uid>` when it is the pod's, finalizers and spec as
//! stored; the Events on the pods with type, reason, message and source) is recorded,
//! printed, and the two runs must be equal, key by key.
// Test code (helpers included): a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_harness::support::{assert_same_as_kcm, eventually_with_logs, spawn_component};
use k8s_harness::{Cluster, ClusterOptions};
use k8s_openapi::api::core::v1::{Event, Namespace, PersistentVolumeClaim, Pod, ServiceAccount};
use kube::{Api, Client};
use serde_json::{Value, json};
use test_support::objects::create_json;

const NS: &str = "ev";
/// How long one step may take before the test fails with the logs' ends.
const PATIENCE: Duration = Duration::from_secs(60);
/// How long a state that should last is watched before it is recorded.
const SETTLE: Duration = Duration::from_secs(3);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Side {
    Kcm,
    Ours,
}

/// What a claim looks like, owner UIDs made comparable across clusters.
fn claim_record(claim: &PersistentVolumeClaim, pods: &BTreeMap<String, String>) -> Value {
    let mut owners = serde_json::to_value(&claim.metadata.owner_references).unwrap();
    if let Some(list) = owners.as_array_mut() {
        for o in list {
            let uid = o["uid"].as_str().unwrap_or_default().to_string();
            if let Some(pod) = pods.iter().find(|(_, u)| **u == uid).map(|(p, _)| p) {
                o["uid"] = json!(format!("<uid of pod {pod}>"));
            }
        }
    }
    json!({
        "labels": claim.metadata.labels,
        "annotations": claim.metadata.annotations,
        "ownerReferences": owners,
        "finalizers": claim.metadata.finalizers,
        "spec": claim.spec,
        "generateName": claim.metadata.generate_name,
    })
}

fn pod_json(name: &str, volumes: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.9"}],
            "volumes": volumes
        }
    })
}

/// One control plane with `side` running the ephemeral volume controller; what it wrote.
/// `None`: the cluster could not start here (skipped).
async fn run(side: Side) -> Option<BTreeMap<String, Value>> {
    let controllers = match side {
        Side::Kcm => "*",
        Side::Ours => "*,-ephemeral-volume",
    };
    let cluster = Cluster::start_or_skip(
        ClusterOptions::control_plane()
            .controller_manager(controllers)
            .controller_manager_arg("--v=4"),
    )
    .await?;
    let work = tempfile::tempdir().unwrap();
    let mut logs = vec![cluster.log_path("kube-controller-manager")];
    let _ours = (side == Side::Ours).then(|| {
        let log = work.path().join("ephemeral-volume.log");
        logs.push(log.clone());
        spawn_component(
            Path::new(env!("CARGO_BIN_EXE_csi-ephemeral-volume-controller")),
            &[
                format!("--kubeconfig={}", cluster.admin_kubeconfig().display()),
                "--leader-elect=false".into(),
                "--v=4".into(),
            ],
            &log,
        )
    });
    let client = cluster.admin_client().await.unwrap();
    let record = scenarios(&client, &logs).await;
    if side == Side::Ours {
        // The claims are ours, not a kcm that still ran its controller.
        let log = std::fs::read_to_string(&logs[1]).unwrap();
        for claim in ["ev/web-scratch", "ev/web-bare", "ev/clash-scratch"] {
            assert!(
                log.lines()
                    .any(|l| l.contains("created the claim") && l.contains(claim)),
                "our controller did not log creating {claim}:\n{log}"
            );
        }
    }
    println!(
        "{side:?}:\n{}",
        serde_json::to_string_pretty(&record).unwrap()
    );
    Some(record)
}

async fn scenarios(client: &Client, logs: &[PathBuf]) -> BTreeMap<String, Value> {
    let mut record = BTreeMap::new();
    create_json(
        &Api::<Namespace>::all(client.clone()),
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}),
    )
    .await;
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), NS);
    eventually_with_logs("ServiceAccount ev/default", PATIENCE, logs, || {
        let sas = sas.clone();
        async move { sas.get_opt("default").await.ok()?.map(|_| ()) }
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NS);

    // `clash`: someone else's claim of the name first.
    create_json(
        &pvcs,
        json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "clash-scratch", "namespace": NS, "labels": {"made-by": "someone-else"}},
            "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}}
        }),
    )
    .await;
    let template = json!({
        "metadata": {
            "labels": {"app": "web", "tier": "cache"},
            "annotations": {"note": "scratch space"}
        },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "fast",
            "volumeMode": "Block",
            "resources": {"requests": {"storage": "2Gi"}, "limits": {"storage": "4Gi"}},
            "selector": {"matchLabels": {"disk": "ssd"}}
        }
    });
    let bare = json!({"spec": {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "1Gi"}}
    }});
    let web = create_json(
        &pods,
        pod_json(
            "web",
            json!([
                {"name": "cache", "emptyDir": {}},
                {"name": "scratch", "ephemeral": {"volumeClaimTemplate": template}},
                {"name": "bare", "ephemeral": {"volumeClaimTemplate": bare}}
            ]),
        ),
    )
    .await;
    let clash = create_json(
        &pods,
        pod_json(
            "clash",
            json!([{"name": "scratch", "ephemeral": {"volumeClaimTemplate": bare}}]),
        ),
    )
    .await;
    let uids: BTreeMap<String, String> = [&web, &clash]
        .iter()
        .map(|p| {
            (
                p.metadata.name.clone().unwrap(),
                p.metadata.uid.clone().unwrap(),
            )
        })
        .collect();

    for name in ["web-scratch", "web-bare"] {
        let claim = eventually_with_logs(&format!("claim {name}"), PATIENCE, logs, || {
            let pvcs = pvcs.clone();
            async move { pvcs.get_opt(name).await.ok()? }
        })
        .await;
        record.insert(format!("claim/{name}"), claim_record(&claim, &uids));
    }
    let events: Api<Event> = Api::namespaced(client.clone(), NS);
    eventually_with_logs("a FailedBinding Event on pod clash", PATIENCE, logs, || {
        let events = events.clone();
        async move {
            let list = events.list(&Default::default()).await.ok()?;
            list.items
                .into_iter()
                .find(|e| {
                    e.involved_object.name.as_deref() == Some("clash")
                        && e.reason.as_deref() == Some("FailedBinding")
                })
                .map(|_| ())
        }
    })
    .await;
    tokio::time::sleep(SETTLE).await;
    for name in ["web-scratch", "web-bare", "clash-scratch"] {
        let claim = pvcs.get(name).await.unwrap();
        record.insert(format!("settled/{name}"), claim_record(&claim, &uids));
    }
    let claims: BTreeSet<String> = pvcs
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
    record.insert("claims".into(), json!(claims));
    let mut lines = BTreeSet::new();
    for e in events.list(&Default::default()).await.unwrap().items {
        let o = &e.involved_object;
        if o.kind.as_deref() != Some("Pod") {
            continue;
        }
        lines.insert(format!(
            "{} {} {} {} [{}]: {}",
            o.kind.clone().unwrap_or_default(),
            o.name.clone().unwrap_or_default(),
            e.type_.unwrap_or_default(),
            e.reason.unwrap_or_default(),
            e.source.and_then(|s| s.component).unwrap_or_default(),
            e.message.unwrap_or_default(),
        ));
    }
    record.insert("events".into(), json!(lines));

    // Once someone else's claim is gone, the pod gets its own (no pod runs, so
    // pvc-protection lets it go at once).
    let foreign_uid = pvcs.get("clash-scratch").await.unwrap().metadata.uid;
    pvcs.delete("clash-scratch", &Default::default())
        .await
        .unwrap();
    let own = eventually_with_logs("pod clash's own claim", PATIENCE, logs, || {
        let (pvcs, foreign_uid) = (pvcs.clone(), foreign_uid.clone());
        async move {
            pvcs.get_opt("clash-scratch")
                .await
                .ok()?
                .filter(|c| c.metadata.uid != foreign_uid)
        }
    })
    .await;
    record.insert("replaced/clash-scratch".into(), claim_record(&own, &uids));
    record
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_ephemeral_volume_controller_writes_what_kcms_writes() {
    let t0 = Instant::now();
    let Some(kcm) = run(Side::Kcm).await else {
        return;
    };
    let Some(ours) = run(Side::Ours).await else {
        return;
    };
    println!("both runs took {:?}", t0.elapsed());
    assert_same_as_kcm(&kcm, &ours, |_| false);
    // What kcm did, so the comparison compared something.
    let web = &kcm["settled/web-scratch"];
    assert_eq!(web["ownerReferences"][0]["kind"], json!("Pod"));
    assert_eq!(web["ownerReferences"][0]["uid"], json!("<uid of pod web>"));
    assert_eq!(web["ownerReferences"][0]["controller"], json!(true));
    assert_eq!(web["labels"]["tier"], json!("cache"));
    assert_eq!(web["spec"]["volumeMode"], json!("Block"));
    assert_eq!(kcm["settled/clash-scratch"]["ownerReferences"], Value::Null);
    assert_eq!(
        kcm["replaced/clash-scratch"]["ownerReferences"][0]["uid"],
        json!("<uid of pod clash>")
    );
    assert!(
        kcm["events"].as_array().unwrap().iter().any(|e| e
            .as_str()
            .unwrap()
            .contains("FailedBinding")
            && e.as_str().unwrap().contains("clash")),
        "{}",
        kcm["events"]
    );
}
