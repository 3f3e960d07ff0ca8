//! Shared helpers for the integration tests: a server per test and raw HTTP requests.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use apiserver::{ApiServer, Config, RunningApiServer};
use http_body_util::BodyExt;
use serde_json::Value;

pub async fn start() -> RunningApiServer {
    start_with(Config::default()).await
}

pub async fn start_with(config: Config) -> RunningApiServer {
    ApiServer::start(config).await.expect("server starts")
}

pub fn small_window(window: usize) -> Config {
    Config {
        event_window: window,
        ..Config::default()
    }
}

pub fn fast_bookmarks() -> Config {
    Config {
        bookmark_interval: Duration::from_millis(200),
        ..Config::default()
    }
}

/// One raw request: (status code, parsed JSON body or the text as a JSON string).
pub async fn raw(
    server: &RunningApiServer,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = http::Request::builder().method(method).uri(path);
    if let Some(ct) = content_type {
        req = req.header("content-type", ct);
    }
    let bytes = body
        .map(|b| serde_json::to_vec(&b).unwrap())
        .unwrap_or_default();
    let req = req.body(kube::client::Body::from(bytes)).unwrap();
    let resp = server.client().send(req).await.expect("request sent");
    let code = resp.status().as_u16();
    let data = resp.into_body().collect().await.unwrap().to_bytes();
    let v = serde_json::from_slice(&data)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&data).into_owned()));
    (code, v)
}

/// The `Status` of a failed kube-rs call.
pub fn api_err<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> Box<kube::core::Status> {
    match r {
        Err(kube::Error::Api(s)) => s,
        other => panic!("expected an API error, got {other:?}"),
    }
}
