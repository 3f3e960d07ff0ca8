//! The TokenRequest subresource of ServiceAccounts (`POST
//! /api/v1/namespaces/NS/serviceaccounts/NAME/token`), as kube-apiserver v1.26 serves it: the
//! account must exist, `spec.expirationSeconds` (default 3600) is at least 10 minutes and at
//! most 2^32 seconds, no audiences means the API server's own, and a `boundObjectRef` names a
//! Pod (running as that account) or a Secret of the namespace, whose uid must match when given.
//! The answer is the request with those fields filled in and `status.token` /
//! `status.expirationTimestamp`; the token is a bearer credential of this server
//! (`crate::auth::Tokens::issue`) for `system:serviceaccount:NS:NAME` until it expires.
//!
//! Unlike kube-apiserver's, the token is an opaque random string (not a signed JWT), and there
//! is no TokenReview API to check it with: it is only good against this server.

use axum::response::Response;
use http::StatusCode;
use serde_json::{Value, json};

use super::write::parse_body;
use crate::app::App;
use crate::auth::{API_AUDIENCES, BoundToken};
use crate::http_util::{json_response, meta_str};
use crate::request::{Req, Target};
use crate::resources;
use crate::status::{ApiError, ApiResult, FieldError};

const GROUP: &str = "authentication.k8s.io";
const KIND: &str = "TokenRequest";
/// What `spec.expirationSeconds` defaults to.
const DEFAULT_EXPIRATION: i64 = 3600;
const MIN_EXPIRATION: i64 = 600;
const MAX_EXPIRATION: i64 = 1 << 32;

/// `POST .../serviceaccounts/NAME/token`.
pub(super) fn create(app: &App, t: &Target, req: &Req) -> ApiResult<Response> {
    let ns = t.ns.clone().unwrap_or_default();
    let name = t.name.clone().unwrap_or_default();
    let mut body = parse_body(req)?;
    check_type(&body)?;
    if let Some(n) = meta_str(&body, "name").filter(|n| !n.is_empty() && *n != name) {
        let e = FieldError::invalid(
            "metadata.name",
            json!(n),
            "must match the service account name if specified",
        );
        return Err(ApiError::invalid_kind(GROUP, KIND, &name, &[e]));
    }
    if let Some(n) = meta_str(&body, "namespace").filter(|n| !n.is_empty() && *n != ns) {
        let e = FieldError::invalid(
            "metadata.namespace",
            json!(n),
            "must match the service account namespace if specified",
        );
        return Err(ApiError::invalid_kind(GROUP, KIND, &name, &[e]));
    }
    let sa = super::read::named(app, t)?;
    let sa_uid = sa.uid().unwrap_or_default().to_string();

    let spec = body
        .get("spec")
        .cloned()
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}));
    let expiration = match spec.get("expirationSeconds") {
        None | Some(Value::Null) => DEFAULT_EXPIRATION,
        Some(v) => v.as_i64().ok_or_else(|| {
            ApiError::bad_request(format!(
                "TokenRequest in version \"v1\" cannot be handled as a TokenRequest: spec.expirationSeconds: {v} is not an integer"
            ))
        })?,
    };
    let mut audiences: Vec<String> = match spec.get("audiences") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| {
                v.as_str().map(str::to_string).ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "TokenRequest in version \"v1\" cannot be handled as a TokenRequest: spec.audiences: {v} is not a string"
                    ))
                })
            })
            .collect::<ApiResult<_>>()?,
        Some(v) => {
            return Err(ApiError::bad_request(format!(
                "TokenRequest in version \"v1\" cannot be handled as a TokenRequest: spec.audiences: {v} is not an array"
            )));
        }
    };
    if audiences.is_empty() {
        audiences = API_AUDIENCES.iter().map(|a| a.to_string()).collect();
    }

    let mut errs = Vec::new();
    if expiration < MIN_EXPIRATION {
        errs.push(FieldError::invalid(
            "spec.expirationSeconds",
            json!(expiration),
            "may not specify a duration less than 10 minutes",
        ));
    }
    if expiration > MAX_EXPIRATION {
        errs.push(FieldError::invalid(
            "spec.expirationSeconds",
            json!(expiration),
            "may not specify a duration larger than 2^32 seconds",
        ));
    }
    if !errs.is_empty() {
        return Err(ApiError::invalid_kind(GROUP, KIND, "", &errs));
    }

    let bound_object = match spec.get("boundObjectRef") {
        None | Some(Value::Null) => None,
        Some(r) => Some(bound_object(app, &ns, &name, r)?),
    };

    let now = jiff::Timestamp::now();
    let expires = now
        .checked_add(jiff::SignedDuration::from_secs(expiration))
        .map_err(|e| ApiError::internal(format!("token expiration: {e}")))?;
    let token = app.tokens.issue(BoundToken {
        expires,
        audiences: audiences.clone(),
        namespace: ns.clone(),
        service_account: name.clone(),
        service_account_uid: sa_uid,
        bound: bound_object.clone(),
    });

    let mut out_spec = spec;
    out_spec["audiences"] = json!(audiences);
    out_spec["expirationSeconds"] = json!(expiration);
    if let Some((kind, obj_name, uid)) = &bound_object {
        let r = &mut out_spec["boundObjectRef"];
        r["kind"] = json!(kind);
        r["apiVersion"] = json!("v1");
        r["name"] = json!(obj_name);
        r["uid"] = json!(uid);
    }
    let meta = crate::http_util::meta_mut(&mut body);
    meta.insert("name".into(), json!(name));
    meta.insert("namespace".into(), json!(ns));
    // The real server stamps the request (it stores nothing); managedFields, which it also
    // adds, are left out as on every object here not written by server-side apply.
    meta.insert(
        "creationTimestamp".into(),
        json!(now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()),
    );
    body["apiVersion"] = json!(format!("{GROUP}/v1"));
    body["kind"] = json!(KIND);
    body["spec"] = out_spec;
    body["status"] = json!({
        "token": token,
        "expirationTimestamp": expires.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
    });
    Ok(json_response(StatusCode::CREATED, &body))
}

/// `apiVersion`/`kind`, when the body gives them, must be a TokenRequest.
fn check_type(body: &Value) -> ApiResult<()> {
    let av = body.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let kind = body.get("kind").and_then(Value::as_str).unwrap_or("");
    if (av.is_empty() || av == "authentication.k8s.io/v1") && (kind.is_empty() || kind == KIND) {
        return Ok(());
    }
    Err(ApiError::bad_request(format!(
        "the API version in the data ({av}) does not match the expected API version (authentication.k8s.io/v1)"
    )))
}

/// The object a token is bound to, checked as kube-apiserver checks it: (kind, name, uid).
fn bound_object(app: &App, ns: &str, sa: &str, r: &Value) -> ApiResult<(String, String, String)> {
    let kind = r.get("kind").and_then(Value::as_str).unwrap_or("");
    let api_version = r.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let obj_name = r.get("name").and_then(Value::as_str).unwrap_or("");
    let want_uid = r.get("uid").and_then(Value::as_str).unwrap_or("");
    let plural = match (api_version, kind) {
        ("v1", "Pod") => "pods",
        ("v1", "Secret") => "secrets",
        _ => {
            let group_version = if api_version.contains('/') {
                api_version.to_string()
            } else {
                format!("/{api_version}")
            };
            return Err(ApiError::bad_request(format!(
                "cannot bind token to object of type {group_version}, Kind={kind}"
            )));
        }
    };
    let res = resources::find("", "v1", plural)
        .ok_or_else(|| ApiError::internal(format!("{plural} are not served")))?;
    let obj = app
        .store
        .get(res, &(ns.to_string(), obj_name.to_string()))
        .ok_or_else(|| ApiError::not_found(resources::get(res), obj_name))?
        .value();
    if kind == "Pod" {
        let runs_as = obj["spec"]["serviceAccountName"].as_str().unwrap_or("");
        if runs_as != sa {
            return Err(ApiError::bad_request(format!(
                "cannot bind token for serviceaccount \"{sa}\" to pod running with different serviceaccount name."
            )));
        }
    }
    let uid = meta_str(&obj, "uid").unwrap_or_default().to_string();
    if !want_uid.is_empty() && want_uid != uid {
        return Err(ApiError::conflict_on(
            "",
            kind,
            obj_name,
            &format!(
                "the UID in the bound object reference ({want_uid}) does not match the UID in record. The object might have been deleted and then recreated"
            ),
        ));
    }
    Ok((kind.to_string(), obj_name.to_string(), uid))
}

/// Whether the objects an issued token depends on are still there: its ServiceAccount and the
/// object it is bound to, with the uids they had when it was issued.
pub(super) fn still_bound(app: &App, b: &BoundToken) -> bool {
    let exists = |plural: &str, name: &str, uid: &str| {
        resources::find("", "v1", plural)
            .and_then(|res| app.store.get(res, &(b.namespace.clone(), name.to_string())))
            .is_some_and(|o| o.uid() == Some(uid))
    };
    exists(
        "serviceaccounts",
        &b.service_account,
        &b.service_account_uid,
    ) && b.bound.as_ref().is_none_or(|(kind, name, uid)| {
        let plural = if kind == "Pod" { "pods" } else { "secrets" };
        exists(plural, name, uid)
    })
}
