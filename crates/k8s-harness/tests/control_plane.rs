//! The control plane alone: kube-apiserver answers, the admin may do anything, a
//! ServiceAccount may do exactly what RBAC grants it, and no credentials is 401.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failed test

use k8s_harness::{Cluster, ClusterOptions};
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume};
use kube::api::{Api, PostParams};

fn pv(name: &str) -> PersistentVolume {
    test_support::objects::csi_pv(name, "hostpath.csi.k8s.io", name)
}

fn api_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

#[tokio::test]
async fn rbac_is_enforced_for_a_service_account_and_anonymous_is_refused() {
    let Some(cluster) = Cluster::start_or_skip(ClusterOptions::control_plane()).await else {
        return;
    };
    // /readyz through the admin kubeconfig, with kubectl as a second client.
    assert_eq!(
        cluster
            .kubectl(&["get", "--raw", "/readyz"])
            .unwrap()
            .trim(),
        "ok"
    );

    let admin = cluster.admin_client().await.unwrap();
    let ns = Namespace {
        metadata: kube::core::ObjectMeta {
            name: Some("harness-ns".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let got = Api::<Namespace>::all(admin.clone())
        .get("harness-ns")
        .await
        .unwrap();
    assert!(got.metadata.uid.is_some(), "the real apiserver set a uid");

    // A ServiceAccount with no RBAC: 403 naming the account and the resource.
    let sa = cluster
        .service_account_kubeconfig("harness-ns", "provisioner")
        .await
        .unwrap();
    let as_sa: Api<PersistentVolume> = Api::all(cluster.client(&sa).await.unwrap());
    let err = as_sa
        .create(&PostParams::default(), &pv("pv-1"))
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), Some(403), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("system:serviceaccount:harness-ns:provisioner")
            && msg.contains("persistentvolumes"),
        "{msg}"
    );
    // kubectl as the same identity sees the same refusal.
    let kerr = cluster
        .kubectl_as(&sa, &["get", "pv"], None)
        .unwrap_err()
        .to_string();
    assert!(
        kerr.contains("Forbidden") || kerr.contains("forbidden"),
        "{kerr}"
    );

    // Granted through kubectl apply: the same create succeeds.
    cluster
        .apply(
            r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: { name: harness-pv-writer }
rules:
- apiGroups: [""]
  resources: [persistentvolumes]
  verbs: [create, get, list, watch, delete]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: { name: harness-pv-writer }
roleRef: { apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: harness-pv-writer }
subjects:
- { kind: ServiceAccount, name: provisioner, namespace: harness-ns }
"#,
        )
        .unwrap();
    // RBAC's authorizer reads from an informer: allow it a moment to see the binding.
    let created = test_support::eventually(
        "the PV create to be allowed",
        std::time::Duration::from_secs(10),
        || {
            let as_sa = as_sa.clone();
            async move { as_sa.create(&PostParams::default(), &pv("pv-1")).await.ok() }
        },
    )
    .await;
    assert_eq!(created.metadata.name.as_deref(), Some("pv-1"));
    // Still nothing beyond the rule: namespaces stay forbidden.
    let ns_err = Api::<Namespace>::all(cluster.client(&sa).await.unwrap())
        .list(&Default::default())
        .await
        .unwrap_err();
    assert_eq!(api_code(&ns_err), Some(403), "{ns_err}");

    // A client certificate for a user of our choosing is authenticated as that user.
    let user = cluster.user_kubeconfig("jane", &["devs"]).unwrap();
    let jane_err = Api::<PersistentVolume>::all(cluster.client(&user).await.unwrap())
        .list(&Default::default())
        .await
        .unwrap_err();
    assert_eq!(api_code(&jane_err), Some(403));
    assert!(jane_err.to_string().contains("\"jane\""), "{jane_err}");

    // No credentials at all, and a made-up token: 401.
    let mut anonymous = kube::Config::new(cluster.server().parse().unwrap());
    anonymous.root_cert = Some(vec![pem_der(
        &std::fs::read_to_string(cluster.ca_cert()).unwrap(),
    )]);
    let anon = Api::<Namespace>::all(kube::Client::try_from(anonymous.clone()).unwrap());
    let err = anon.list(&Default::default()).await.unwrap_err();
    assert_eq!(api_code(&err), Some(401), "{err}");
    anonymous.auth_info.token = Some("not-a-real-token".to_string().into());
    let bogus = Api::<Namespace>::all(kube::Client::try_from(anonymous).unwrap());
    let err = bogus.list(&Default::default()).await.unwrap_err();
    assert_eq!(api_code(&err), Some(401), "{err}");
}

/// The DER bytes of a one-certificate PEM.
fn pem_der(pem: &str) -> Vec<u8> {
    use base64::Engine as _;
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    base64::engine::general_purpose::STANDARD
        .decode(body)
        .unwrap()
}
