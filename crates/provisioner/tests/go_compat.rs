//! Switching between the Go external-provisioner and ours with PVs in place: a PV shaped as
//! the Go sidecar (v3+) writes it is deleted by ours with the secret its annotations name
//! (empty annotations: no secret, whatever the class says; no annotations: the class's
//! secret), and the PVs ours writes carry every field the Go sidecar writes and reads back
//! (`provisioned-by`, both deletion-secret annotations, empty without a secret, the
//! `csiProvisionerIdentity` attribute, its finalizer).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;

use common::*;
use csi_mock::Method;
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::Api;
use kube::api::PostParams;
use provisioner::{
    DELETION_SECRET_NAME_ANNOTATION, DELETION_SECRET_NAMESPACE_ANNOTATION,
    PROVISIONER_IDENTITY_ATTRIBUTE,
};

const MOCK: &str = "mock.csi.rs";

/// A PV exactly as the Go csi-provisioner leaves it for a claim `claim` of class `class`
/// (the claim since deleted), made by another provisioner instance; `secret`: its
/// deletion-secret annotations (`None`: a PV from before they existed).
fn go_pv(name: &str, class: &str, claim: &str, secret: Option<(&str, &str)>) -> PersistentVolume {
    let mut annotations = serde_json::json!({PROVISIONED_BY_ANNOTATION: MOCK});
    if let Some((n, ns)) = secret {
        annotations[DELETION_SECRET_NAME_ANNOTATION] = n.into();
        annotations[DELETION_SECRET_NAMESPACE_ANNOTATION] = ns.into();
    }
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {
            "name": name,
            "annotations": annotations,
            "finalizers": [PV_FINALIZER],
        },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "capacity": {"storage": "1Gi"},
            "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                         "namespace": NS, "name": claim,
                         "uid": "0b6f6f4e-6c61-4f1e-9d35-000000000001"},
            "csi": {
                "driver": MOCK,
                "volumeHandle": format!("handle-{name}"),
                "fsType": "ext4",
                "volumeAttributes": {
                    PROVISIONER_IDENTITY_ATTRIBUTE: format!("1700000000000-4242-{MOCK}"),
                    "from-driver": "x",
                },
            },
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": class,
            "volumeMode": "Filesystem",
        },
    }))
    .unwrap()
}

fn secrets(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pvs_the_go_provisioner_wrote_are_deleted_with_the_secret_it_recorded() {
    let mut env = Env::with_mock(provisioning_mock(MOCK)).await;
    let mut sc = class(
        "with-secret",
        MOCK,
        &[
            ("csi.storage.k8s.io/provisioner-secret-name", "class-creds"),
            ("csi.storage.k8s.io/provisioner-secret-namespace", NS),
        ],
    );
    sc.reclaim_policy = Some("Delete".into());
    env.create_class(sc).await;
    env.create_secret(NS, "class-creds", &[("from", "class")])
        .await;
    env.create_secret(NS, "go-creds", &[("from", "annotation")])
        .await;
    let pvs = Api::<PersistentVolume>::all(env.kube.clone());
    let cases = [
        (
            "go-annotated",
            Some(("go-creds", NS)),
            secrets(&[("from", "annotation")]),
        ),
        ("go-no-secret", Some(("", "")), secrets(&[])),
        ("pre-annotations", None, secrets(&[("from", "class")])),
    ];
    for (name, secret, _) in &cases {
        pvs.create(
            &PostParams::default(),
            &go_pv(name, "with-secret", &format!("claim-{name}"), *secret),
        )
        .await
        .unwrap();
        env.set_pv_phase(name, "Released").await;
    }
    env.start(fast_options()).await;
    for (name, _, _) in &cases {
        eventually(&format!("PV {name} deleted"), || async {
            env.pv(name).await.is_none().then_some(())
        })
        .await;
    }
    let deletes = env.mock().calls_of(Method::DeleteVolume);
    assert_eq!(deletes.len(), cases.len(), "{deletes:?}");
    for (name, _, want) in &cases {
        let call = deletes
            .iter()
            .find(|c| c.volume_id == format!("handle-{name}"))
            .unwrap_or_else(|| panic!("no DeleteVolume of {name}: {deletes:?}"));
        assert_eq!(&call.secrets, want, "secrets of {name}");
    }
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_pvs_carry_every_field_the_go_provisioner_writes() {
    let mut env = Env::with_mock(provisioning_mock(MOCK)).await;
    env.create_class(class("plain", MOCK, &[])).await;
    env.start(fast_options()).await;
    let first = env
        .create_pvc(pvc("first", "plain", "1Gi", Some(MOCK)))
        .await;
    let second = env
        .create_pvc(pvc("second", "plain", "1Gi", Some(MOCK)))
        .await;
    let first = env.wait_pv(&pv_name(&first)).await;
    let second = env.wait_pv(&pv_name(&second)).await;

    let annotations = first.metadata.annotations.clone().unwrap();
    assert_eq!(
        annotations,
        [
            (PROVISIONED_BY_ANNOTATION.to_string(), MOCK.to_string()),
            (DELETION_SECRET_NAME_ANNOTATION.to_string(), String::new()),
            (
                DELETION_SECRET_NAMESPACE_ANNOTATION.to_string(),
                String::new()
            ),
        ]
        .into(),
        "the Go sidecar's annotations, empty without a provisioner secret"
    );
    assert_eq!(
        first.metadata.finalizers.clone().unwrap(),
        vec![PV_FINALIZER.to_string()]
    );
    let identity = |pv: &PersistentVolume| {
        pv.spec
            .clone()
            .unwrap()
            .csi
            .unwrap()
            .volume_attributes
            .unwrap()[PROVISIONER_IDENTITY_ATTRIBUTE]
            .clone()
    };
    let id = identity(&first);
    let parts: Vec<&str> = id.splitn(3, '-').collect();
    assert_eq!(parts.len(), 3, "{id}");
    assert!(parts[0].parse::<u64>().is_ok(), "start-up time in ms: {id}");
    assert!(parts[1].parse::<u32>().unwrap() < 10_000, "{id}");
    assert_eq!(parts[2], MOCK);
    assert_eq!(
        identity(&second),
        id,
        "one identity per provisioner run, on every volume"
    );
    env.stop().await;
}
