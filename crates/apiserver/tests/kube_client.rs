//! kube-rs against the embedded server: every verb and the semantics controllers rely on.
// Test code (helpers included): a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{api_err, raw, start, start_with};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, Pod, Secret};
use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use serde_json::json;

fn va(name: &str, node: &str) -> VolumeAttachment {
    serde_json::from_value(json!({
        "apiVersion": "storage.k8s.io/v1",
        "kind": "VolumeAttachment",
        "metadata": {"name": name, "labels": {"node": node}},
        "spec": {"attacher": "ebs.csi.aws.com", "nodeName": node, "source": {"persistentVolumeName": format!("pv-{name}")}}
    }))
    .unwrap()
}

fn pv(name: &str) -> PersistentVolume {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "csi": {"driver": "ebs.csi.aws.com", "volumeHandle": format!("vol-{name}")}}
    }))
    .unwrap()
}

fn pod(name: &str, node: Option<&str>) -> Pod {
    let mut p = json!({
        "metadata": {"name": name, "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "c", "image": "busybox:1.36"}]}
    });
    if let Some(n) = node {
        p["spec"]["nodeName"] = json!(n);
    }
    serde_json::from_value(p).unwrap()
}

#[tokio::test]
async fn create_fills_server_fields_and_defaults() {
    let server = start().await;
    let vas: Api<VolumeAttachment> = Api::all(server.client());
    let created = vas
        .create(&PostParams::default(), &va("va-1", "node-1"))
        .await
        .unwrap();
    let m = &created.metadata;
    assert!(m.uid.as_deref().is_some_and(|u| u.len() == 36));
    assert!(m.creation_timestamp.is_some());
    let rv: u64 = m.resource_version.as_deref().unwrap().parse().unwrap();
    assert!(rv > 0);
    assert_eq!(
        vas.get("va-1").await.unwrap().metadata.uid,
        created.metadata.uid
    );

    // generateName: the server picks the name.
    let mut gen_va = va("", "node-1");
    gen_va.metadata.name = None;
    gen_va.metadata.generate_name = Some("csi-".into());
    let g = vas.create(&PostParams::default(), &gen_va).await.unwrap();
    let name = g.metadata.name.unwrap();
    assert!(name.starts_with("csi-") && name.len() == 9, "{name}");

    // Defaults clients rely on: CSIDriver.attachRequired is true unless said otherwise.
    let drivers: Api<CSIDriver> = Api::all(server.client());
    let d: CSIDriver =
        serde_json::from_value(json!({"metadata": {"name": "ebs.csi.aws.com"}, "spec": {}}))
            .unwrap();
    let d = drivers.create(&PostParams::default(), &d).await.unwrap();
    assert_eq!(d.spec.attach_required, Some(true));
    let pvs: Api<PersistentVolume> = Api::all(server.client());
    let p = pvs
        .create(&PostParams::default(), &pv("pv-a"))
        .await
        .unwrap();
    assert_eq!(
        p.spec.unwrap().persistent_volume_reclaim_policy.as_deref(),
        Some("Retain")
    );
    assert_eq!(p.status.unwrap().phase.as_deref(), Some("Pending"));

    // Dry run answers without storing.
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    vas.create(&dry, &va("va-dry", "node-1")).await.unwrap();
    assert_eq!(api_err(vas.get("va-dry").await).code, 404);
}

#[tokio::test]
async fn errors_have_the_real_status_shape() {
    let server = start().await;
    let vas: Api<VolumeAttachment> = Api::all(server.client());
    vas.create(&PostParams::default(), &va("va-1", "node-1"))
        .await
        .unwrap();

    let dup = api_err(
        vas.create(&PostParams::default(), &va("va-1", "node-1"))
            .await,
    );
    assert_eq!((dup.code, dup.reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(
        dup.message,
        "volumeattachments.storage.k8s.io \"va-1\" already exists"
    );

    let missing = api_err(vas.get("nope").await);
    assert_eq!((missing.code, missing.reason.as_str()), (404, "NotFound"));
    let d = missing.details.unwrap();
    assert_eq!(
        (d.name.as_str(), d.group.as_str(), d.kind.as_str()),
        ("nope", "storage.k8s.io", "volumeattachments")
    );

    // Invalid: no attacher, no node, two sources; every problem is a cause with its field.
    let bad: VolumeAttachment = serde_json::from_value(json!({
        "metadata": {"name": "Bad_Name"},
        "spec": {"attacher": "", "nodeName": "", "source": {"persistentVolumeName": "p", "inlineVolumeSpec": {"csi": {"driver": "d", "volumeHandle": "h"}}}}
    }))
    .unwrap();
    let inv = api_err(vas.create(&PostParams::default(), &bad).await);
    assert_eq!((inv.code, inv.reason.as_str()), (422, "Invalid"));
    let causes = inv.details.unwrap().causes;
    let fields: Vec<&str> = causes.iter().map(|c| c.field.as_str()).collect();
    assert_eq!(
        fields,
        vec![
            "metadata.name",
            "spec.attacher",
            "spec.nodeName",
            "spec.source"
        ]
    );
    assert!(
        inv.message
            .starts_with("VolumeAttachment.storage.k8s.io \"Bad_Name\" is invalid: ["),
        "{}",
        inv.message
    );

    // Unknown resources and bad methods.
    let (code, body) = raw(
        &server,
        "GET",
        "/apis/apps/v1/namespaces/default/replicasets",
        None,
        None,
    )
    .await;
    assert_eq!((code, body["reason"].as_str()), (404, Some("NotFound")));
    let (code, body) = raw(
        &server,
        "PUT",
        "/api/v1/persistentvolumes",
        Some("application/json"),
        Some(json!({})),
    )
    .await;
    assert_eq!(
        (code, body["reason"].as_str()),
        (405, Some("MethodNotAllowed"))
    );
    let (code, body) = raw(
        &server,
        "POST",
        "/api/v1/persistentvolumes",
        Some("application/json"),
        Some(json!("x")),
    )
    .await;
    assert_eq!((code, body["reason"].as_str()), (400, Some("BadRequest")));
    // A namespaced object in a namespace that does not exist.
    let pods: Api<Pod> = Api::namespaced(server.client(), "missing");
    let e = api_err(pods.create(&PostParams::default(), &pod("p", None)).await);
    assert_eq!(
        (e.code, e.message.as_str()),
        (404, "namespaces \"missing\" not found")
    );
}

#[tokio::test]
async fn update_uses_optimistic_concurrency() {
    let server = start().await;
    let pvs: Api<PersistentVolume> = Api::all(server.client());
    let v1 = pvs
        .create(&PostParams::default(), &pv("pv-1"))
        .await
        .unwrap();
    let mut a = v1.clone();
    a.metadata.labels = Some([("a".to_string(), "1".to_string())].into());
    let v2 = pvs
        .replace("pv-1", &PostParams::default(), &a)
        .await
        .unwrap();
    assert_ne!(v2.metadata.resource_version, v1.metadata.resource_version);
    assert_eq!(
        v2.metadata.generation, v1.metadata.generation,
        "labels are not spec"
    );

    // Writing with the stale version is a 409 Conflict.
    let mut b = v1.clone();
    b.metadata.labels = Some([("b".to_string(), "1".to_string())].into());
    let e = api_err(pvs.replace("pv-1", &PostParams::default(), &b).await);
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    assert!(
        e.message.contains("the object has been modified"),
        "{}",
        e.message
    );

    // A no-op update does not bump the version.
    let same = pvs
        .replace("pv-1", &PostParams::default(), &v2)
        .await
        .unwrap();
    assert_eq!(same.metadata.resource_version, v2.metadata.resource_version);

    // The source of a PV is immutable.
    let mut moved = same.clone();
    moved
        .spec
        .as_mut()
        .unwrap()
        .csi
        .as_mut()
        .unwrap()
        .volume_handle = "vol-other".into();
    let e = api_err(pvs.replace("pv-1", &PostParams::default(), &moved).await);
    assert_eq!(e.code, 422);
    assert_eq!(
        e.details.unwrap().causes[0].field,
        "spec.persistentvolumesource"
    );
}

#[tokio::test]
async fn status_subresource_rules() {
    let server = start().await;
    let vas: Api<VolumeAttachment> = Api::all(server.client());
    // Status in a create is dropped: controllers own it (kube-apiserver answers
    // `attached: false`, as for any VolumeAttachment without a status).
    let mut with_status = va("va-1", "node-1");
    with_status.status = Some(serde_json::from_value(json!({"attached": true})).unwrap());
    let created = vas
        .create(&PostParams::default(), &with_status)
        .await
        .unwrap();
    assert!(!created.status.as_ref().unwrap().attached);

    // A status patch touches only status...
    let st = vas
        .patch_status(
            "va-1",
            &PatchParams::default(),
            &Patch::Merge(json!({
                "metadata": {"labels": {"sneaky": "yes"}},
                "spec": {"nodeName": "other"},
                "status": {"attached": true, "attachmentMetadata": {"devicePath": "/dev/xvdba"}}
            })),
        )
        .await
        .unwrap();
    assert!(st.status.as_ref().unwrap().attached);
    assert_eq!(st.spec.node_name, "node-1");
    assert!(
        !st.metadata
            .labels
            .unwrap_or_default()
            .contains_key("sneaky")
    );

    // ...and a main-resource write leaves status alone.
    let main = vas
        .patch(
            "va-1",
            &PatchParams::default(),
            &Patch::Merge(json!({
                "metadata": {"finalizers": ["external-attacher/ebs-csi-aws-com"]},
                "status": {"attached": false}
            })),
        )
        .await
        .unwrap();
    assert!(main.status.as_ref().unwrap().attached);
    assert_eq!(
        main.metadata.finalizers.unwrap(),
        vec!["external-attacher/ebs-csi-aws-com"]
    );

    // replace_status with a stale version conflicts like any update.
    let mut stale = created.clone();
    stale.status = Some(serde_json::from_value(json!({"attached": false})).unwrap());
    let e = api_err(
        vas.replace_status("va-1", &PostParams::default(), &stale)
            .await,
    );
    assert_eq!(e.code, 409);

    // The spec is immutable.
    let e = api_err(
        vas.patch(
            "va-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"nodeName": "n2"}})),
        )
        .await,
    );
    assert_eq!(
        (e.code, e.details.unwrap().causes[0].field.as_str()),
        (422, "spec")
    );
}

#[tokio::test]
async fn patches_merge_json_and_declined_types() {
    let server = start().await;
    let drivers: Api<CSIDriver> = Api::all(server.client());
    let d: CSIDriver = serde_json::from_value(
        json!({"metadata": {"name": "ebs.csi.aws.com"}, "spec": {"attachRequired": true}}),
    )
    .unwrap();
    let d = drivers.create(&PostParams::default(), &d).await.unwrap();
    let rv = d.metadata.resource_version.clone().unwrap();

    // JSON patch with a `test` op on the resourceVersion: the race-safe write.
    let ok = drivers
        .patch(
            "ebs.csi.aws.com",
            &PatchParams::default(),
            &Patch::Json::<()>(
                serde_json::from_value(json!([
                    {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
                    {"op": "add", "path": "/metadata/labels", "value": {"x": "y"}}
                ]))
                .unwrap(),
            ),
        )
        .await
        .unwrap();
    assert_eq!(ok.metadata.labels.unwrap()["x"], "y");
    // The same patch again fails its test (the version moved on): 422.
    let e = api_err(
        drivers
            .patch(
                "ebs.csi.aws.com",
                &PatchParams::default(),
                &Patch::Json::<()>(
                    serde_json::from_value(json!([
                        {"op": "test", "path": "/metadata/resourceVersion", "value": rv}
                    ]))
                    .unwrap(),
                ),
            )
            .await,
    );
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));

    // A merge patch carrying a stale resourceVersion is a conflict.
    let e = api_err(
        drivers
            .patch(
                "ebs.csi.aws.com",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"resourceVersion": rv, "labels": {"z": "1"}}})),
            )
            .await,
    );
    assert_eq!(e.code, 409);

    // attachRequired is immutable; kube-apiserver names the field `spec.attachedRequired` (sic).
    let e = api_err(
        drivers
            .patch(
                "ebs.csi.aws.com",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"attachRequired": false}})),
            )
            .await,
    );
    assert_eq!(e.code, 422);
    assert_eq!(e.details.unwrap().causes[0].field, "spec.attachedRequired");

    // Strategic merge: maps merge, finalizers merge as a set.
    drivers
        .patch(
            "ebs.csi.aws.com",
            &PatchParams::default(),
            &Patch::Strategic(json!({"metadata": {"labels": {"a": "b"}, "finalizers": ["one/x"]}})),
        )
        .await
        .unwrap();
    let sm = drivers
        .patch(
            "ebs.csi.aws.com",
            &PatchParams::default(),
            &Patch::Strategic(json!({"metadata": {"finalizers": ["two/y", "one/x"]}})),
        )
        .await
        .unwrap();
    assert_eq!(sm.metadata.finalizers.unwrap(), vec!["one/x", "two/y"]);
    assert_eq!(sm.metadata.labels.unwrap()["a"], "b");
    // Unknown directives are a 400.
    let e = api_err(
        drivers
            .patch(
                "ebs.csi.aws.com",
                &PatchParams::default(),
                &Patch::Strategic(json!({"$patch": "explode"})),
            )
            .await,
    );
    assert_eq!(e.code, 400);
    // Patching what does not exist is a 404.
    let e = api_err(
        drivers
            .patch("nope", &PatchParams::default(), &Patch::Merge(json!({})))
            .await,
    );
    assert_eq!(e.code, 404);
}

#[tokio::test]
async fn server_side_apply_owns_fields() {
    let server = start().await;
    let leases: Api<Lease> = Api::namespaced(server.client(), "default");
    let applied = |holder: &str| json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "lock"}, "spec": {"holderIdentity": holder, "leaseDurationSeconds": 10}});
    // Apply creates.
    let a = leases
        .patch(
            "lock",
            &PatchParams::apply("a"),
            &Patch::Apply(applied("a")),
        )
        .await
        .unwrap();
    assert_eq!(
        a.spec.as_ref().unwrap().holder_identity.as_deref(),
        Some("a")
    );
    let mf = a.metadata.managed_fields.unwrap();
    assert_eq!(
        (mf[0].manager.as_deref(), mf[0].operation.as_deref()),
        (Some("a"), Some("Apply"))
    );
    // Another manager changing an owned field conflicts...
    let e = api_err(
        leases
            .patch(
                "lock",
                &PatchParams::apply("b"),
                &Patch::Apply(applied("b")),
            )
            .await,
    );
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    assert!(
        e.message
            .contains("conflict with \"a\": .spec.holderIdentity"),
        "{}",
        e.message
    );
    // ...unless forced.
    let b = leases
        .patch(
            "lock",
            &PatchParams::apply("b").force(),
            &Patch::Apply(applied("b")),
        )
        .await
        .unwrap();
    assert_eq!(b.spec.unwrap().holder_identity.as_deref(), Some("b"));
    // Apply without a field manager is invalid.
    let (code, _) = raw(
        &server,
        "PATCH",
        "/apis/coordination.k8s.io/v1/namespaces/default/leases/lock",
        Some("application/apply-patch+yaml"),
        Some(applied("c")),
    )
    .await;
    assert_eq!(code, 422);
}

#[tokio::test]
async fn finalizers_hold_deletion_until_removed() {
    let server = start().await;
    let vas: Api<VolumeAttachment> = Api::all(server.client());
    let mut v = va("va-1", "node-1");
    v.metadata.finalizers = Some(vec!["external-attacher/ebs-csi-aws-com".into()]);
    vas.create(&PostParams::default(), &v).await.unwrap();

    let r = vas.delete("va-1", &DeleteParams::default()).await.unwrap();
    let still = r
        .left()
        .expect("object still there while a finalizer remains");
    assert!(still.metadata.deletion_timestamp.is_some());
    assert_eq!(still.metadata.deletion_grace_period_seconds, Some(0));
    assert!(
        vas.get("va-1")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_some()
    );

    // No new finalizers once deletion started.
    let e = api_err(
        vas.patch("va-1", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": ["external-attacher/ebs-csi-aws-com", "other/x"]}})))
            .await,
    );
    assert_eq!(e.code, 422);
    assert!(
        e.message
            .contains("no new finalizers can be added if the object is being deleted"),
        "{}",
        e.message
    );

    // Removing the last finalizer removes the object.
    vas.patch(
        "va-1",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert_eq!(api_err(vas.get("va-1").await).code, 404);

    // Without finalizers, delete removes at once and answers a Success Status.
    vas.create(&PostParams::default(), &va("va-2", "node-1"))
        .await
        .unwrap();
    let r = vas.delete("va-2", &DeleteParams::default()).await.unwrap();
    let status = r.right().expect("a Status for an object deleted at once");
    assert_eq!(status.details.unwrap().name, "va-2");
    assert_eq!(
        api_err(vas.delete("va-2", &DeleteParams::default()).await).code,
        404
    );
}

#[tokio::test]
async fn delete_preconditions() {
    let server = start().await;
    let pvs: Api<PersistentVolume> = Api::all(server.client());
    let p = pvs
        .create(&PostParams::default(), &pv("pv-1"))
        .await
        .unwrap();
    let wrong_uid = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some("00000000-0000-0000-0000-000000000000".into()),
            resource_version: None,
        }),
        ..Default::default()
    };
    let e = api_err(pvs.delete("pv-1", &wrong_uid).await);
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    assert!(
        e.message
            .contains("Precondition failed: UID in precondition"),
        "{}",
        e.message
    );
    let wrong_rv = DeleteParams {
        preconditions: Some(Preconditions {
            uid: None,
            resource_version: Some("1".into()),
        }),
        ..Default::default()
    };
    assert_eq!(api_err(pvs.delete("pv-1", &wrong_rv).await).code, 409);
    let right = DeleteParams {
        preconditions: Some(Preconditions {
            uid: p.metadata.uid.clone(),
            resource_version: p.metadata.resource_version.clone(),
        }),
        ..Default::default()
    };
    pvs.delete("pv-1", &right).await.unwrap();
    assert_eq!(api_err(pvs.get("pv-1").await).code, 404);
}

#[tokio::test]
async fn selectors_filter_lists() {
    let server = start().await;
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    pods.create(&PostParams::default(), &pod("a", Some("node-1")))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &pod("b", Some("node-2")))
        .await
        .unwrap();
    let mut c = pod("c", None);
    c.metadata.labels = Some([("app".to_string(), "db".to_string())].into());
    pods.create(&PostParams::default(), &c).await.unwrap();
    let names = |l: kube::core::ObjectList<Pod>| -> Vec<String> {
        l.items
            .into_iter()
            .map(|p| p.metadata.name.unwrap())
            .collect()
    };

    assert_eq!(
        names(
            pods.list(&ListParams::default().fields("spec.nodeName=node-1"))
                .await
                .unwrap()
        ),
        vec!["a"]
    );
    assert_eq!(
        names(
            pods.list(&ListParams::default().fields("spec.nodeName!=node-1"))
                .await
                .unwrap()
        ),
        vec!["b", "c"]
    );
    assert_eq!(
        names(
            pods.list(&ListParams::default().labels("app=web"))
                .await
                .unwrap()
        ),
        vec!["a", "b"]
    );
    assert_eq!(
        names(
            pods.list(&ListParams::default().labels("app in (db,cache)"))
                .await
                .unwrap()
        ),
        vec!["c"]
    );
    assert_eq!(
        names(
            pods.list(&ListParams::default().labels("app,app!=web"))
                .await
                .unwrap()
        ),
        vec!["c"]
    );
    assert_eq!(
        names(
            pods.list(&ListParams::default().fields("metadata.name=b"))
                .await
                .unwrap()
        ),
        vec!["b"]
    );
    let e = api_err(
        pods.list(&ListParams::default().fields("spec.hostname=x"))
            .await,
    );
    assert_eq!(e.code, 400);
    assert!(
        e.message
            .contains("field label not supported: spec.hostname"),
        "{}",
        e.message
    );

    // Across namespaces, and namespace isolation.
    let nss: Api<Namespace> = Api::all(server.client());
    nss.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "other"}})).unwrap(),
    )
    .await
    .unwrap();
    let other: Api<Pod> = Api::namespaced(server.client(), "other");
    other
        .create(&PostParams::default(), &pod("a", Some("node-1")))
        .await
        .unwrap();
    let all: Api<Pod> = Api::all(server.client());
    assert_eq!(
        all.list(&ListParams::default().fields("spec.nodeName=node-1"))
            .await
            .unwrap()
            .items
            .len(),
        2
    );
    assert_eq!(
        all.list(&ListParams::default().fields("metadata.namespace=other"))
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    assert_eq!(
        pods.list(&ListParams::default()).await.unwrap().items.len(),
        3
    );
}

#[tokio::test]
async fn pagination_is_a_consistent_snapshot() {
    let server = start().await;
    let pvs: Api<PersistentVolume> = Api::all(server.client());
    for i in 0..5 {
        pvs.create(&PostParams::default(), &pv(&format!("pv-{i}")))
            .await
            .unwrap();
    }
    let first = pvs.list(&ListParams::default().limit(2)).await.unwrap();
    assert_eq!(first.items.len(), 2);
    assert_eq!(first.metadata.remaining_item_count, Some(3));
    let token = first.metadata.continue_.clone().unwrap();
    // Changes after the first page do not show up in the rest of the list.
    pvs.delete("pv-3", &DeleteParams::default()).await.unwrap();
    pvs.create(&PostParams::default(), &pv("pv-9"))
        .await
        .unwrap();
    let rest = pvs
        .list(&ListParams::default().limit(10).continue_token(&token))
        .await
        .unwrap();
    let names: Vec<String> = rest
        .items
        .into_iter()
        .map(|p| p.metadata.name.unwrap())
        .collect();
    assert_eq!(names, vec!["pv-2", "pv-3", "pv-4"]);
    assert_eq!(
        rest.metadata.resource_version,
        first.metadata.resource_version
    );
    assert!(rest.metadata.continue_.is_none());
    let now = pvs.list(&ListParams::default()).await.unwrap();
    assert_eq!(now.items.len(), 5);
}

#[tokio::test]
async fn expired_continue_and_version_are_410() {
    let server = start_with(common::small_window(3)).await;
    let pvs: Api<PersistentVolume> = Api::all(server.client());
    for i in 0..4 {
        pvs.create(&PostParams::default(), &pv(&format!("pv-{i}")))
            .await
            .unwrap();
    }
    let first = pvs.list(&ListParams::default().limit(1)).await.unwrap();
    let token = first.metadata.continue_.clone().unwrap();
    for i in 0..5 {
        pvs.patch(
            &format!("pv-{}", i % 4),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"i": i.to_string()}}})),
        )
        .await
        .unwrap();
    }
    let e = api_err(
        pvs.list(&ListParams::default().limit(1).continue_token(&token))
            .await,
    );
    assert_eq!((e.code, e.reason.as_str()), (410, "Expired"));
    let (code, body) = raw(
        &server,
        "GET",
        "/api/v1/persistentvolumes?resourceVersion=2&resourceVersionMatch=Exact",
        None,
        None,
    )
    .await;
    assert_eq!((code, body["reason"].as_str()), (410, Some("Expired")));
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .starts_with("too old resource version: 2")
    );
}

#[tokio::test]
async fn namespaces_scope_and_cascade() {
    let server = start().await;
    let nss: Api<Namespace> = Api::all(server.client());
    let names: Vec<String> = nss
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|n| n.metadata.name.unwrap())
        .collect();
    assert_eq!(
        names,
        vec!["default", "kube-node-lease", "kube-public", "kube-system"]
    );
    nss.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "team"}})).unwrap(),
    )
    .await
    .unwrap();
    let secrets: Api<Secret> = Api::namespaced(server.client(), "team");
    let s: Secret =
        serde_json::from_value(json!({"metadata": {"name": "s"}, "stringData": {"k": "hi"}}))
            .unwrap();
    let s = secrets.create(&PostParams::default(), &s).await.unwrap();
    assert_eq!(s.data.unwrap()["k"].0, b"hi".to_vec());
    assert_eq!(s.type_.as_deref(), Some("Opaque"));
    // Namespace names are RFC 1123 labels.
    let e = api_err(
        nss.create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "a.b"}})).unwrap(),
        )
        .await,
    );
    assert_eq!(e.code, 422);
    nss.delete("team", &DeleteParams::default()).await.unwrap();
    assert_eq!(api_err(secrets.get("s").await).code, 404);
}

#[tokio::test]
async fn pods_on_a_node_are_deleted_gracefully() {
    let server = start().await;
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    pods.create(&PostParams::default(), &pod("unscheduled", None))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &pod("running", Some("node-1")))
        .await
        .unwrap();
    // Not on a node: gone at once.
    assert!(
        pods.delete("unscheduled", &DeleteParams::default())
            .await
            .unwrap()
            .is_right()
    );
    // On a node: marked, and gone when the kubelet confirms with grace period 0.
    let marked = pods
        .delete("running", &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .unwrap();
    assert_eq!(marked.metadata.deletion_grace_period_seconds, Some(30));
    assert!(pods.get("running").await.is_ok());
    pods.delete(
        "running",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(api_err(pods.get("running").await).code, 404);

    // Binding sets the node once.
    pods.create(&PostParams::default(), &pod("bind-me", None))
        .await
        .unwrap();
    let (code, _) = raw(&server, "POST", "/api/v1/namespaces/default/pods/bind-me/binding", Some("application/json"),
        Some(json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "bind-me"}, "target": {"kind": "Node", "name": "node-7"}}))).await;
    assert_eq!(code, 201);
    assert_eq!(
        pods.get("bind-me")
            .await
            .unwrap()
            .spec
            .unwrap()
            .node_name
            .as_deref(),
        Some("node-7")
    );
    let (code, _) = raw(
        &server,
        "POST",
        "/api/v1/namespaces/default/pods/bind-me/binding",
        Some("application/json"),
        Some(json!({"target": {"kind": "Node", "name": "node-8"}})),
    )
    .await;
    assert_eq!(code, 409);
}

#[tokio::test]
async fn delete_collection_by_label() {
    let server = start().await;
    let vas: Api<VolumeAttachment> = Api::all(server.client());
    for (n, node) in [("a", "n1"), ("b", "n1"), ("c", "n2")] {
        vas.create(&PostParams::default(), &va(n, node))
            .await
            .unwrap();
    }
    vas.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().labels("node=n1"),
    )
    .await
    .unwrap();
    let left: Vec<String> = vas
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|v| v.metadata.name.unwrap())
        .collect();
    assert_eq!(left, vec!["c"]);
}

#[tokio::test]
async fn data_dir_keeps_objects_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let config = apiserver::Config {
        data_dir: Some(dir.path().to_path_buf()),
        ..Default::default()
    };
    let first = start_with(config.clone()).await;
    let vas: Api<VolumeAttachment> = Api::all(first.client());
    vas.create(&PostParams::default(), &va("keep", "n1"))
        .await
        .unwrap();
    vas.create(&PostParams::default(), &va("drop", "n1"))
        .await
        .unwrap();
    vas.delete("drop", &DeleteParams::default()).await.unwrap();
    let rv = first.resource_version();
    first.shutdown().await.unwrap();

    let second = start_with(config).await;
    assert!(second.resource_version() >= rv, "versions never go back");
    let vas: Api<VolumeAttachment> = Api::all(second.client());
    let names: Vec<String> = vas
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|v| v.metadata.name.unwrap())
        .collect();
    assert_eq!(names, vec!["keep"]);
    second.shutdown().await.unwrap();
}

#[tokio::test]
async fn concurrent_read_modify_write_loses_no_update() {
    let server = start().await;
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(server.client(), "default");
    let lease = serde_json::from_value(
        json!({"metadata": {"name": "counter"}, "spec": {"leaseTransitions": 0}}),
    )
    .unwrap();
    leases.create(&PostParams::default(), &lease).await.unwrap();
    let (tasks, per_task) = (8, 25);
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let leases = leases.clone();
        handles.push(tokio::spawn(async move {
            let mut conflicts = 0;
            for _ in 0..per_task {
                loop {
                    let mut cur = leases.get("counter").await.unwrap();
                    let spec = cur.spec.as_mut().unwrap();
                    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
                    match leases
                        .replace("counter", &PostParams::default(), &cur)
                        .await
                    {
                        Ok(_) => break,
                        Err(kube::Error::Api(s)) if s.code == 409 => conflicts += 1,
                        Err(e) => panic!("unexpected error: {e}"),
                    }
                }
            }
            conflicts
        }));
    }
    let mut conflicts = 0;
    for h in handles {
        conflicts += h.await.unwrap();
    }
    let end = leases.get("counter").await.unwrap();
    assert_eq!(end.spec.unwrap().lease_transitions, Some(tasks * per_task));
    eprintln!("{conflicts} conflicts retried");
}

/// DefaultStorageClass admission, on by default in kube-apiserver: a claim without
/// `storageClassName` gets the default class; `""` (no class, for static volumes) is kept.
#[tokio::test]
async fn a_claim_without_a_class_gets_the_default_one() {
    use k8s_openapi::api::core::v1::PersistentVolumeClaim;
    use k8s_openapi::api::storage::v1::StorageClass;
    let server = start().await;
    let client = server.client();
    let classes: Api<StorageClass> = Api::all(client.clone());
    for (name, default) in [("fast", true), ("slow", false)] {
        let mut sc = json!({"metadata": {"name": name}, "provisioner": "ebs.csi.aws.com"});
        if default {
            sc["metadata"]["annotations"] =
                json!({"storageclass.kubernetes.io/is-default-class": "true"});
        }
        classes
            .create(&PostParams::default(), &serde_json::from_value(sc).unwrap())
            .await
            .unwrap();
    }
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client, "default");
    let claim = |name: &str, class: Option<&str>| {
        let mut c = json!({"metadata": {"name": name}, "spec": {
            "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}});
        if let Some(class) = class {
            c["spec"]["storageClassName"] = json!(class);
        }
        serde_json::from_value::<PersistentVolumeClaim>(c).unwrap()
    };
    let pp = PostParams::default();
    let unset = claims.create(&pp, &claim("unset", None)).await.unwrap();
    assert_eq!(
        unset.spec.unwrap().storage_class_name.as_deref(),
        Some("fast")
    );
    let empty = claims.create(&pp, &claim("empty", Some(""))).await.unwrap();
    assert_eq!(empty.spec.unwrap().storage_class_name.as_deref(), Some(""));
    let slow = claims
        .create(&pp, &claim("slow", Some("slow")))
        .await
        .unwrap();
    assert_eq!(
        slow.spec.unwrap().storage_class_name.as_deref(),
        Some("slow")
    );
}
