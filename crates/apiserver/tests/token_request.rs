//! The TokenRequest subresource (`serviceaccounts/NAME/token`) against apiserver-lite and the
//! real kube-apiserver v1.26, with the same assertions: the answer's shape, the defaults
//! (audiences, expiration), the errors (a missing account, a too short or too long expiration,
//! bound objects that are missing, renamed or of another kind), and what the token is worth:
//! it authenticates as `system:serviceaccount:NS:NAME` for the API server's audience only, and
//! a token bound to a pod stops working once the pod is gone.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "common/manifests.rs"]
mod manifests;
#[path = "common/target.rs"]
mod target;

use std::time::Duration;

use http_body_util::BodyExt;
use serde_json::{Value, json};
use target::{Server, Target};

const NS: &str = "tokens";
/// kube-apiserver's `--api-audiences` default is its issuer; the harness's and kubeadm's.
const API_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";

async fn send(
    client: &kube::Client,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = http::Request::builder().method(method).uri(path);
    if body.is_some() {
        req = req.header("content-type", "application/json");
    }
    let bytes = body
        .map(|b| serde_json::to_vec(&b).unwrap())
        .unwrap_or_default();
    let resp = client
        .send(req.body(kube::client::Body::from(bytes)).unwrap())
        .await
        .expect("request sent");
    let code = resp.status().as_u16();
    let data = resp.into_body().collect().await.unwrap().to_bytes();
    let v = serde_json::from_slice(&data)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&data).into_owned()));
    (code, v)
}

fn token_path(sa: &str) -> String {
    format!("/api/v1/namespaces/{NS}/serviceaccounts/{sa}/token")
}

fn token_request(spec: Value) -> Value {
    json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec})
}

async fn create(client: &kube::Client, path: &str, obj: Value) -> Value {
    let (code, v) = send(client, "POST", path, Some(obj)).await;
    assert_eq!(code, 201, "POST {path}: {v}");
    v
}

/// Whom `token` authenticates as: `Some(user)` (from the audit log on apiserver-lite, which
/// authorizes everything; from the 403 on kube-apiserver, where the account has no RBAC),
/// `None` on a 401.
async fn who(target: &Target, token: &str) -> Option<String> {
    let client = target.client_with_token(token).await;
    let path = format!("/api/v1/namespaces/{NS}/configmaps/whoami-probe");
    let (code, v) = send(&client, "GET", &path, None).await;
    match (code, &target.server) {
        (401, _) => None,
        (404, Server::Lite(s)) => {
            let rec = s
                .audit()
                .into_iter()
                .rev()
                .find(|r| r.name.as_deref() == Some("whoami-probe"))
                .expect("the probe was audited");
            Some(rec.user.to_string())
        }
        (403, Server::Real(_)) => {
            let msg = v["message"].as_str().unwrap();
            let user = msg
                .strip_prefix("configmaps \"whoami-probe\" is forbidden: User \"")
                .and_then(|m| m.split('"').next())
                .unwrap_or_else(|| panic!("unexpected 403: {msg}"));
            Some(user.to_string())
        }
        (code, _) => panic!("{}: GET {path} with a token: {code} {v}", target.name()),
    }
}

fn kubectl_path() -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("kubectl"))
        .find(|p| p.is_file())
}

/// The scenario, asserted the same against either server.
async fn scenario(target: &Target) {
    let Some(kubectl_bin) = kubectl_path() else {
        test_support::skip_or_fail("no kubectl on PATH (scripts/setup installs it)");
        return;
    };
    let admin = target.client();
    create(
        &admin,
        "/api/v1/namespaces",
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}),
    )
    .await;
    target.prepare_namespace(NS).await;
    for sa in ["app", "other"] {
        create(
            &admin,
            &format!("/api/v1/namespaces/{NS}/serviceaccounts"),
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa}}),
        )
        .await;
    }
    // No nodeName: the real server deletes such a pod at once (nothing to wait for).
    let pod = create(
        &admin,
        &format!("/api/v1/namespaces/{NS}/pods"),
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"serviceAccountName": "app",
                "containers": [{"name": "c", "image": "busybox"}]}}),
    )
    .await;
    let pod_uid = pod["metadata"]["uid"].as_str().unwrap().to_string();

    // Errors: code, reason, message.
    let errors: Vec<(&str, &str, Value, u16, &str, String)> = vec![
        (
            "a missing account",
            "nobody",
            token_request(json!({})),
            404,
            "NotFound",
            "serviceaccounts \"nobody\" not found".into(),
        ),
        (
            "expiration under 10 minutes",
            "app",
            token_request(json!({"expirationSeconds": 599})),
            422,
            "Invalid",
            "TokenRequest.authentication.k8s.io \"\" is invalid: spec.expirationSeconds: Invalid value: 599: may not specify a duration less than 10 minutes".into(),
        ),
        (
            "expiration over 2^32 s",
            "app",
            token_request(json!({"expirationSeconds": 4_294_967_297_i64})),
            422,
            "Invalid",
            "TokenRequest.authentication.k8s.io \"\" is invalid: spec.expirationSeconds: Invalid value: 4294967297: may not specify a duration larger than 2^32 seconds".into(),
        ),
        (
            "a bound pod that does not exist",
            "app",
            token_request(
                json!({"boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "gone"}}),
            ),
            404,
            "NotFound",
            "pods \"gone\" not found".into(),
        ),
        (
            "a bound pod whose uid is another",
            "app",
            token_request(json!({"boundObjectRef": {"kind": "Pod", "apiVersion": "v1",
                "name": "p", "uid": "0c4e2e59-0000-0000-0000-000000000000"}})),
            409,
            "Conflict",
            "Operation cannot be fulfilled on Pod \"p\": the UID in the bound object reference (0c4e2e59-0000-0000-0000-000000000000) does not match the UID in record. The object might have been deleted and then recreated".into(),
        ),
        (
            "a bound pod that runs as another account",
            "other",
            token_request(
                json!({"boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "p"}}),
            ),
            400,
            "BadRequest",
            "cannot bind token for serviceaccount \"other\" to pod running with different serviceaccount name.".into(),
        ),
        (
            "a bound ConfigMap",
            "app",
            token_request(
                json!({"boundObjectRef": {"kind": "ConfigMap", "apiVersion": "v1", "name": "p"}}),
            ),
            400,
            "BadRequest",
            "cannot bind token to object of type /v1, Kind=ConfigMap".into(),
        ),
    ];
    let mut wrong = Vec::new();
    for (what, sa, body, code, reason, message) in errors {
        let (got, v) = send(&admin, "POST", &token_path(sa), Some(body)).await;
        if got != code || v["reason"] != reason || v["message"] != message.as_str() {
            wrong.push(format!(
                "{what}: want {code} {reason} {message:?}, got {got} {} {}",
                v["reason"], v["message"]
            ));
        }
    }
    assert!(wrong.is_empty(), "{}:\n{}", target.name(), wrong.join("\n"));

    // Defaults: the API server's audience, one hour.
    let before = jiff::Timestamp::now();
    let tr = create(&admin, &token_path("app"), token_request(json!({}))).await;
    assert_eq!(tr["kind"], "TokenRequest", "{tr}");
    assert_eq!(tr["apiVersion"], "authentication.k8s.io/v1", "{tr}");
    assert_eq!(tr["metadata"]["name"], "app", "{tr}");
    assert_eq!(tr["metadata"]["namespace"], NS, "{tr}");
    let created: jiff::Timestamp = tr["metadata"]["creationTimestamp"]
        .as_str()
        .unwrap_or_else(|| panic!("creationTimestamp: {tr}"))
        .parse()
        .unwrap();
    assert!(created.duration_since(before).as_secs() < 60, "{tr}");
    assert!(
        tr["status"]["token"]
            .as_str()
            .is_some_and(|t| t.len() >= 32),
        "{tr}"
    );
    assert_eq!(tr["spec"]["audiences"], json!([API_AUDIENCE]), "{tr}");
    assert_eq!(tr["spec"]["expirationSeconds"], 3600, "{tr}");
    let expires: jiff::Timestamp = tr["status"]["expirationTimestamp"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let lifetime = expires.duration_since(before).as_secs();
    assert!((3598..=3660).contains(&lifetime), "{lifetime}s: {tr}");
    let token = tr["status"]["token"].as_str().unwrap().to_string();
    assert_eq!(
        who(target, &token).await.as_deref(),
        Some("system:serviceaccount:tokens:app"),
        "{}",
        target.name()
    );
    assert_eq!(who(target, "not-a-token").await, None);

    // Another audience: the token is for someone else, not for the API server.
    let tr = create(
        &admin,
        &token_path("app"),
        token_request(json!({"audiences": ["vault"], "expirationSeconds": 600})),
    )
    .await;
    assert_eq!(tr["spec"]["audiences"], json!(["vault"]), "{tr}");
    assert_eq!(tr["spec"]["expirationSeconds"], 600, "{tr}");
    let vault = tr["status"]["token"].as_str().unwrap().to_string();
    assert_eq!(who(target, &vault).await, None, "{}", target.name());

    // kubectl create token posts protobuf; its output is the token.
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    target.write_kubeconfig(&kubeconfig);
    // (tokio's Command: apiserver-lite serves on this test's runtime.)
    let kubectl = async |args: &[&str]| {
        let out = tokio::process::Command::new(&kubectl_bin)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg("--cache-dir")
            .arg(dir.path().join("cache"))
            .args(["-n", NS, "create", "token", "app"])
            .args(args)
            .output()
            .await
            .expect("kubectl runs");
        assert!(
            out.status.success(),
            "{}: kubectl create token app {args:?}: {}",
            target.name(),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    let from_kubectl = kubectl(&["--duration", "10m"]).await;
    assert_eq!(
        who(target, &from_kubectl).await.as_deref(),
        Some("system:serviceaccount:tokens:app")
    );
    let for_vault = kubectl(&["--audience", "vault"]).await;
    assert_eq!(who(target, &for_vault).await, None);

    // Bound to the pod: echoed back, and worthless once the pod is gone.
    let tr = create(
        &admin,
        &token_path("app"),
        token_request(json!({"audiences": [API_AUDIENCE, "vault"],
            "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "p", "uid": pod_uid}})),
    )
    .await;
    assert_eq!(
        tr["spec"]["boundObjectRef"],
        json!({"kind": "Pod", "apiVersion": "v1", "name": "p", "uid": pod_uid}),
        "{tr}"
    );
    let bound = tr["status"]["token"].as_str().unwrap().to_string();
    assert_eq!(
        who(target, &bound).await.as_deref(),
        Some("system:serviceaccount:tokens:app")
    );
    let (code, v) = send(
        &admin,
        "DELETE",
        &format!("/api/v1/namespaces/{NS}/pods/p"),
        None,
    )
    .await;
    assert_eq!(code, 200, "{v}");
    // kube-apiserver reads the pod through a cache: give it a moment.
    test_support::eventually(
        "the pod-bound token to stop working",
        Duration::from_secs(30),
        || async { who(target, &bound).await.is_none().then_some(()) },
    )
    .await;
    assert_eq!(
        who(target, &token).await.as_deref(),
        Some("system:serviceaccount:tokens:app"),
        "the unbound token still works"
    );
}

#[tokio::test]
async fn token_request_apiserver_lite() {
    let target = Target::lite().await;
    scenario(&target).await;
}

#[tokio::test]
async fn token_request_real_kube_apiserver() {
    let Some(target) = Target::real().await else {
        return;
    };
    scenario(&target).await;
}
