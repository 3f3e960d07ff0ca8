//! The delete verbs: delete (finalizers, graceful pod deletion, preconditions), the namespace
//! cascade, and deletecollection.

use axum::response::Response;
use http::StatusCode;
use serde_json::{Value, json};

use super::read::select_list;
use super::write::finalizers;
use crate::app::App;
use crate::http_util::{json_response, meta_mut, meta_str};
use crate::request::{Req, Target};
use crate::resources::{self, ResourceDef};
use crate::status::{ApiError, ApiResult};
use crate::store::{EventType, Mutation};

/// DeleteOptions from the body and the query, as the real server merges them.
struct DeleteOpts {
    uid: Option<String>,
    rv: Option<String>,
    grace: Option<i64>,
}

fn delete_opts(req: &Req) -> ApiResult<DeleteOpts> {
    let body: Value = if req.body.iter().all(u8::is_ascii_whitespace) {
        json!({})
    } else {
        serde_json::from_slice(&req.body)
            .map_err(|e| ApiError::bad_request(format!("error decoding DeleteOptions: {e}")))?
    };
    let s = |v: &Value| v.as_str().filter(|s| !s.is_empty()).map(str::to_string);
    let grace =
        match req.param("gracePeriodSeconds") {
            Some(g) => Some(g.parse::<i64>().map_err(|_| {
                ApiError::bad_request(format!("invalid gracePeriodSeconds \"{g}\""))
            })?),
            None => body["gracePeriodSeconds"].as_i64(),
        };
    Ok(DeleteOpts {
        uid: s(&body["preconditions"]["uid"]),
        rv: s(&body["preconditions"]["resourceVersion"]),
        grace,
    })
}

/// Decides what deleting `old` does: remove it, or mark it and wait (finalizers, grace).
fn prepare_delete(
    app: &App,
    def: &ResourceDef,
    old: &Value,
    opts: &DeleteOpts,
) -> ApiResult<Mutation> {
    let name = crate::http_util::name(old).to_string();
    if let Some(uid) = &opts.uid {
        let cur = meta_str(old, "uid").unwrap_or("");
        if uid != cur {
            return Err(ApiError::conflict(
                def,
                &name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {cur}"
                ),
            ));
        }
    }
    if let Some(rv) = &opts.rv {
        let cur = meta_str(old, "resourceVersion").unwrap_or("");
        if rv != cur {
            return Err(ApiError::conflict(
                def,
                &name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {cur}"
                ),
            ));
        }
    }
    // Pods on a node are deleted gracefully: the kubelet (here: whoever plays it) confirms
    // with a delete of grace period 0 once the containers and volumes are gone.
    let is_pod = def.group.is_empty() && def.plural == "pods";
    let phase = old["status"]["phase"].as_str().unwrap_or("");
    let on_node = old["spec"]["nodeName"]
        .as_str()
        .is_some_and(|n| !n.is_empty());
    let grace = if is_pod
        && app.config.graceful_pod_deletion
        && on_node
        && phase != "Succeeded"
        && phase != "Failed"
    {
        opts.grace
            .or_else(|| old["spec"]["terminationGracePeriodSeconds"].as_i64())
            .unwrap_or(30)
            .max(0)
    } else {
        0
    };
    let has_finalizers = !finalizers(old).is_empty();
    if grace == 0 && !has_finalizers {
        return Ok(Mutation::Delete(old.clone()));
    }
    let pending = old["metadata"]["deletionGracePeriodSeconds"].as_i64();
    if pending.is_some_and(|p| p <= grace) {
        // Already being deleted at least as soon as asked: nothing changes.
        return Ok(Mutation::Unchanged);
    }
    // First delete, or a shorter grace period that moves the deadline closer.
    let mut new = old.clone();
    let meta = meta_mut(&mut new);
    let deadline = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(grace);
    meta.insert(
        "deletionTimestamp".into(),
        json!(deadline.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()),
    );
    meta.insert("deletionGracePeriodSeconds".into(), json!(grace));
    Ok(Mutation::Put(new))
}

fn success_status(def: &ResourceDef, obj: &Value) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {
            "name": crate::http_util::name(obj),
            "group": def.group,
            "kind": def.plural,
            "uid": meta_str(obj, "uid").unwrap_or(""),
        }
    })
}

pub(super) fn delete(app: &App, t: &Target, req: &Req) -> ApiResult<Response> {
    let def = t.def();
    let opts = delete_opts(req)?;
    let name = t.name.clone().unwrap_or_default();
    let committed = app.store.mutate(t.res, &t.key(), req.dry_run(), |cur| {
        let old = cur.ok_or_else(|| ApiError::not_found(def, &name))?;
        prepare_delete(app, def, old, &opts)
    })?;
    if committed.kind == Some(EventType::Deleted) {
        if t.res == app.namespaces && !req.dry_run() {
            delete_namespace_contents(app, &name);
        }
        return Ok(json_response(
            StatusCode::OK,
            &success_status(def, &committed.object),
        ));
    }
    // Still there (finalizers or a grace period): the real server answers with the object.
    Ok(json_response(StatusCode::OK, &committed.object))
}

/// The namespace controller's job, done at once: everything in a deleted namespace is deleted
/// (objects with finalizers are marked and go when their finalizers do).
fn delete_namespace_contents(app: &App, ns: &str) {
    let opts = DeleteOpts {
        uid: None,
        rv: None,
        grace: Some(0),
    };
    for (res, def) in resources::RESOURCES
        .iter()
        .enumerate()
        .filter(|(_, d)| d.namespaced)
    {
        let Ok((_, objs)) = app.store.list(res, Some(ns), None, None) else {
            continue;
        };
        for o in objs {
            let key = o.key();
            let r = app.store.mutate(res, key, false, |cur| match cur {
                Some(old) => prepare_delete(app, def, old, &opts),
                None => Ok(Mutation::Unchanged),
            });
            if let Err(e) = r {
                tracing::warn!(namespace = ns, name = %key.1, error = %e.message, "deleting namespace content failed");
            }
        }
    }
}

pub(super) fn delete_collection(app: &App, t: &Target, req: &Req) -> ApiResult<Response> {
    let def = t.def();
    let opts = delete_opts(req)?;
    let (items, _) = select_list(app, t, req)?;
    let mut out: Vec<Value> = Vec::new();
    for o in items {
        let r = app
            .store
            .mutate(t.res, o.key(), req.dry_run(), |cur| match cur {
                Some(old) => prepare_delete(app, def, old, &opts),
                None => Ok(Mutation::Unchanged),
            });
        match r {
            Ok(c) => out.push(c.object),
            // Gone meanwhile: nothing to delete, as the real server skips it.
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    let list = json!({
        "kind": format!("{}List", def.kind),
        "apiVersion": def.api_version(),
        "metadata": {"resourceVersion": app.store.current_rv().to_string()},
        "items": out,
    });
    Ok(json_response(StatusCode::OK, &list))
}
