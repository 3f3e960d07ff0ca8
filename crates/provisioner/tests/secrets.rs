//! StorageClass secrets: templates resolved, the provisioner secret's data in CreateVolume,
//! the other refs in the PV, the deletion-secret annotations used by DeleteVolume, and a
//! disallowed placeholder reported as ProvisioningFailed naming it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;

use common::*;
use csi_mock::Method;

const MOCK: &str = "mock.csi.rs";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn templated_secrets_reach_create_the_pv_and_delete() {
    let mut env = Env::with_mock(provisioning_mock(MOCK)).await;
    env.create_class(class(
        "secret",
        MOCK,
        &[
            (
                "csi.storage.k8s.io/provisioner-secret-name",
                "${pvc.name}-creds",
            ),
            (
                "csi.storage.k8s.io/provisioner-secret-namespace",
                "${pvc.namespace}",
            ),
            (
                "csi.storage.k8s.io/node-publish-secret-name",
                "${pvc.annotations['team']}-${pv.name}",
            ),
            (
                "csi.storage.k8s.io/node-publish-secret-namespace",
                "${pv.name}",
            ),
            (
                "csi.storage.k8s.io/controller-publish-secret-name",
                "attach",
            ),
            (
                "csi.storage.k8s.io/controller-publish-secret-namespace",
                "kube-system",
            ),
            (
                "csi.storage.k8s.io/node-stage-secret-name",
                "${pvc.namespace}-stage",
            ),
            (
                "csi.storage.k8s.io/node-stage-secret-namespace",
                "${pvc.namespace}",
            ),
            ("csi.storage.k8s.io/controller-expand-secret-name", "expand"),
            (
                "csi.storage.k8s.io/controller-expand-secret-namespace",
                "kube-system",
            ),
            ("csi.storage.k8s.io/node-expand-secret-name", "nexpand"),
            (
                "csi.storage.k8s.io/node-expand-secret-namespace",
                "kube-system",
            ),
        ],
    ))
    .await;
    env.create_secret(NS, "data-creds", &[("user", "alice"), ("key", "s3cr3t")])
        .await;
    env.start(fast_options()).await;
    let mut p = pvc("data", "secret", "1Gi", Some(MOCK));
    p.metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert("team".into(), "blue".into());
    let claim = env.create_pvc(p).await;
    let name = pv_name(&claim);
    let pv = env.wait_pv(&name).await;

    let call = &env.mock().calls_of(Method::CreateVolume)[0];
    let expected: BTreeMap<String, String> = [("user", "alice"), ("key", "s3cr3t")]
        .into_iter()
        .map(|(k, v)| (k.into(), v.into()))
        .collect();
    assert_eq!(call.secrets, expected);
    let req = call.create_request.clone().unwrap();
    assert!(
        req.parameters.is_empty(),
        "no csi.storage.k8s.io key reaches the driver: {:?}",
        req.parameters
    );

    let annotations = pv.metadata.annotations.clone().unwrap();
    assert_eq!(
        annotations["volume.kubernetes.io/provisioner-deletion-secret-name"],
        "data-creds"
    );
    assert_eq!(
        annotations["volume.kubernetes.io/provisioner-deletion-secret-namespace"],
        NS
    );
    let csi = pv.spec.clone().unwrap().csi.unwrap();
    let r = |s: Option<k8s_openapi::api::core::v1::SecretReference>| {
        let s = s.unwrap();
        (s.name.unwrap(), s.namespace.unwrap())
    };
    assert_eq!(
        r(csi.node_publish_secret_ref),
        (format!("blue-{name}"), name.clone())
    );
    assert_eq!(
        r(csi.controller_publish_secret_ref),
        ("attach".into(), "kube-system".into())
    );
    assert_eq!(
        r(csi.node_stage_secret_ref),
        (format!("{NS}-stage"), NS.to_string())
    );
    assert_eq!(
        r(csi.controller_expand_secret_ref),
        ("expand".into(), "kube-system".into())
    );
    assert_eq!(
        r(csi.node_expand_secret_ref),
        ("nexpand".into(), "kube-system".into())
    );

    // Released with reclaim Delete: DeleteVolume gets the provisioner secret again.
    env.set_pv_phase(&name, "Released").await;
    eventually("the PV deleted", || async {
        env.pv(&name).await.is_none().then_some(())
    })
    .await;
    let deletes = env.mock().calls_of(Method::DeleteVolume);
    assert_eq!(deletes.len(), 1, "{deletes:?}");
    assert_eq!(deletes[0].volume_id, csi.volume_handle);
    assert_eq!(deletes[0].secrets, expected);
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disallowed_placeholder_fails_naming_it() {
    let mut env = Env::with_mock(provisioning_mock(MOCK)).await;
    env.create_class(class(
        "bad",
        MOCK,
        &[
            // Annotations are not allowed in the provisioner secret (it outlives the claim).
            (
                "csi.storage.k8s.io/provisioner-secret-name",
                "${pvc.annotations['team']}",
            ),
            (
                "csi.storage.k8s.io/provisioner-secret-namespace",
                "${pvc.namespace}",
            ),
        ],
    ))
    .await;
    env.create_class(class(
        "unknown",
        MOCK,
        &[
            ("csi.storage.k8s.io/node-stage-secret-name", "x"),
            (
                "csi.storage.k8s.io/node-stage-secret-namespace",
                "${pvc.name}",
            ),
        ],
    ))
    .await;
    env.start(fast_options()).await;
    env.create_pvc(pvc("bad", "bad", "1Gi", Some(MOCK))).await;
    env.create_pvc(pvc("unknown", "unknown", "1Gi", Some(MOCK)))
        .await;
    let m = env
        .wait_event("bad", "ProvisioningFailed", "pvc.annotations['team']")
        .await;
    assert!(
        m.starts_with("failed to provision volume with StorageClass \"bad\": "),
        "{m}"
    );
    assert!(
        m.contains("csi.storage.k8s.io/provisioner-secret-name"),
        "{m}"
    );
    let m = env
        .wait_event("unknown", "ProvisioningFailed", "\"pvc.name\"")
        .await;
    assert!(
        m.contains("csi.storage.k8s.io/node-stage-secret-namespace"),
        "{m}"
    );
    assert!(env.mock().calls_of(Method::CreateVolume).is_empty());
    env.stop().await;
}
