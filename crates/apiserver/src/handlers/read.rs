//! The read verbs: get and list (with paging by continue token and Table output).

use std::sync::Arc;

use axum::body::Body;
use axum::response::Response;
use base64::Engine;
use http::{StatusCode, header};
use serde::Serialize;
use serde_json::{Value, json};

use crate::app::App;
use crate::http_util::json_response;
use crate::request::{Req, Target, parse_rv, selectors};
use crate::status::{ApiError, ApiResult};
use crate::store::{Key, Stored};
use crate::table;

/// The object a request names, or the real server's 404 for it.
pub(super) fn named(app: &App, t: &Target) -> ApiResult<Arc<Stored>> {
    app.store
        .get(t.res, &t.key())
        .ok_or_else(|| ApiError::not_found(t.def(), t.name.as_deref().unwrap_or("")))
}

pub(super) fn get(app: &App, t: &Target, req: &Req) -> ApiResult<Response> {
    let def = t.def();
    let obj = named(app, t)?;
    if req.wants_table() {
        let rv = obj.rv().to_string();
        let t = table::build(
            def,
            &[obj.value()],
            json!({"resourceVersion": rv}),
            req,
            true,
        );
        return Ok(json_response(StatusCode::OK, &t));
    }
    Ok(json_response(StatusCode::OK, &*obj))
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
    items: Vec<&'a Stored>,
}

/// The objects a list request selects, already paged, plus the list metadata.
pub(super) fn select_list(
    app: &App,
    t: &Target,
    req: &Req,
) -> ApiResult<(Vec<Arc<Stored>>, Value)> {
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
        pinned.as_deref().is_none_or(|n| o.name() == n)
            && sel
                .by_key(o.namespace(), o.name())
                .unwrap_or_else(|| sel.matches(&o.value()))
    });
    let mut items: Vec<Arc<Stored>> = Vec::new();
    let mut meta = json!({"resourceVersion": list_rv.to_string()});
    if limit > 0 {
        items.extend(selected.by_ref().take(limit));
        let rest = selected.count();
        if rest > 0 {
            if let Some(last) = items.last() {
                meta["continue"] = json!(encode_continue(list_rv, last.key()));
                if sel.is_empty() {
                    meta["remainingItemCount"] = json!(rest);
                }
            }
        }
    } else {
        items.extend(selected);
    }
    Ok((items, meta))
}

pub(super) fn list(app: &App, t: &Target, req: &Req) -> ApiResult<Response> {
    let def = t.def();
    let (items, meta) = select_list(app, t, req)?;
    if req.wants_table() {
        let values: Vec<Value> = items.iter().map(|o| o.value()).collect();
        return Ok(json_response(
            StatusCode::OK,
            &table::build(def, &values, meta, req, true),
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
    fn continue_tokens_round_trip() {
        let k = ("ns".to_string(), "name".to_string());
        let tok = encode_continue(42, &k);
        assert_eq!(decode_continue(&tok).unwrap(), (42, k));
        assert_eq!(decode_continue("garbage!").unwrap_err().code, 400);
    }
}
