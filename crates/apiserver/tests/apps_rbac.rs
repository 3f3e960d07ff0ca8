//! The kinds a CSI deployment ships (ServiceAccount, ConfigMap, RBAC, Deployment, DaemonSet)
//! through kube-rs: discovery, defaults, validation as the real server words it, status
//! subresources; and the audit trail of who called what.
// Test code (helpers included): a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use apiserver::{AuditRecord, Config};
use common::{api_err, raw, start, start_with};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchParams};
use kube::core::WatchEvent;
use kube::discovery::{Discovery, Scope};
use serde_json::{Value, json};

fn deployment(name: &str, selector: Value, labels: Value) -> Deployment {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": 2,
            "selector": selector,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [{"name": "csi-attacher", "image": "csi-rs/csi-attacher:v0.1.0",
                        "volumeMounts": [{"name": "socket-dir", "mountPath": "/csi"}]}],
                    "volumes": [{"name": "socket-dir", "emptyDir": {}}]
                }
            }
        }
    }))
    .unwrap()
}

#[tokio::test]
async fn discovery_lists_the_new_kinds_with_short_names() {
    let server = start().await;
    let discovery = Discovery::new(server.client()).run().await.unwrap();
    let mut found = Vec::new();
    for group in discovery.groups() {
        for (ar, caps) in group.recommended_resources() {
            found.push((
                ar.group.clone(),
                ar.plural.clone(),
                caps.scope == Scope::Namespaced,
            ));
        }
    }
    for (group, plural, namespaced) in [
        ("", "serviceaccounts", true),
        ("", "configmaps", true),
        ("apps", "deployments", true),
        ("apps", "daemonsets", true),
        ("rbac.authorization.k8s.io", "clusterroles", false),
        ("rbac.authorization.k8s.io", "clusterrolebindings", false),
        ("rbac.authorization.k8s.io", "roles", true),
        ("rbac.authorization.k8s.io", "rolebindings", true),
    ] {
        assert!(
            found.contains(&(group.to_string(), plural.to_string(), namespaced)),
            "{group}/{plural} missing from discovery: {found:?}"
        );
    }
    let (code, core) = raw(&server, "GET", "/api/v1", None, None).await;
    assert_eq!(code, 200);
    let short = |list: &Value, name: &str| {
        list["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .unwrap()["shortNames"]
            .clone()
    };
    assert_eq!(short(&core, "serviceaccounts"), json!(["sa"]));
    assert_eq!(short(&core, "configmaps"), json!(["cm"]));
    let (_, apps) = raw(&server, "GET", "/apis/apps/v1", None, None).await;
    assert_eq!(short(&apps, "deployments"), json!(["deploy"]));
    assert_eq!(short(&apps, "daemonsets"), json!(["ds"]));
}

#[tokio::test]
async fn every_kind_stores_and_reads_back_with_defaults() {
    let server = start().await;
    let c = server.client();
    let pp = PostParams::default();
    let sas: Api<ServiceAccount> = Api::namespaced(c.clone(), "kube-system");
    sas.create(
        &pp,
        &serde_json::from_value(json!({"metadata": {"name": "csi-attacher"}})).unwrap(),
    )
    .await
    .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "kube-system");
    cms.create(
        &pp,
        &serde_json::from_value(json!({"metadata": {"name": "cfg"}, "data": {"k.conf": "x"}}))
            .unwrap(),
    )
    .await
    .unwrap();
    let crs: Api<ClusterRole> = Api::all(c.clone());
    crs.create(&pp, &serde_json::from_value(json!({
        "metadata": {"name": "system:csi-attacher"},
        "rules": [{"apiGroups": [""], "resources": ["persistentvolumes"], "verbs": ["get", "list"]}]
    })).unwrap()).await.unwrap();
    let crbs: Api<ClusterRoleBinding> = Api::all(c.clone());
    let crb = crbs
        .create(
            &pp,
            &serde_json::from_value(json!({
                "metadata": {"name": "csi-attacher"},
                "roleRef": {"kind": "ClusterRole", "name": "system:csi-attacher"},
                "subjects": [{"kind": "ServiceAccount", "name": "csi-attacher", "namespace": "kube-system"}]
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(crb.role_ref.api_group, "rbac.authorization.k8s.io");
    let roles: Api<Role> = Api::namespaced(c.clone(), "kube-system");
    roles.create(&pp, &serde_json::from_value(json!({
        "metadata": {"name": "leases"},
        "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "update"]}]
    })).unwrap()).await.unwrap();
    let rbs: Api<RoleBinding> = Api::namespaced(c.clone(), "kube-system");
    rbs.create(
        &pp,
        &serde_json::from_value(json!({
            "metadata": {"name": "leases"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "leases"},
            "subjects": [{"kind": "ServiceAccount", "name": "csi-attacher"}]
        }))
        .unwrap(),
    )
    .await
    .unwrap();
    let deploys: Api<Deployment> = Api::namespaced(c.clone(), "kube-system");
    let mut d = deployment(
        "csi-attacher",
        json!({"matchLabels": {"app": "csi-attacher"}}),
        json!({"app": "csi-attacher"}),
    );
    d.status = serde_json::from_value(json!({"replicas": 7})).unwrap();
    let created = deploys.create(&pp, &d).await.unwrap();
    let spec = created.spec.as_ref().unwrap();
    assert_eq!(spec.replicas, Some(2));
    assert_eq!(spec.revision_history_limit, Some(10));
    assert_eq!(
        spec.strategy.as_ref().unwrap().type_.as_deref(),
        Some("RollingUpdate")
    );
    let pod = spec.template.spec.as_ref().unwrap();
    assert_eq!(pod.restart_policy.as_deref(), Some("Always"));
    assert_eq!(
        pod.containers[0].image_pull_policy.as_deref(),
        Some("IfNotPresent")
    );
    assert!(
        created.status.as_ref().is_none_or(|s| s.replicas.is_none()),
        "status is the controllers' to write: dropped on create"
    );
    assert_eq!(created.metadata.generation, Some(1));

    let dss: Api<DaemonSet> = Api::namespaced(c.clone(), "kube-system");
    let ds: DaemonSet = serde_json::from_value(json!({
        "metadata": {"name": "ebs-csi-node"},
        "spec": {"selector": {"matchLabels": {"app": "ebs-csi-node"}},
                 "template": {"metadata": {"labels": {"app": "ebs-csi-node"}},
                              "spec": {"containers": [{"name": "node", "image": "csi-rs/ebs-csi-driver:v0.1.0"}]}}}
    }))
    .unwrap();
    let ds = dss.create(&pp, &ds).await.unwrap();
    let strategy = ds.spec.unwrap().update_strategy.unwrap();
    assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));

    // Everything reads back, in its own scope.
    assert_eq!(
        sas.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );
    assert!(
        cms.get("cfg")
            .await
            .unwrap()
            .data
            .unwrap()
            .contains_key("k.conf")
    );
    crs.get("system:csi-attacher").await.unwrap();
    rbs.get("leases").await.unwrap();
    let all_deploys: Api<Deployment> = Api::all(c.clone());
    assert_eq!(
        all_deploys
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    let other_ns: Api<Role> = Api::namespaced(c.clone(), "default");
    assert_eq!(api_err(other_ns.get("leases").await).code, 404);

    // Status subresource: /status writes status only, main writes keep it.
    let st = PatchParams::default();
    deploys
        .patch_status(
            "csi-attacher",
            &st,
            &Patch::Merge(
                json!({"status": {"readyReplicas": 2, "replicas": 2}, "spec": {"replicas": 9}}),
            ),
        )
        .await
        .unwrap();
    let after = deploys
        .patch(
            "csi-attacher",
            &st,
            &Patch::Merge(json!({"spec": {"replicas": 3}, "status": {"replicas": 0}})),
        )
        .await
        .unwrap();
    assert_eq!(after.spec.as_ref().unwrap().replicas, Some(3));
    assert_eq!(after.status.as_ref().unwrap().ready_replicas, Some(2));
    assert_eq!(after.status.as_ref().unwrap().replicas, Some(2));
    assert_eq!(after.metadata.generation, Some(2), "spec changed once");
}

#[tokio::test]
async fn validation_is_worded_as_the_real_server() {
    let server = start().await;
    let c = server.client();
    let pp = PostParams::default();

    // A RoleBinding needs a roleRef.
    let rbs: Api<RoleBinding> = Api::namespaced(c.clone(), "default");
    let (code, body) = raw(
        &server,
        "POST",
        "/apis/rbac.authorization.k8s.io/v1/namespaces/default/rolebindings",
        Some("application/json"),
        Some(json!({"metadata": {"name": "rb"}, "subjects": [{"kind": "ServiceAccount", "name": "sa"}]})),
    )
    .await;
    assert_eq!(code, 422, "{body}");
    assert_eq!(body["reason"], "Invalid");
    assert_eq!(
        body["message"],
        "RoleBinding.rbac.authorization.k8s.io \"rb\" is invalid: [roleRef.kind: Unsupported value: \"\": supported values: \"Role\", \"ClusterRole\", roleRef.name: Required value]"
    );
    let fields: Vec<&str> = body["details"]["causes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["field"].as_str().unwrap())
        .collect();
    assert_eq!(fields, vec!["roleRef.kind", "roleRef.name"]);

    // The roleRef never changes.
    let rb: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "rb"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "a"},
        "subjects": [{"kind": "ServiceAccount", "name": "sa"}]
    }))
    .unwrap();
    rbs.create(&pp, &rb).await.unwrap();
    let e = api_err(
        rbs.patch(
            "rb",
            &PatchParams::default(),
            &Patch::Merge(json!({"roleRef": {"name": "b"}})),
        )
        .await,
    );
    assert_eq!(e.code, 422);
    assert!(
        e.message.ends_with("cannot change roleRef"),
        "{}",
        e.message
    );

    // A ClusterRoleBinding binds only ClusterRoles and needs the ServiceAccount's namespace.
    let crbs: Api<ClusterRoleBinding> = Api::all(c.clone());
    let crb: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "crb"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "a"},
        "subjects": [{"kind": "ServiceAccount", "name": "sa"}]
    }))
    .unwrap();
    let e = api_err(crbs.create(&pp, &crb).await);
    assert_eq!(
        e.message,
        "ClusterRoleBinding.rbac.authorization.k8s.io \"crb\" is invalid: [roleRef.kind: Unsupported value: \"Role\": supported values: \"ClusterRole\", subjects[0].namespace: Required value]"
    );

    // Role rules need verbs, groups and resources.
    let roles: Api<Role> = Api::namespaced(c.clone(), "default");
    let role: Role = serde_json::from_value(
        json!({"metadata": {"name": "r"}, "rules": [{"apiGroups": [""], "resources": ["pods"]}]}),
    )
    .unwrap();
    let e = api_err(roles.create(&pp, &role).await);
    assert_eq!(
        e.message,
        "Role.rbac.authorization.k8s.io \"r\" is invalid: rules[0].verbs: Required value: verbs must contain at least one value"
    );

    // A Deployment's template labels must match its selector.
    let deploys: Api<Deployment> = Api::namespaced(c.clone(), "default");
    let d = deployment(
        "d",
        json!({"matchLabels": {"app": "a"}}),
        json!({"app": "b"}),
    );
    let e = api_err(deploys.create(&pp, &d).await);
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    assert_eq!(
        e.message,
        "Deployment.apps \"d\" is invalid: spec.template.metadata.labels: Invalid value: {\"app\":\"b\"}: `selector` does not match template `labels`"
    );
    assert_eq!(
        e.details.as_ref().unwrap().causes[0].field,
        "spec.template.metadata.labels"
    );

    // ... and needs a selector at all.
    let mut no_sel = deployment(
        "d",
        json!({"matchLabels": {"app": "a"}}),
        json!({"app": "a"}),
    );
    no_sel.spec.as_mut().unwrap().selector = Default::default();
    let mut body = serde_json::to_value(&no_sel).unwrap();
    body["spec"].as_object_mut().unwrap().remove("selector");
    let (code, status) = raw(
        &server,
        "POST",
        "/apis/apps/v1/namespaces/default/deployments",
        Some("application/json"),
        Some(body),
    )
    .await;
    assert_eq!(code, 422);
    assert_eq!(status["details"]["causes"][0]["field"], "spec.selector");
    assert_eq!(
        status["details"]["causes"][0]["reason"],
        "FieldValueRequired"
    );

    // A mount must name a volume of the pod.
    let mut bad_mount = deployment(
        "d",
        json!({"matchLabels": {"app": "a"}}),
        json!({"app": "a"}),
    );
    bad_mount
        .spec
        .as_mut()
        .unwrap()
        .template
        .spec
        .as_mut()
        .unwrap()
        .volumes = None;
    let e = api_err(deploys.create(&pp, &bad_mount).await);
    assert_eq!(
        e.message,
        "Deployment.apps \"d\" is invalid: spec.template.spec.containers[0].volumeMounts[0].name: Not found: \"socket-dir\""
    );

    // The selector is immutable.
    let ok = deployment(
        "d",
        json!({"matchLabels": {"app": "a"}}),
        json!({"app": "a"}),
    );
    deploys.create(&pp, &ok).await.unwrap();
    let e = api_err(
        deploys
            .patch(
                "d",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"selector": {"matchLabels": {"app": "b"}},
                    "template": {"metadata": {"labels": {"app": "b"}}}}})),
            )
            .await,
    );
    assert_eq!(
        e.message,
        "Deployment.apps \"d\" is invalid: spec.selector: Invalid value: {\"matchLabels\":{\"app\":\"b\"}}: field is immutable"
    );

    // An empty DaemonSet selector.
    let dss: Api<DaemonSet> = Api::namespaced(c.clone(), "default");
    let ds: DaemonSet = serde_json::from_value(json!({
        "metadata": {"name": "ds"},
        "spec": {"selector": {}, "template": {"spec": {"containers": [{"name": "c", "image": "x:1"}]}}}
    }))
    .unwrap();
    let e = api_err(dss.create(&pp, &ds).await);
    assert_eq!(
        e.message,
        "DaemonSet.apps \"ds\" is invalid: spec.selector: Invalid value: {}: empty selector is invalid for daemonset"
    );
}

fn agent_client(server: &apiserver::RunningApiServer, agent: &str) -> kube::Client {
    let mut config = server.kube_config().unwrap();
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_str(agent).unwrap(),
    ));
    apiserver::install_crypto_provider();
    kube::Client::try_from(config).unwrap()
}

fn summary(r: &AuditRecord) -> String {
    let mut s = format!("{} {} ", r.verb, r.code);
    if !r.group.is_empty() {
        s.push_str(&r.group);
        s.push('/');
    }
    s.push_str(&r.resource);
    if let Some(sub) = &r.subresource {
        s.push('/');
        s.push_str(sub);
    }
    if let Some(ns) = &r.namespace {
        s.push_str(&format!(" ns={ns}"));
    }
    if let Some(n) = &r.name {
        s.push_str(&format!(" name={n}"));
    }
    s
}

#[tokio::test]
async fn audit_records_who_called_what() {
    let server = start().await;
    // Setup traffic from the test's own client, then forgotten.
    let setup: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    setup
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "setup"}})).unwrap(),
        )
        .await
        .unwrap();
    assert!(!server.audit().is_empty());
    server.audit_clear();
    assert!(server.audit().is_empty());

    let client = agent_client(&server, "csi-attacher/v0.1.0 (test)");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let deploys: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "c", "labels": {"x": "y"}}})).unwrap();
    cms.create(&pp, &cm).await.unwrap();
    cms.get("c").await.unwrap();
    cms.list(&ListParams::default()).await.unwrap();
    let mut stream = cms
        .watch(
            &WatchParams::default().fields("metadata.name=c").timeout(1),
            "0",
        )
        .await
        .unwrap()
        .boxed();
    assert!(matches!(
        stream.next().await,
        Some(Ok(WatchEvent::Added(_)))
    ));
    drop(stream);
    cms.patch(
        "c",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "v"}})),
    )
    .await
    .unwrap();
    cms.replace("c", &pp, &cms.get("c").await.unwrap())
        .await
        .unwrap();
    assert_eq!(api_err(cms.get("missing").await).code, 404);
    let d = deployment(
        "d",
        json!({"matchLabels": {"app": "a"}}),
        json!({"app": "a"}),
    );
    deploys.create(&pp, &d).await.unwrap();
    deploys
        .patch_status(
            "d",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"replicas": 1}})),
        )
        .await
        .unwrap();
    let bad = deployment(
        "e",
        json!({"matchLabels": {"app": "a"}}),
        json!({"app": "b"}),
    );
    assert_eq!(api_err(deploys.create(&pp, &bad).await).code, 422);
    cms.delete("c", &DeleteParams::default()).await.unwrap();
    cms.delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .unwrap();

    let records = server.audit();
    assert!(
        records
            .iter()
            .all(|r| r.user_agent == "csi-attacher/v0.1.0 (test)" && r.version == "v1"),
        "{records:#?}"
    );
    let got: Vec<String> = records.iter().map(summary).collect();
    assert_eq!(
        got,
        vec![
            "create 201 configmaps ns=default name=c",
            "get 200 configmaps ns=default name=c",
            "list 200 configmaps ns=default",
            "watch 200 configmaps ns=default name=c",
            "patch 200 configmaps ns=default name=c",
            "get 200 configmaps ns=default name=c",
            "update 200 configmaps ns=default name=c",
            "get 404 configmaps ns=default name=missing",
            "create 201 apps/deployments ns=default name=d",
            "patch 200 apps/deployments/status ns=default name=d",
            "create 422 apps/deployments ns=default name=e",
            "delete 200 configmaps ns=default name=c",
            "deletecollection 200 configmaps ns=default",
        ]
    );

    // Off: nothing is kept.
    let quiet = start_with(Config {
        audit: false,
        ..Config::default()
    })
    .await;
    let cms: Api<ConfigMap> = Api::namespaced(quiet.client(), "default");
    cms.list(&ListParams::default()).await.unwrap();
    assert!(quiet.audit().is_empty());
}
