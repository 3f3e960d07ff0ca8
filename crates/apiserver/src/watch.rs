//! Watch: a chunked stream of JSON lines `{"type":"ADDED","object":{...}}`, resumable from a
//! resourceVersion, with bookmarks, `timeoutSeconds`, `sendInitialEvents` and Table output.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderValue, header};
use serde::Serialize;
use serde_json::json;
use tokio::sync::mpsc;

use crate::app::App;
use crate::request::{Req, Target, parse_rv, selectors};
use crate::resources::ResourceDef;
use crate::status::{ApiError, ApiResult, FieldError};
use crate::store::{Event, EventType, Stored, WatchFilter, WatchStart};
use crate::table;

/// Without `timeoutSeconds` a watch ends after the real server's default minimum request timeout.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1800);

#[derive(Serialize)]
struct Line<'a, T: ?Sized> {
    #[serde(rename = "type")]
    kind: &'a str,
    object: &'a T,
}

/// One line; a stored object goes in as its text ([`crate::store::Stored`] serializes verbatim).
fn encode<T: Serialize + ?Sized>(kind: &str, object: &T) -> Bytes {
    let mut v = serde_json::to_vec(&Line { kind, object }).unwrap_or_default();
    v.push(b'\n');
    Bytes::from(v)
}

/// Serializes events for one watcher: selector transitions, Table rows, bookmarks.
struct Encoder {
    def: &'static ResourceDef,
    filter: WatchFilter,
    table: Option<Req>,
    sent_columns: bool,
    min_rv: u64,
    last_rv: u64,
}

impl Encoder {
    fn line(&mut self, kind: EventType, obj: &Stored) -> Bytes {
        match &self.table {
            Some(req) => {
                let rv = obj.rv().to_string();
                let t = table::build(
                    self.def,
                    &[obj.value()],
                    json!({"resourceVersion": rv}),
                    req,
                    !self.sent_columns,
                );
                self.sent_columns = true;
                encode(kind.as_str(), &t)
            }
            None => encode(kind.as_str(), obj),
        }
    }

    /// The line for one stored event, or `None` when this watcher must not see it.
    fn event(&mut self, ev: &Event) -> Option<Bytes> {
        if ev.rv <= self.min_rv {
            return None;
        }
        let now = self.filter.matches(&ev.object);
        let before = ev.old.as_deref().is_some_and(|o| self.filter.matches(o));
        // A change that moves an object into or out of the selection is ADDED or DELETED for
        // this watcher, as the real server's filtered watches report it.
        let kind = match ev.kind {
            EventType::Added if now => EventType::Added,
            EventType::Modified if now && before => EventType::Modified,
            EventType::Modified if now => EventType::Added,
            EventType::Modified if before => EventType::Deleted,
            EventType::Deleted if now || before => EventType::Deleted,
            _ => return None,
        };
        self.last_rv = self.last_rv.max(ev.rv);
        Some(self.line(kind, &ev.object))
    }

    fn bookmark(&self, rv: u64, initial_end: bool) -> Bytes {
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let obj =
            json!({"kind": self.def.kind, "apiVersion": self.def.api_version(), "metadata": meta});
        encode("BOOKMARK", &obj)
    }
}

fn error_line(e: &ApiError) -> Bytes {
    encode("ERROR", &e.to_status())
}

pub(crate) async fn serve(app: Arc<App>, t: Target, req: Req) -> ApiResult<Response> {
    let def = t.def();
    let sel = selectors(def, &req)?;
    let bookmarks = req.flag("allowWatchBookmarks");
    let initial_events = req.flag("sendInitialEvents");
    let rv_param = req.param("resourceVersion").map(str::to_string);
    if initial_events {
        let mut errs = Vec::new();
        if !bookmarks {
            errs.push(FieldError::forbidden(
                "allowWatchBookmarks",
                "allowWatchBookmarks required when sendInitialEvents is true",
            ));
        }
        if req.param("resourceVersionMatch") != Some("NotOlderThan") {
            errs.push(FieldError::forbidden(
                "resourceVersionMatch",
                "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
            ));
        }
        if !errs.is_empty() {
            return Err(ApiError::invalid_options(&errs));
        }
    }
    let timeout = match req.param("timeoutSeconds") {
        Some(s) => Duration::from_secs(
            s.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid timeoutSeconds \"{s}\"")))?,
        ),
        None => DEFAULT_TIMEOUT,
    };
    let (start, min_rv) = match rv_param.as_deref() {
        _ if initial_events => (WatchStart::Snapshot, 0),
        None | Some("0") => (WatchStart::Snapshot, 0),
        Some(s) => {
            let rv = parse_rv(s)?;
            (WatchStart::After(rv), rv)
        }
    };
    let filter = WatchFilter {
        res: t.res,
        namespace: t.ns.clone(),
        selectors: sel,
    };
    let mut enc = Encoder {
        def,
        filter: filter.clone(),
        table: req.wants_table().then_some(req),
        sent_columns: false,
        min_rv,
        last_rv: min_rv,
    };
    let (out_tx, out_rx) = mpsc::channel::<Bytes>(64);
    match app.store.watch(filter, start) {
        Err(compacted) => {
            // As the real server: HTTP 200, then one ERROR event carrying a 410 Expired Status.
            let e = ApiError::gone(format!("too old resource version: {min_rv} ({compacted})"));
            let _ = out_tx.try_send(error_line(&e));
        }
        Ok(mut sub) => {
            let interval = app.config.bookmark_interval;
            let mut shutdown = app.shutdown.clone();
            tokio::spawn(async move {
                for ev in &sub.backlog {
                    if let Some(line) = enc.event(ev) {
                        if out_tx.send(line).await.is_err() {
                            return;
                        }
                    }
                }
                if initial_events {
                    enc.last_rv = enc.last_rv.max(sub.rv);
                    if out_tx.send(enc.bookmark(sub.rv, true)).await.is_err() {
                        return;
                    }
                }
                let deadline = tokio::time::sleep(timeout);
                tokio::pin!(deadline);
                let mut tick = tokio::time::interval(interval);
                tick.tick().await;
                loop {
                    tokio::select! {
                        ev = sub.rx.recv() => match ev {
                            Some(ev) => {
                                if let Some(line) = enc.event(&ev) {
                                    if out_tx.send(line).await.is_err() { return; }
                                }
                            }
                            // Dropped as too slow (or the server stops): the client re-watches.
                            None => return,
                        },
                        _ = tick.tick(), if bookmarks => {
                            let rv = app.store.current_rv();
                            if sub.rx.is_closed() {
                                continue;
                            }
                            // Everything up to `rv` is already queued for us: send it first.
                            while let Ok(ev) = sub.rx.try_recv() {
                                if let Some(line) = enc.event(&ev) {
                                    if out_tx.send(line).await.is_err() { return; }
                                }
                            }
                            let at = rv.max(enc.last_rv);
                            if out_tx.send(enc.bookmark(at, false)).await.is_err() { return; }
                        }
                        _ = &mut deadline => return,
                        _ = out_tx.closed() => return,
                        _ = shutdown.changed() => return,
                    }
                }
            });
        }
    }
    let stream = futures::stream::unfold(out_rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<Bytes, Infallible>(b), rx))
    });
    let mut resp = Response::new(Body::from_stream(stream));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, private"),
    );
    Ok(resp)
}
