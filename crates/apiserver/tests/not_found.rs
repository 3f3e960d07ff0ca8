//! Paths that name nothing, answered as kube-apiserver answers them: a `Status` (NotFound,
//! 404) for an unknown resource under a served group/version (go-restful's 404, with empty
//! `details`) and for any other unknown path (the not-found handler, no `details`); the
//! `{"paths": [...]}` index only at `/`.
// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{api_err, raw, start};
use kube::api::{Api, ApiResource, DynamicObject, ListParams, PostParams};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};

const MESSAGE: &str = "the server could not find the requested resource";

fn status(details: bool) -> Value {
    let mut v = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": MESSAGE,
        "reason": "NotFound",
        "code": 404,
    });
    if details {
        v["details"] = json!({});
    }
    v
}

#[tokio::test]
async fn unknown_resources_under_served_group_versions_are_a_not_found_status() {
    let server = start().await;
    let paths = [
        "/apis/storage.k8s.io/v1/foos",
        "/apis/storage.k8s.io/v1/foos/x",
        "/apis/storage.k8s.io/v1/watch/foos",
        "/apis/storage.k8s.io/v1/foos?watch=true",
        "/apis/storage.k8s.io/v1/namespaces/default/foos",
        "/api/v1/nonexistents",
        "/api/v1/namespaces/default/nonexistents",
        "/api/v1/namespaces/default/nonexistents/x",
        // A known resource with a subresource it does not have.
        "/api/v1/namespaces/default/pods/p/foo",
        // A served group at a version it does not serve, and a group that is not served.
        "/apis/storage.k8s.io/v9/csidrivers",
        "/apis/batch/v1/jobs",
    ];
    for path in paths {
        for method in ["GET", "POST", "DELETE"] {
            let body = (method == "POST").then(|| json!({}));
            let ct = body.as_ref().map(|_| "application/json");
            let (code, got) = raw(&server, method, path, ct, body).await;
            assert_eq!(code, 404, "{method} {path}: {got}");
            assert_eq!(got, status(true), "{method} {path}");
        }
    }
}

#[tokio::test]
async fn kube_rs_sees_not_found_for_an_unknown_kind() {
    let server = start().await;
    let foo = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("storage.k8s.io", "v1", "Foo"),
        "foos",
    );
    let all: Api<DynamicObject> = Api::all_with(server.client(), &foo);
    let e = api_err(all.list(&ListParams::default()).await);
    assert_eq!(
        (e.code, e.reason.as_str(), e.message.as_str()),
        (404, "NotFound", MESSAGE)
    );
    let e = api_err(all.get("x").await);
    assert_eq!((e.code, e.reason.as_str()), (404, "NotFound"));

    let core = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("", "v1", "Nonexistent"),
        "nonexistents",
    );
    let ns: Api<DynamicObject> = Api::namespaced_with(server.client(), "default", &core);
    let obj = DynamicObject::new("n", &core).within("default");
    let e = api_err(ns.create(&PostParams::default(), &obj).await);
    assert_eq!(
        (e.code, e.reason.as_str(), e.message.as_str()),
        (404, "NotFound", MESSAGE)
    );
}

#[tokio::test]
async fn the_root_lists_paths_and_other_unknown_paths_are_a_bare_not_found_status() {
    let server = start().await;
    let (code, root) = raw(&server, "GET", "/", None, None).await;
    assert_eq!(code, 200);
    let paths: Vec<&str> = root["paths"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    assert!(
        paths.contains(&"/api") && paths.contains(&"/apis"),
        "{root}"
    );
    assert_eq!(root.as_object().unwrap().len(), 1, "{root}");

    for path in [
        "/nothing",
        "/nothing/at/all",
        "/swagger.json",
        "/openapi/v9",
    ] {
        let (code, got) = raw(&server, "GET", path, None, None).await;
        assert_eq!(code, 404, "{path}: {got}");
        assert_eq!(got, status(false), "{path}");
    }
}
