//! The write verbs: create, update (main and status), patch, delete (finalizers, graceful pod
//! deletion, preconditions), deletecollection and pod binding.

use axum::response::Response;
use http::StatusCode;
use rand::Rng;
use serde_json::{Map, Value, json};

use super::{managed, smp};
use crate::app::App;
use crate::http_util::{json_response, meta_mut, meta_str, now_rfc3339};
use crate::request::{Req, Target};
use crate::resources::{self, ResourceDef};
use crate::status::{ApiError, ApiResult, FieldError};
use crate::store::{Mutation, key_of};
use crate::validation;

/// Metadata the server owns: kept from the stored object on every update.
const SERVER_META: &[&str] = &[
    "uid",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generation",
    "name",
    "namespace",
];

pub(super) fn parse_body(req: &Req) -> ApiResult<Value> {
    let ct = req.content_type.split(';').next().unwrap_or("").trim();
    if ct == "application/vnd.kubernetes.protobuf" {
        // kubectl's `create <generator>` commands post protobuf.
        return crate::protobuf::decode(&req.body).map_err(|e| {
            ApiError::unsupported_media_type(format!(
                "the body of the request was in an unknown format ({ct}): {e} - accepted media types include: application/json"
            ))
        });
    }
    if !ct.is_empty() && ct != "application/json" && ct != "*/*" {
        return Err(ApiError::unsupported_media_type(format!(
            "the body of the request was in an unknown format ({ct}) - accepted media types include: application/json"
        )));
    }
    let v: Value = serde_json::from_slice(&req.body).map_err(|e| {
        ApiError::bad_request(format!("couldn't get version/kind; json parse error: {e}"))
    })?;
    if !v.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    Ok(v)
}

/// Checks `apiVersion`/`kind` against the endpoint and fills them in when missing.
fn check_type(def: &ResourceDef, obj: &mut Value) -> ApiResult<()> {
    let want_av = def.api_version();
    if let Some(av) = obj
        .get("apiVersion")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
    {
        if av != want_av {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({av}) does not match the expected API version ({want_av})"
            )));
        }
    }
    if let Some(kind) = obj
        .get("kind")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
    {
        if kind != def.kind {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({kind}) does not match the expected kind ({})",
                def.kind
            )));
        }
    }
    if let Some(m) = obj.as_object_mut() {
        m.insert("apiVersion".into(), json!(want_av));
        m.insert("kind".into(), json!(def.kind));
    }
    Ok(())
}

/// The request namespace wins; a different one in the body is a 400, as in the real server.
fn settle_namespace(def: &ResourceDef, t: &Target, obj: &mut Value) -> ApiResult<()> {
    let meta = meta_mut(obj);
    if !def.namespaced {
        meta.remove("namespace");
        return Ok(());
    }
    let req_ns = t.ns.clone().unwrap_or_default();
    match meta.get("namespace").and_then(Value::as_str).unwrap_or("") {
        "" => {
            meta.insert("namespace".into(), json!(req_ns));
        }
        ns if ns == req_ns => {}
        _ => {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
    }
    Ok(())
}

fn random_suffix() -> String {
    // The real server's alphabet: no vowels (no words) and no confusable characters.
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    (0..5)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

pub(super) fn finalizers(obj: &Value) -> Vec<String> {
    obj.get("metadata")
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

fn being_deleted(obj: &Value) -> bool {
    meta_str(obj, "deletionTimestamp").is_some()
}

fn ensure_namespace(app: &App, def: &ResourceDef, t: &Target, name: &str) -> ApiResult<()> {
    let Some(ns) = t.ns.as_deref().filter(|_| def.namespaced) else {
        return Ok(());
    };
    let ns_res = app.namespaces;
    match app.store.get(ns_res, &(String::new(), ns.to_string())) {
        None => Err(ApiError::namespace_not_found(ns)),
        Some(n) if being_deleted(&n.value()) => Err(ApiError::forbidden(
            def,
            name,
            &format!(
                "unable to create new content in namespace {ns} because it is being terminated"
            ),
        )),
        Some(_) => Ok(()),
    }
}

pub(super) fn create(app: &App, t: &Target, req: &Req) -> ApiResult<Response> {
    let def = t.def();
    let mut obj = parse_body(req)?;
    check_type(def, &mut obj)?;
    // Field ownership is the server's to record (only server-side apply records it here).
    meta_mut(&mut obj).remove("managedFields");
    commit_create(app, t, req, obj)
}

/// Settles server fields, defaults and validates a new object, then stores it.
fn commit_create(app: &App, t: &Target, req: &Req, mut obj: Value) -> ApiResult<Response> {
    let def = t.def();
    settle_namespace(def, t, &mut obj)?;
    let meta = meta_mut(&mut obj);
    if meta
        .get("resourceVersion")
        .and_then(Value::as_str)
        .is_some_and(|s| !s.is_empty())
    {
        // kube-apiserver's storage refuses it: a 500 without a reason, as there.
        return Err(ApiError::storage(
            "resourceVersion should not be set on objects to be created",
        ));
    }
    let name = meta
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let name = if name.is_empty() {
        match meta
            .get("generateName")
            .and_then(Value::as_str)
            .filter(|g| !g.is_empty())
        {
            Some(prefix) => format!("{prefix}{}", random_suffix()),
            None => String::new(),
        }
    } else {
        name
    };
    meta.insert("name".into(), json!(name));
    meta.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
    meta.insert("creationTimestamp".into(), json!(now_rfc3339()));
    // Only the kinds whose spec a controller follows carry a generation (as in v1.26).
    if tracks_generation(def) {
        meta.insert("generation".into(), json!(1));
    } else {
        meta.remove("generation");
    }
    for k in [
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "selfLink",
    ] {
        meta.remove(k);
    }
    // Status is the controllers' to write; on create it starts empty (nodes and namespaces
    // may carry status on create, as in the real server).
    if def.status && def.plural != "nodes" && def.plural != "namespaces" {
        if let Some(m) = obj.as_object_mut() {
            m.remove("status");
        }
    }
    check_quantities(def, &obj)?;
    if def.group == "apps" && def.plural == "daemonsets" {
        // A new DaemonSet's template is generation 1, whatever the client sent.
        obj["metadata"]["annotations"][validation::DS_TEMPLATE_GENERATION] = json!("1");
    }
    validation::apply_defaults(def, &mut obj);
    super::admission::on_create(app, def, &mut obj);
    let errs = validation::validate_create(def, &obj);
    if !errs.is_empty() {
        return Err(ApiError::invalid(def, &name, &errs));
    }
    ensure_namespace(app, def, t, &name)?;
    let key = key_of(&obj);
    let committed = app
        .store
        .mutate(t.res, &key, req.dry_run(), |cur| match cur {
            Some(_) => Err(ApiError::already_exists(def, &name)),
            None => Ok(Mutation::Put(obj)),
        })?;
    Ok(json_response(StatusCode::CREATED, &committed.object))
}

/// Builds the object an update of `old` to `body` stores, for the main resource or `/status`.
fn prepare_update(
    def: &ResourceDef,
    old: &Value,
    mut body: Value,
    status_only: bool,
) -> ApiResult<Mutation> {
    let name = crate::http_util::name(old).to_string();
    if let Some(uid) = meta_str(&body, "uid").filter(|u| !u.is_empty()) {
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
    if let Some(rv) = meta_str(&body, "resourceVersion").filter(|r| !r.is_empty()) {
        if meta_str(old, "resourceVersion") != Some(rv) {
            return Err(ApiError::stale(def, &name));
        }
    }
    let mut new = if status_only {
        // A status write changes status only (labels, finalizers and spec stay as stored).
        let mut new = old.clone();
        let status = body.as_object_mut().and_then(|m| m.remove("status"));
        if let Some(m) = new.as_object_mut() {
            match status {
                Some(s) => m.insert("status".into(), s),
                None => m.remove("status"),
            };
        }
        new
    } else {
        let old_meta = old
            .get("metadata")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let meta = meta_mut(&mut body);
        for k in SERVER_META {
            match old_meta.get(*k) {
                Some(v) => meta.insert((*k).to_string(), v.clone()),
                None => meta.remove(*k),
            };
        }
        if def.status {
            if let Some(m) = body.as_object_mut() {
                match old.get("status") {
                    Some(s) => m.insert("status".into(), s.clone()),
                    None => m.remove("status"),
                };
            }
        }
        body
    };
    meta_mut(&mut new).insert(
        "resourceVersion".into(),
        json!(meta_str(old, "resourceVersion").unwrap_or("")),
    );
    validation::apply_defaults(def, &mut new);
    if new == *old {
        // The real server does not write (nor bump resourceVersion) for a no-op update.
        return Ok(Mutation::Unchanged);
    }
    let mut errs = validation::validate_update(def, old, &new);
    if being_deleted(old) {
        let before = finalizers(old);
        let added: Vec<String> = finalizers(&new)
            .into_iter()
            .filter(|f| !before.contains(f))
            .collect();
        if !added.is_empty() {
            let list: Vec<String> = added.iter().map(|f| format!("\"{f}\"")).collect();
            errs.push(FieldError::forbidden(
                "metadata.finalizers",
                format!(
                    "no new finalizers can be added if the object is being deleted, found new finalizers []string{{{}}}",
                    list.join(", ")
                ),
            ));
        }
    }
    if !errs.is_empty() {
        return Err(ApiError::invalid(def, &name, &errs));
    }
    if !status_only && tracks_generation(def) && spec_changed(old, &new) {
        let g = old["metadata"]["generation"].as_i64().unwrap_or(1);
        meta_mut(&mut new).insert("generation".into(), json!(g + 1));
    }
    if !status_only && def.group == "apps" && def.plural == "daemonsets" {
        // The template generation counts the pod template's changes, whatever the client sent.
        let key = validation::DS_TEMPLATE_GENERATION;
        let was = old["metadata"]["annotations"][key]
            .as_str()
            .and_then(|g| g.parse::<i64>().ok())
            .unwrap_or(1);
        let bump = i64::from(old["spec"]["template"] != new["spec"]["template"]);
        new["metadata"]["annotations"][key] = json!((was + bump).to_string());
    }
    let grace_pending = new["metadata"]["deletionGracePeriodSeconds"]
        .as_i64()
        .unwrap_or(0)
        > 0;
    if being_deleted(&new) && finalizers(&new).is_empty() && !grace_pending {
        return Ok(Mutation::PutThenDelete(new));
    }
    Ok(Mutation::Put(new))
}

/// Whether objects of `def` carry `metadata.generation`: the apps workloads; kube-apiserver
/// v1.26 sets none on the other kinds served here (pods, volumes, storage, RBAC, leases).
fn tracks_generation(def: &ResourceDef) -> bool {
    def.group == "apps"
}

/// Whether anything outside metadata and status changed (what bumps metadata.generation).
fn spec_changed(old: &Value, new: &Value) -> bool {
    let strip = |v: &Value| -> Map<String, Value> {
        let mut m = v.as_object().cloned().unwrap_or_default();
        m.remove("metadata");
        m.remove("status");
        m
    };
    strip(old) != strip(new)
}

fn check_url_identity(t: &Target, body: &Value) -> ApiResult<()> {
    let name = t.name.as_deref().unwrap_or("");
    let body_name = meta_str(body, "name").unwrap_or("");
    if !body_name.is_empty() && body_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    if let (Some(ns), Some(bns)) = (t.ns.as_deref(), meta_str(body, "namespace")) {
        if !bns.is_empty() && bns != ns {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
    }
    Ok(())
}

fn answer_write(committed: crate::store::Committed) -> Response {
    json_response(StatusCode::OK, &committed.object)
}

/// A body whose quantities do not parse is refused as kube-apiserver's decoder refuses it.
fn check_quantities(def: &ResourceDef, obj: &Value) -> ApiResult<()> {
    if validation::quantities_ok(def, obj) {
        return Ok(());
    }
    Err(ApiError::bad_request(format!(
        "{kind} in version \"{v}\" cannot be handled as a {kind}: {msg}",
        kind = def.kind,
        v = def.version,
        msg = validation::QUANTITY_MSG
    )))
}

pub(super) fn update(app: &App, t: &Target, req: &Req) -> ApiResult<Response> {
    let def = t.def();
    let mut body = parse_body(req)?;
    check_quantities(def, &body)?;
    check_type(def, &mut body)?;
    check_url_identity(t, &body)?;
    let name = t.name.clone().unwrap_or_default();
    let status_only = t.sub.as_deref() == Some("status");
    let manager = manager(req);
    let committed = app.store.mutate(t.res, &t.key(), req.dry_run(), |cur| {
        let old = cur.ok_or_else(|| ApiError::not_found(def, &name))?;
        managed::track_update(def, old, &mut body, &manager);
        prepare_update(def, old, body, status_only)
    })?;
    Ok(answer_write(committed))
}

pub(super) enum PatchKind {
    Merge(Value),
    Json(json_patch::Patch),
    Strategic(Value),
    Apply(Value),
}

/// The field manager of a write: `fieldManager`, else the client's name from its User-Agent.
fn manager(req: &Req) -> String {
    if let Some(m) = req.param("fieldManager") {
        return m.to_string();
    }
    let ua = req.user_agent.split('/').next().unwrap_or("").trim();
    if ua.is_empty() {
        "unknown".to_string()
    } else {
        ua.to_string()
    }
}

pub(super) fn parse_patch(req: &Req) -> ApiResult<PatchKind> {
    let ct = req.content_type.split(';').next().unwrap_or("").trim();
    match ct {
        "application/merge-patch+json" => {
            let v: Value = serde_json::from_slice(&req.body)
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
            Ok(PatchKind::Merge(v))
        }
        "application/json-patch+json" => {
            let p: json_patch::Patch = serde_json::from_slice(&req.body)
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
            Ok(PatchKind::Json(p))
        }
        "application/strategic-merge-patch+json" => {
            let v: Value = serde_json::from_slice(&req.body)
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
            if !v.is_object() {
                return Err(ApiError::bad_request(
                    "a strategic merge patch must be a JSON object",
                ));
            }
            Ok(PatchKind::Strategic(v))
        }
        "application/apply-patch+yaml" => {
            // JSON is YAML; kubectl and kube-rs send JSON, people send YAML.
            let v: Value = match serde_json::from_slice(&req.body) {
                Ok(v) => v,
                Err(_) => {
                    let text = std::str::from_utf8(&req.body).map_err(|e| {
                        ApiError::bad_request(format!("error decoding apply patch: {e}"))
                    })?;
                    serde_saphyr::from_str(text)
                        .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?
                }
            };
            if !v.is_object() {
                return Err(ApiError::bad_request("an apply patch must be an object"));
            }
            Ok(PatchKind::Apply(v))
        }
        // kube-apiserver's answer to a patch of another type, word for word.
        _ => Err(ApiError::unsupported_media_type(
            "415: Unsupported Media Type",
        )),
    }
}

pub(super) fn patch(app: &App, t: &Target, req: &Req) -> ApiResult<Response> {
    let def = t.def();
    let p = parse_patch(req)?;
    let name = t.name.clone().unwrap_or_default();
    let status_only = t.sub.as_deref() == Some("status");
    let manager = manager(req);
    if let PatchKind::Apply(applied) = &p {
        return server_side_apply(app, t, req, applied, status_only);
    }
    let committed = app.store.mutate(t.res, &t.key(), req.dry_run(), |cur| {
        let old = cur.ok_or_else(|| ApiError::not_found(def, &name))?;
        let mut doc: Value = old.clone();
        match &p {
            PatchKind::Merge(m) => json_patch::merge(&mut doc, m),
            // As the real server: a JSON patch that fails to apply (a failed `test` op, a
            // missing path) is 422 Invalid without a kind, which kubectl prints as
            // "The request is invalid: ...".
            PatchKind::Json(ops) => json_patch::patch(&mut doc, ops).map_err(|e| ApiError {
                code: 422,
                reason: "Invalid",
                // kube-apiserver v1.26's message; the cause says what failed.
                message: "the server rejected our request due to an error in our request".into(),
                details: Some(json!({"causes": [{"reason": "FieldValueInvalid", "message": e.to_string(), "field": "patch"}]})),
            })?,
            PatchKind::Strategic(sp) => smp::apply(&mut doc, sp).map_err(ApiError::bad_request)?,
            PatchKind::Apply(_) => return Err(ApiError::internal("apply is handled above")),
        }
        if !doc.is_object() {
            return Err(ApiError::bad_request("the patched object must be a JSON object"));
        }
        if !validation::quantities_ok(def, &doc) {
            // The real server decodes the patched object and names it whole in a 422.
            let message = format!(
                " \"\" is invalid: patch: Invalid value: {}: {}",
                json!(doc.to_string()),
                validation::QUANTITY_MSG
            );
            return Err(ApiError {
                code: 422,
                reason: "Invalid",
                message: message.clone(),
                details: Some(json!({"causes": [{"reason": "FieldValueInvalid", "message": message, "field": "patch"}]})),
            });
        }
        check_type(def, &mut doc)?;
        check_url_identity(t, &doc)?;
        managed::track_update(def, old, &mut doc, &manager);
        prepare_update(def, old, doc, status_only)
    })?;
    Ok(answer_write(committed))
}

/// Server-side apply: creates the object when missing, otherwise merges the applied
/// configuration with field-ownership conflicts (see `managed.rs`).
fn server_side_apply(
    app: &App,
    t: &Target,
    req: &Req,
    applied: &Value,
    status_only: bool,
) -> ApiResult<Response> {
    let def = t.def();
    let name = t.name.clone().unwrap_or_default();
    let Some(manager) = req.param("fieldManager").map(str::to_string) else {
        return Err(ApiError {
            code: 422,
            reason: "Invalid",
            message: "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch".into(),
            details: Some(json!({"group": "meta.k8s.io", "kind": "PatchOptions", "causes": [{"reason": "FieldValueRequired", "message": "Required value: is required for apply patch", "field": "fieldManager"}]})),
        });
    };
    let force = req.flag("force");
    let mut applied = applied.clone();
    check_type(def, &mut applied)?;
    check_url_identity(t, &applied)?;
    if let Some(m) = applied.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("managedFields");
        m.remove("resourceVersion");
    }
    if app.store.get(t.res, &t.key()).is_none() {
        let mut obj = managed::apply(def, None, &applied, &manager, force)?;
        meta_mut(&mut obj).insert("name".into(), json!(name));
        return commit_create(app, t, req, obj);
    }
    let committed = app.store.mutate(t.res, &t.key(), req.dry_run(), |cur| {
        let old = cur.ok_or_else(|| ApiError::not_found(def, &name))?;
        let new = managed::apply(def, Some(old), &applied, &manager, force)?;
        prepare_update(def, old, new, status_only)
    })?;
    Ok(answer_write(committed))
}

/// `POST pods/NAME/binding`: the scheduler's way to set `spec.nodeName`.
pub(super) fn bind(app: &App, t: &Target, req: &Req) -> ApiResult<Response> {
    let def = t.def();
    let body = parse_body(req)?;
    let node = body["target"]["name"].as_str().unwrap_or("").to_string();
    let name = t.name.clone().unwrap_or_default();
    if node.is_empty() {
        return Err(ApiError::invalid(
            resources::get(t.res),
            &name,
            &[FieldError::required("target.name", "")],
        ));
    }
    app.store.mutate(t.res, &t.key(), req.dry_run(), |cur| {
        let old = cur.ok_or_else(|| ApiError::not_found(def, &name))?;
        let current = old["spec"]["nodeName"].as_str().unwrap_or("");
        if !current.is_empty() {
            return Err(ApiError::conflict(
                def,
                &name,
                &format!("pod {name} is already assigned to node \"{current}\""),
            ));
        }
        let mut new = old.clone();
        new["spec"]["nodeName"] = json!(node);
        Ok(Mutation::Put(new))
    })?;
    Ok(json_response(
        StatusCode::CREATED,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
    ))
}
