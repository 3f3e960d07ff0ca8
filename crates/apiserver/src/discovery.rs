//! Discovery: `/version`, `/api`, `/api/v1`, `/apis`, `/apis/G`, `/apis/G/V`, health checks.
//!
//! Aggregated discovery (`Accept: ...;as=APIGroupDiscoveryList`) is declined the way servers
//! before 1.26 decline it: the plain document with `Content-Type: application/json`, which
//! client-go recognises and then walks the per-group documents. OpenAPI is not served (404), which
//! kubectl tolerates: it then validates nothing client-side and sends objects as they are.

use axum::response::{IntoResponse, Response};
use http::{Method, StatusCode};
use serde_json::{Value, json};

use crate::app::App;
use crate::http_util::json_response;
use crate::request::Req;
use crate::resources::{self, RESOURCES};
use crate::status::{ApiError, ApiResult};

/// The Kubernetes version this server claims (the API it mirrors is 1.34's).
pub(crate) const MAJOR: &str = "1";
pub(crate) const MINOR: &str = "34";

const VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

fn version() -> Value {
    json!({
        "major": MAJOR,
        "minor": MINOR,
        "gitVersion": format!("v{MAJOR}.{MINOR}.0-apiserver-lite"),
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-01-01T00:00:00Z",
        "goVersion": "go1.24.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

fn group_doc(group: &str) -> Value {
    let gv = format!("{group}/v1");
    json!({
        "name": group,
        "versions": [{"groupVersion": gv, "version": "v1"}],
        "preferredVersion": {"groupVersion": gv, "version": "v1"},
    })
}

fn resource_list(group: &str, version: &str) -> Option<Value> {
    let mut out = Vec::new();
    for r in RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        let mut doc = json!({
            "name": r.plural,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": VERBS,
        });
        if !r.short_names.is_empty() {
            doc["shortNames"] = json!(r.short_names);
        }
        if !r.categories.is_empty() {
            doc["categories"] = json!(r.categories);
        }
        out.push(doc);
        if r.status {
            out.push(json!({
                "name": format!("{}/status", r.plural),
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
        if crate::resources::has_scale(r) {
            out.push(json!({
                "name": format!("{}/scale", r.plural),
                "singularName": "",
                "namespaced": r.namespaced,
                "group": "autoscaling",
                "version": "v1",
                "kind": "Scale",
                "verbs": ["get", "patch", "update"],
            }));
        }
        if r.group.is_empty() && r.plural == "pods" {
            out.push(json!({
                "name": "pods/binding",
                "singularName": "",
                "namespaced": true,
                "kind": "Binding",
                "verbs": ["create"],
            }));
        }
        if r.group.is_empty() && r.plural == "serviceaccounts" {
            out.push(json!({
                "name": "serviceaccounts/token",
                "singularName": "",
                "namespaced": true,
                "group": "authentication.k8s.io",
                "version": "v1",
                "kind": "TokenRequest",
                "verbs": ["create"],
            }));
        }
    }
    if out.is_empty() {
        return None;
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": gv,
        "resources": out,
    }))
}

fn openapi_v2_empty(req: &Req) -> Response {
    if req.accept.contains("protobuf") {
        let mut r = Response::new(axum::body::Body::empty());
        r.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static(
                "application/com.github.proto-openapi.spec.v2.v1.0+protobuf",
            ),
        );
        return r;
    }
    json_response(
        StatusCode::OK,
        &json!({"swagger": "2.0", "info": {"title": "Kubernetes", "version": format!("v{MAJOR}.{MINOR}.0")}, "paths": {}, "definitions": {}}),
    )
}

fn ok(v: &Value) -> ApiResult<Response> {
    Ok(json_response(StatusCode::OK, v))
}

/// Answers discovery and health paths; `None` for everything else.
pub(crate) fn serve(app: &App, segs: &[&str], req: &Req) -> Option<ApiResult<Response>> {
    let read = req.method == Method::GET || req.method == Method::HEAD;
    let answer = match segs {
        ["version"] => ok(&version()),
        ["healthz" | "livez" | "readyz", ..] => Ok((StatusCode::OK, "ok").into_response()),
        ["metrics"] => {
            let text = app
                .metrics
                .render(app.store.watcher_count(), app.store.current_rv());
            let mut r = Response::new(axum::body::Body::from(text));
            r.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            Ok(r)
        }
        // An empty OpenAPI v2 document (zero protobuf bytes): kubectl's client-side validation
        // finds no schema for the kind and skips it, as for any type it has no schema for.
        ["openapi", "v2"] => Ok(openapi_v2_empty(req)),
        ["openapi", ..] | ["swagger.json"] | ["swaggerapi", ..] => Err(ApiError::unknown_path()),
        ["api"] => ok(&json!({
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": app.addr.to_string()}],
        })),
        ["apis"] => ok(&json!({
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": resources::groups().iter().map(|g| group_doc(g)).collect::<Vec<_>>(),
        })),
        ["apis", g] => {
            if resources::groups().contains(g) {
                let mut doc = group_doc(g);
                doc["kind"] = json!("APIGroup");
                doc["apiVersion"] = json!("v1");
                ok(&doc)
            } else {
                Err(ApiError::no_route())
            }
        }
        ["api", v] => match resource_list("", v) {
            Some(doc) => ok(&doc),
            None => Err(ApiError::no_route()),
        },
        ["apis", g, v] => match resource_list(g, v) {
            Some(doc) => ok(&doc),
            None => Err(ApiError::no_route()),
        },
        [] => ok(&json!({"paths": ["/api", "/api/v1", "/apis", "/healthz", "/version"]})),
        _ => return None,
    };
    if !read {
        return Some(Err(ApiError::method_not_allowed(req.method.as_str())));
    }
    Some(answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_lists_carry_subresources_and_short_names() {
        let core = resource_list("", "v1").unwrap();
        let names: Vec<&str> = core["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        assert!(names.contains(&"pods/status"));
        assert!(names.contains(&"persistentvolumes/status"));
        assert!(!names.contains(&"secrets/status"));
        let pvc = core["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "persistentvolumeclaims")
            .unwrap();
        assert_eq!(pvc["shortNames"], json!(["pvc"]));
        assert_eq!(pvc["namespaced"], true);
        let storage = resource_list("storage.k8s.io", "v1").unwrap();
        assert_eq!(storage["groupVersion"], "storage.k8s.io/v1");
        let apps = resource_list("apps", "v1").unwrap();
        let names: Vec<&str> = apps["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            vec![
                "deployments",
                "deployments/status",
                "deployments/scale",
                "daemonsets",
                "daemonsets/status",
                "statefulsets",
                "statefulsets/status",
                "statefulsets/scale"
            ]
        );
        assert_eq!(apps["resources"][0]["shortNames"], json!(["deploy"]));
        assert_eq!(apps["resources"][0]["categories"], json!(["all"]));
        assert!(resource_list("batch", "v1").is_none());
    }
}
