//! Request routing and the read verbs (get, list). Writes are in `write.rs`, watch in
//! `crate::watch`, discovery in `crate::discovery`.

mod admission;
mod delete;
mod managed;
mod scale;

pub(crate) use scale::has_scale;
mod smp;
mod token;
mod write;

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use bytes::Bytes;
use http::{Method, StatusCode, header};
use serde::Serialize;
use serde_json::{Value, json};
use tracing::Instrument;

use crate::http_util::json_response;
use crate::resources::{self, ResourceDef, ResourceId};
use crate::selectors::{FieldSelector, LabelSelector, Selectors};
use crate::server::App;
use crate::status::{ApiError, ApiResult};
use crate::store::Key;
use crate::{discovery, table, watch};

/// Largest request body accepted (the real server's limit is 3 MiB).
const MAX_BODY: usize = 3 * 1024 * 1024;

/// A parsed request.
#[derive(Debug)]
pub(crate) struct Req {
    pub method: Method,
    pub query: HashMap<String, String>,
    pub accept: String,
    pub content_type: String,
    pub user_agent: String,
    pub body: Bytes,
}

impl Req {
    pub fn param(&self, k: &str) -> Option<&str> {
        self.query
            .get(k)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    pub fn flag(&self, k: &str) -> bool {
        matches!(self.param(k), Some("true" | "1"))
    }

    pub fn wants_table(&self) -> bool {
        self.accept.contains("as=Table")
    }

    pub fn dry_run(&self) -> bool {
        self.param("dryRun").is_some()
    }
}

/// The resource (and maybe object and subresource) a request addresses.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub res: ResourceId,
    pub ns: Option<String>,
    pub name: Option<String>,
    pub sub: Option<String>,
}

impl Target {
    pub fn def(&self) -> &'static ResourceDef {
        resources::get(self.res)
    }

    pub fn key(&self) -> Key {
        (
            self.ns.clone().unwrap_or_default(),
            self.name.clone().unwrap_or_default(),
        )
    }
}

/// The single entry point: every request comes here.
pub(crate) async fn dispatch(State(app): State<Arc<App>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let path = parts.uri.path().to_string();
    // Authentication first, for every path (anonymous auth is off): 401, nothing recorded.
    let user = parts
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(crate::auth::bearer)
        .and_then(|t| app.tokens.authenticate(t, jiff::Timestamp::now()))
        .filter(|(_, bound)| bound.as_ref().is_none_or(|b| token::still_bound(&app, b)))
        .map(|(user, _)| user);
    let Some(user) = user else {
        app.metrics
            .request(parts.method.as_str(), resource_label(&path), 401);
        return ApiError::unauthorized().into_response();
    };
    let query: HashMap<String, String> = parts
        .uri
        .query()
        .and_then(|q| serde_urlencoded::from_str::<Vec<(String, String)>>(q).ok())
        .unwrap_or_default()
        .into_iter()
        .collect();
    let header_str = |h: header::HeaderName| {
        parts
            .headers
            .get(h)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(_) => {
            let e = ApiError::bad_request("the request body is too large (limit 3 MiB)");
            return ApiError {
                code: 413,
                reason: "RequestEntityTooLarge",
                ..e
            }
            .into_response();
        }
    };
    let audit = app
        .config
        .audit
        .then(|| crate::audit::describe(&parts.method, &path, &query))
        .flatten()
        .map(|mut record| {
            if record.verb == "create" && record.name.is_none() {
                // A create names its object in the body, as the real audit log's objectRef does.
                record.name = crate::audit::created_name(&body);
            }
            record
        });
    let req = Req {
        method: parts.method.clone(),
        query,
        accept: header_str(header::ACCEPT),
        content_type: header_str(header::CONTENT_TYPE),
        user_agent: header_str(header::USER_AGENT),
        body,
    };
    let user_agent = if audit.is_some() {
        req.user_agent.clone()
    } else {
        String::new()
    };
    let span = tracing::debug_span!("request", method = %req.method, path = %path);
    let verb = if req.flag("watch") || path.contains("/watch/") {
        "WATCH".to_string()
    } else {
        req.method.to_string()
    };
    let resp = match route(&app, &path, req).instrument(span).await {
        Ok(r) => r,
        Err(e) => {
            tracing::debug!(code = e.code, reason = e.reason, message = %e.message, "request failed");
            e.into_response()
        }
    };
    let code = resp.status().as_u16();
    app.metrics.request(&verb, resource_label(&path), code);
    if let Some(mut record) = audit {
        record.user_agent = user_agent.into();
        record.user = user.name.into();
        record.code = code;
        record.took = record.received.elapsed();
        app.audit.push(record);
    }
    resp
}

/// The resource a path addresses, for metrics ("" for discovery and unknown paths).
fn resource_label(path: &str) -> &'static str {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let (group, version, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return "",
    };
    rest.iter()
        .rev()
        .find_map(|s| resources::find(group, version, s))
        .map_or("", |r| resources::get(r).plural)
}

async fn route(app: &Arc<App>, path: &str, req: Req) -> ApiResult<Response> {
    let segs: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    if let Some(resp) = discovery::serve(app, &segs, &req) {
        return resp;
    }
    let (group, version, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Err(ApiError::unknown_path()),
    };
    let (watch_path, rest) = match rest {
        ["watch", r @ ..] => (true, r),
        r => (false, r),
    };
    let target = parse_target(group, version, rest)?;
    let is_watch = watch_path || req.flag("watch");
    match (&req.method, target.name.is_some(), target.sub.as_deref()) {
        (&Method::GET, false, None) if is_watch => watch::serve(app.clone(), target, req).await,
        (&Method::GET, false, None) => list(app, &target, &req),
        (&Method::POST, false, None) if target.ns.is_some() || !target.def().namespaced => {
            write::create(app, &target, &req)
        }
        (&Method::DELETE, false, None) => delete::delete_collection(app, &target, &req),
        (&Method::GET, true, None | Some("status")) => get(app, &target, &req),
        (&Method::PUT, true, None | Some("status")) => write::update(app, &target, &req),
        (&Method::PATCH, true, None | Some("status")) => write::patch(app, &target, &req),
        (&Method::DELETE, true, None) => delete::delete(app, &target, &req),
        (&Method::POST, true, Some("binding")) => write::bind(app, &target, &req),
        (&Method::POST, true, Some("token")) => token::create(app, &target, &req),
        (&Method::GET, true, Some("scale")) => scale::get(app, &target),
        (&Method::PUT, true, Some("scale")) => scale::write(app, &target, &req, false),
        (&Method::PATCH, true, Some("scale")) => scale::write(app, &target, &req, true),
        (m, ..) => Err(ApiError::method_not_allowed(m.as_str())),
    }
}

fn parse_target(group: &str, version: &str, rest: &[&str]) -> ApiResult<Target> {
    let namespaced_path = rest.len() >= 3
        && rest[0] == "namespaces"
        && resources::find(group, version, rest[2]).is_some_and(|r| resources::get(r).namespaced);
    let (ns, plural, tail) = if namespaced_path {
        (Some(rest[1].to_string()), rest[2], &rest[3..])
    } else {
        match rest.split_first() {
            Some((p, tail)) => (None, *p, tail),
            None => return Err(ApiError::no_route()),
        }
    };
    let res = resources::find(group, version, plural).ok_or_else(ApiError::no_route)?;
    let def = resources::get(res);
    let (name, sub) = match tail {
        [] => (None, None),
        [n] => (Some(n.to_string()), None),
        [n, s] => (Some(n.to_string()), Some(s.to_string())),
        _ => return Err(ApiError::no_route()),
    };
    // A namespaced object is only addressable inside its namespace.
    if def.namespaced && ns.is_none() && name.is_some() {
        return Err(ApiError::no_route());
    }
    match sub.as_deref() {
        None => {}
        Some("status") if def.status => {}
        Some("binding") if def.plural == "pods" && def.group.is_empty() => {}
        Some("token") if def.plural == "serviceaccounts" && def.group.is_empty() => {}
        Some("scale") if scale::has_scale(def) => {}
        Some(_) => return Err(ApiError::no_route()),
    }
    Ok(Target { res, ns, name, sub })
}

pub(crate) fn selectors(def: &ResourceDef, req: &Req) -> ApiResult<Selectors> {
    // kube-apiserver answers the selectors' own errors, unprefixed.
    let labels = LabelSelector::parse(req.param("labelSelector").unwrap_or(""))
        .map_err(ApiError::bad_request)?;
    let fields = FieldSelector::parse(req.param("fieldSelector").unwrap_or(""), def)
        .map_err(ApiError::bad_request)?;
    Ok(Selectors { labels, fields })
}

pub(crate) fn rv_of(obj: &Value) -> u64 {
    crate::http_util::meta_str(obj, "resourceVersion")
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// Parses a resourceVersion parameter the way the real server does (400 when not a number).
pub(crate) fn parse_rv(s: &str) -> ApiResult<u64> {
    s.parse::<u64>().map_err(|_| {
        ApiError::bad_request(format!(
            "invalid resource version \"{s}\": strconv.ParseUint: parsing \"{s}\": invalid syntax"
        ))
    })
}

fn get(app: &App, t: &Target, req: &Req) -> ApiResult<Response> {
    let def = t.def();
    let name = t.name.as_deref().unwrap_or("");
    let obj = app
        .store
        .get(t.res, &t.key())
        .ok_or_else(|| ApiError::not_found(def, name))?;
    if req.wants_table() {
        let rv = rv_of(&obj).to_string();
        let t = table::build(
            def,
            std::slice::from_ref(&obj),
            json!({"resourceVersion": rv}),
            req,
            true,
        );
        return Ok(json_response(StatusCode::OK, &t));
    }
    Ok(json_response(StatusCode::OK, &obj))
}

#[derive(Serialize)]
struct ContinueToken {
    rv: u64,
    ns: String,
    name: String,
}

fn encode_continue(rv: u64, key: &Key) -> String {
    let t = ContinueToken {
        rv,
        ns: key.0.clone(),
        name: key.1.clone(),
    };
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(serde_json::to_vec(&t).unwrap_or_default())
}

fn decode_continue(s: &str) -> ApiResult<(u64, Key)> {
    let bad = || ApiError::bad_request(format!("continue key is not valid: {s}"));
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(s)
        .map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&bytes).map_err(|_| bad())?;
    let rv = v["rv"].as_u64().ok_or_else(bad)?;
    let ns = v["ns"].as_str().ok_or_else(bad)?.to_string();
    let name = v["name"].as_str().ok_or_else(bad)?.to_string();
    Ok((rv, (ns, name)))
}

#[derive(Serialize)]
struct ListOut<'a> {
    kind: String,
    #[serde(rename = "apiVersion")]
    api_version: String,
    metadata: Value,
    items: Vec<&'a Value>,
}

/// The objects a list request selects, already paged, plus the list metadata.
pub(crate) fn select_list(app: &App, t: &Target, req: &Req) -> ApiResult<(Vec<Arc<Value>>, Value)> {
    let def = t.def();
    let sel = selectors(def, req)?;
    let limit: usize = match req.param("limit") {
        Some(l) => l
            .parse::<i64>()
            .map_err(|_| ApiError::bad_request(format!("invalid limit \"{l}\"")))?
            .max(0) as usize,
        None => 0,
    };
    let current = app.store.current_rv();
    let (at, start) = match req.param("continue") {
        Some(c) => {
            if req.param("resourceVersion").is_some_and(|rv| rv != "0") {
                return Err(ApiError::bad_request(
                    "specifying resource version is not allowed when using continue",
                ));
            }
            let (rv, key) = decode_continue(c)?;
            (Some(rv), Some(key))
        }
        None => {
            let rv_param = req.param("resourceVersion");
            let exact = req.param("resourceVersionMatch") == Some("Exact");
            match rv_param {
                None | Some("0") => (None, None),
                Some(s) => {
                    let rv = parse_rv(s)?;
                    if rv > current {
                        return Err(ApiError::too_large_rv(rv, current));
                    }
                    (if exact { Some(rv) } else { None }, None)
                }
            }
        }
    };
    let (list_rv, objects) = app.store.list(t.res, t.ns.as_deref(), at, start.as_ref()).map_err(|compacted| {
        if start.is_some() {
            ApiError::gone("The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.")
        } else {
            ApiError::gone(format!(
                "too old resource version: {} ({compacted})",
                at.unwrap_or_default()
            ))
        }
    })?;
    let pinned = sel.fields.pinned_name().map(str::to_string);
    let mut selected = objects.into_iter().filter(|o| {
        pinned
            .as_deref()
            .is_none_or(|n| crate::http_util::name(o) == n)
            && sel.matches(o)
    });
    let mut items: Vec<Arc<Value>> = Vec::new();
    let mut meta = json!({"resourceVersion": list_rv.to_string()});
    if limit > 0 {
        items.extend(selected.by_ref().take(limit));
        let rest = selected.count();
        if rest > 0 {
            if let Some(last) = items.last() {
                meta["continue"] = json!(encode_continue(list_rv, &crate::store::key_of(last)));
                if sel.labels.is_empty() && sel.fields.is_empty() {
                    meta["remainingItemCount"] = json!(rest);
                }
            }
        }
    } else {
        items.extend(selected);
    }
    Ok((items, meta))
}

fn list(app: &App, t: &Target, req: &Req) -> ApiResult<Response> {
    let def = t.def();
    let (items, meta) = select_list(app, t, req)?;
    if req.wants_table() {
        return Ok(json_response(
            StatusCode::OK,
            &table::build(def, &items, meta, req, true),
        ));
    }
    let out = ListOut {
        kind: format!("{}List", def.kind),
        api_version: def.api_version(),
        metadata: meta,
        items: items.iter().map(|a| a.as_ref()).collect(),
    };
    let bytes = serde_json::to_vec(&out).map_err(|e| ApiError::internal(e.to_string()))?;
    let mut resp = Response::new(Body::from(bytes));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_like_the_real_paths() {
        let t = parse_target("", "v1", &["namespaces", "default", "pods", "p", "status"]).unwrap();
        assert_eq!(t.def().plural, "pods");
        assert_eq!(t.ns.as_deref(), Some("default"));
        assert_eq!(t.sub.as_deref(), Some("status"));
        let t = parse_target("", "v1", &["namespaces", "default"]).unwrap();
        assert_eq!(t.def().plural, "namespaces");
        assert_eq!(t.name.as_deref(), Some("default"));
        let t = parse_target("", "v1", &["namespaces", "x", "status"]).unwrap();
        assert_eq!(t.sub.as_deref(), Some("status"));
        let t = parse_target("storage.k8s.io", "v1", &["volumeattachments"]).unwrap();
        assert!(t.name.is_none());
        assert!(parse_target("", "v1", &["pods", "p"]).is_err());
        assert!(parse_target("", "v1", &["deployments"]).is_err());
        assert!(parse_target("", "v1", &["secrets"]).is_ok());
        assert!(parse_target("", "v1", &["namespaces", "d", "secrets", "s", "status"]).is_err());
        assert!(parse_target("", "v1", &["namespaces", "d", "nodes"]).is_err());
    }

    #[test]
    fn continue_tokens_round_trip() {
        let k = ("ns".to_string(), "name".to_string());
        let tok = encode_continue(42, &k);
        assert_eq!(decode_continue(&tok).unwrap(), (42, k));
        assert_eq!(decode_continue("garbage!").unwrap_err().code, 400);
    }
}
