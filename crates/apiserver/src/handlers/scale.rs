//! The `scale` subresource of Deployments and StatefulSets (`autoscaling/v1` Scale), which
//! `kubectl scale` reads and writes: `spec.replicas` of the parent, its `status.replicas` and
//! its selector as a string.

use axum::response::Response;
use http::StatusCode;
use serde_json::{Value, json};

use super::smp;
use super::write::{PatchKind, parse_body, parse_patch};
use crate::app::App;
use crate::http_util::{json_response, meta_str};
use crate::request::{Req, Target};
use crate::status::{ApiError, ApiResult, FieldError};
use crate::store::Mutation;

/// The Scale view of a Deployment or StatefulSet.
fn scale_of(obj: &Value) -> Value {
    let meta = &obj["metadata"];
    let mut out_meta = serde_json::Map::new();
    for k in [
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "creationTimestamp",
    ] {
        if let Some(v) = meta.get(k) {
            out_meta.insert(k.into(), v.clone());
        }
    }
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": out_meta,
        "spec": {"replicas": obj["spec"]["replicas"].as_i64().unwrap_or(1)},
        "status": {
            "replicas": obj["status"]["replicas"].as_i64().unwrap_or(0),
            "selector": selector_string(&obj["spec"]["selector"]),
        },
    })
}

/// A label selector as the `key=value,key in (a,b)` string Scale carries.
fn selector_string(sel: &Value) -> String {
    let mut parts: Vec<String> = sel["matchLabels"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default();
    for e in sel["matchExpressions"].as_array().into_iter().flatten() {
        let key = e["key"].as_str().unwrap_or_default();
        let values: Vec<&str> = e["values"]
            .as_array()
            .map(|v| v.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        parts.push(match e["operator"].as_str().unwrap_or_default() {
            "In" => format!("{key} in ({})", values.join(",")),
            "NotIn" => format!("{key} notin ({})", values.join(",")),
            "Exists" => key.to_string(),
            _ => format!("!{key}"),
        });
    }
    parts.join(",")
}

/// `GET .../NAME/scale`.
pub(super) fn get(app: &App, t: &Target) -> ApiResult<Response> {
    let obj = super::read::named(app, t)?;
    Ok(json_response(StatusCode::OK, &scale_of(&obj.value())))
}

/// `PUT .../NAME/scale` (a Scale body) and `PATCH .../NAME/scale` (a patch of the Scale).
pub(super) fn write(app: &App, t: &Target, req: &Req, is_patch: bool) -> ApiResult<Response> {
    let def = t.def();
    let name = t.name.clone().unwrap_or_default();
    let patch = if is_patch {
        Some(parse_patch(req)?)
    } else {
        None
    };
    let body = if is_patch {
        None
    } else {
        Some(parse_body(req)?)
    };
    let committed = app.store.mutate(t.res, &t.key(), req.dry_run(), |cur| {
        let old = cur.ok_or_else(|| ApiError::not_found(def, &name))?;
        let mut scale = scale_of(old);
        match (&patch, &body) {
            (Some(PatchKind::Merge(m)), _) => json_patch::merge(&mut scale, m),
            (Some(PatchKind::Strategic(m)), _) => {
                smp::apply(&mut scale, m).map_err(ApiError::bad_request)?;
            }
            (Some(PatchKind::Json(ops)), _) => json_patch::patch(&mut scale, ops)
                .map_err(|e| ApiError::bad_request(e.to_string()))?,
            (Some(PatchKind::Apply(_)), _) => {
                return Err(ApiError::unsupported_media_type(
                    "apply patches are not supported on the scale subresource",
                ));
            }
            (None, Some(b)) => {
                // Optimistic concurrency as on the main resource.
                if let Some(rv) = meta_str(b, "resourceVersion").filter(|r| !r.is_empty())
                    && meta_str(old, "resourceVersion") != Some(rv)
                {
                    return Err(ApiError::stale(def, &name));
                }
                scale = b.clone();
            }
            (None, None) => return Err(ApiError::internal("scale write without a body")),
        }
        let replicas = &scale["spec"]["replicas"];
        let Some(n) = replicas
            .as_i64()
            .filter(|n| *n >= 0 && *n <= i64::from(i32::MAX))
        else {
            return Err(ApiError::invalid(
                def,
                &name,
                &[FieldError::invalid(
                    "spec.replicas",
                    replicas.clone(),
                    "must be greater than or equal to 0",
                )],
            ));
        };
        let mut new = old.clone();
        new["spec"]["replicas"] = json!(n);
        if new["spec"] != old["spec"] {
            let generation = old["metadata"]["generation"].as_i64().unwrap_or(1) + 1;
            new["metadata"]["generation"] = json!(generation);
        }
        Ok(Mutation::Put(new))
    })?;
    Ok(json_response(StatusCode::OK, &scale_of(&committed.object)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scale_view_carries_replicas_and_the_selector() {
        let set = json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "u", "resourceVersion": "7", "labels": {"x": "y"}},
            "spec": {"replicas": 3, "selector": {
                "matchLabels": {"app": "web"},
                "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}],
            }},
            "status": {"replicas": 2},
        });
        let s = scale_of(&set);
        assert_eq!(s["kind"], "Scale");
        assert_eq!(s["apiVersion"], "autoscaling/v1");
        assert_eq!(s["spec"]["replicas"], 3);
        assert_eq!(s["status"]["replicas"], 2);
        assert_eq!(s["status"]["selector"], "app=web,tier in (a,b)");
        assert_eq!(s["metadata"]["resourceVersion"], "7");
        assert!(s["metadata"].get("labels").is_none());
    }
}
