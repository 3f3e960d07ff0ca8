//! The single entry point of every request: authentication, routing to a verb, metrics and the
//! audit record. Reads are in `read.rs`, writes in `write.rs`, watch in `crate::watch`,
//! discovery in `crate::discovery`; what a request asks for is parsed in `crate::request`.

mod admission;
mod delete;
mod managed;
mod read;
mod scale;

mod smp;
mod token;
mod write;

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use http::{Method, header};
use tracing::Instrument;

use crate::app::App;
use crate::request::{Req, parse_target};
use crate::resources;
use crate::status::{ApiError, ApiResult};
use crate::{discovery, watch};

/// Largest request body accepted (the real server's limit is 3 MiB).
const MAX_BODY: usize = 3 * 1024 * 1024;

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
        (&Method::GET, false, None) => read::list(app, &target, &req),
        (&Method::POST, false, None) if target.ns.is_some() || !target.def().namespaced => {
            write::create(app, &target, &req)
        }
        (&Method::DELETE, false, None) => delete::delete_collection(app, &target, &req),
        (&Method::GET, true, None | Some("status")) => read::get(app, &target, &req),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_name_the_resource_a_path_addresses() {
        assert_eq!(resource_label("/api/v1/namespaces/d/pods/p/status"), "pods");
        assert_eq!(
            resource_label("/apis/storage.k8s.io/v1/volumeattachments"),
            "volumeattachments"
        );
        assert_eq!(resource_label("/apis"), "");
    }
}
