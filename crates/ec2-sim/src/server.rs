//! The HTTP side: the EC2 query endpoint at `/`, the sim-only endpoints (`/_sim/*`, signed like
//! the EC2 endpoint; `/metrics` and `/healthz` open), and the running [`Simulator`].

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::auth::{self, Credentials};
use crate::config::{Faults, SimConfig, Timing};
use crate::engine::Engine;
use crate::ids;
use crate::metrics::Metrics;
use crate::query::Params;
use crate::xml::ApiError;
use crate::{Error, config};

pub(crate) struct Shared {
    engine: Mutex<Engine>,
    /// Who may call the EC2 endpoint, and the region their signatures must be scoped to.
    credentials: Credentials,
    region: String,
    counts: Mutex<BTreeMap<String, u64>>,
    metrics: Metrics,
}

/// A poisoned lock only means another request panicked; the state itself is still usable.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A running simulator. Dropping it without [`Simulator::shutdown`] stops serving and
/// releases loop devices too, but cannot report errors.
pub struct Simulator {
    shared: Arc<Shared>,
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<std::io::Result<()>>>,
    ticker: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Simulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Simulator")
            .field("addr", &self.addr)
            .finish()
    }
}

impl Simulator {
    /// Loads (or creates) the state in `config.state_dir`, re-adopts loop devices of attached
    /// volumes, and serves on `listen` (use `127.0.0.1:0` for an ephemeral port).
    pub async fn start(config: SimConfig, listen: SocketAddr) -> Result<Simulator, Error> {
        let timing = config.timing;
        let credentials = config.credentials.clone();
        let region = config.region.clone();
        let engine = tokio::task::spawn_blocking(move || Engine::open(config))
            .await
            .map_err(|e| Error::Server(format!("start task failed: {e}")))??;
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .map_err(|source| Error::Bind {
                addr: listen,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| Error::Bind {
            addr: listen,
            source,
        })?;
        let shared = Arc::new(Shared {
            engine: Mutex::new(engine),
            credentials,
            region,
            counts: Mutex::new(BTreeMap::new()),
            metrics: Metrics::new(),
        });
        let app = router(shared.clone());
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await
        });
        let ticker = tokio::spawn(tick_loop(shared.clone(), timing));
        tracing::info!(%addr, "ec2-sim serving");
        Ok(Simulator {
            shared,
            addr,
            stop: Some(stop),
            server: Some(server),
            ticker: Some(ticker),
        })
    }

    /// `http://127.0.0.1:PORT`, for `aws-sdk-ec2`'s `endpoint_url`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The credentials the EC2 endpoint accepts.
    pub fn credentials(&self) -> &Credentials {
        &self.shared.credentials
    }

    /// The region requests must be signed for.
    pub fn region(&self) -> &str {
        &self.shared.region
    }

    /// `X-Amz-Date` and `Authorization` for a form `POST /` of `body` to this simulator,
    /// signed now with its first credentials (see [`crate::sign_post`]).
    pub fn sign_post(&self, body: &[u8]) -> [(&'static str, String); 2] {
        let (id, secret) = self.shared.credentials.first().unwrap_or(("", ""));
        auth::sign_post(
            &self.addr.to_string(),
            body,
            &self.shared.region,
            id,
            secret,
            std::time::SystemTime::now(),
        )
    }

    /// `X-Amz-Date` and `Authorization` for any request to this simulator (`path` as sent,
    /// with an optional `?query`), e.g. `PUT /_sim/faults` with its JSON body, signed now with
    /// its first credentials (see [`crate::sign_request`]).
    pub fn sign_request(
        &self,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> [(&'static str, String); 2] {
        let (id, secret) = self.shared.credentials.first().unwrap_or(("", ""));
        let (path, query) = path.split_once('?').unwrap_or((path, ""));
        auth::sign_request(
            method,
            path,
            query,
            &self.addr.to_string(),
            body,
            &self.shared.region,
            id,
            secret,
            std::time::SystemTime::now(),
        )
    }

    /// Calls per EC2 action since start (or the last `POST /_sim/calls/reset`).
    pub fn call_counts(&self) -> BTreeMap<String, u64> {
        lock(&self.shared.counts).clone()
    }

    /// Clears the per-action call counts.
    pub fn reset_call_counts(&self) {
        lock(&self.shared.counts).clear();
    }

    /// Every attachment state change since start (bounded: [`crate::HISTORY_CAPACITY`]), for
    /// proving afterwards that no volume was held by two instances
    /// ([`crate::AttachmentHistory::double_attachments`]). Attachments present at start are
    /// recorded first, at their state then.
    pub fn attachment_history(&self) -> crate::AttachmentHistory {
        lock(&self.shared.engine).history.snapshot()
    }

    /// Replaces the fault configuration.
    pub fn set_faults(&self, faults: Faults) {
        lock(&self.shared.engine).faults = faults;
    }

    /// The current fault configuration (throttle `next` budgets count down as used).
    pub fn faults(&self) -> Faults {
        lock(&self.shared.engine).faults.clone()
    }

    /// The loop device backing a volume right now (`Backing::Loop` only).
    pub fn loop_device(&self, volume_id: &str) -> Option<String> {
        lock(&self.shared.engine)
            .disks
            .loop_device(volume_id)
            .map(str::to_string)
    }

    /// Where `instance_id`'s device links appear: the `--dev-root` of the EBS driver's node
    /// service on that instance (see [`SimConfig::node_dev_root`]).
    pub fn node_dev_root(&self, instance_id: &str) -> std::path::PathBuf {
        lock(&self.shared.engine).config.node_dev_root(instance_id)
    }

    /// Stops serving, saves the state and releases the loop devices this process made.
    pub async fn shutdown(mut self) -> Result<(), Error> {
        self.stop_tasks();
        if let Some(server) = self.server.take() {
            match server.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(Error::Server(format!("serve failed: {e}"))),
                Err(e) => return Err(Error::Server(format!("server task failed: {e}"))),
            }
        }
        let shared = self.shared.clone();
        tokio::task::spawn_blocking(move || lock(&shared.engine).shutdown())
            .await
            .map_err(|e| Error::Server(format!("shutdown task failed: {e}")))?
    }

    fn stop_tasks(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.ticker.take() {
            t.abort();
        }
    }
}

impl Drop for Simulator {
    fn drop(&mut self) {
        if self.stop.is_none() && self.server.is_none() {
            return;
        }
        self.stop_tasks();
        if let Some(server) = self.server.take() {
            server.abort();
        }
        if let Err(e) = lock(&self.shared.engine).shutdown() {
            tracing::error!(error = %e, "ec2-sim dropped: cannot release loop devices");
        }
    }
}

/// Starts a simulator, waits for `shutdown` to resolve, then stops it cleanly.
pub async fn run(
    config: SimConfig,
    listen: SocketAddr,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    let sim = Simulator::start(config, listen).await?;
    shutdown.await;
    tracing::info!("ec2-sim stopping");
    sim.shutdown().await
}

/// Drives time-based transitions (and loop devices) without waiting for a request, so a
/// device appears when an attachment completes even if nobody polls.
async fn tick_loop(shared: Arc<Shared>, timing: Timing) {
    let period = match timing {
        Timing::Instant | Timing::Fast => Duration::from_millis(5),
        Timing::Realistic => Duration::from_millis(50),
    };
    let mut interval = tokio::time::interval(period);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        let s = shared.clone();
        if tokio::task::spawn_blocking(move || lock(&s.engine).tick())
            .await
            .is_err()
        {
            return;
        }
    }
}

fn router(shared: Arc<Shared>) -> Router {
    // The test-control endpoints change what the simulated cloud does: they take the same
    // signature as the EC2 endpoint (checked before any handler runs).
    let sim_only = Router::new()
        .route("/_sim/calls", get(get_calls))
        .route("/_sim/calls/reset", post(reset_calls))
        .route("/_sim/faults", get(get_faults).put(put_faults))
        .route("/_sim/attachments", get(get_attachments))
        .route_layer(middleware::from_fn_with_state(
            shared.clone(),
            require_signature,
        ));
    Router::new()
        .route("/", post(ec2_post).get(ec2_get))
        .merge(sim_only)
        .route("/metrics", get(get_metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .with_state(shared)
}

/// The largest body a `/_sim/*` request may have (a fault document is a few hundred bytes).
const SIM_BODY_LIMIT: usize = 1 << 20;

/// Lets a `/_sim/*` request through only when it carries a valid SigV4 signature by one of the
/// configured keys (service `ec2`, the sim's region, the SHA-256 of this body), exactly as the
/// EC2 endpoint checks; otherwise answers EC2's error document: `AuthFailure` 401 when unsigned
/// or the key is unknown, `SignatureDoesNotMatch` 403 when the signature is wrong.
async fn require_signature(
    State(s): State<Arc<Shared>>,
    request: axum::extract::Request,
    next: Next,
) -> Response {
    let request_id = ids::request_id();
    let (parts, body) = request.into_parts();
    let body = match axum::body::to_bytes(body, SIM_BODY_LIMIT).await {
        Ok(b) => b,
        Err(e) => {
            tracing::info!(request_id, path = parts.uri.path(), error = %e, "refused: body unreadable or too large");
            return (
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("request body unreadable or larger than {SIM_BODY_LIMIT} bytes\n"),
            )
                .into_response();
        }
    };
    let signed = auth::verify(
        &s.credentials,
        &s.region,
        &auth::Request {
            method: parts.method.as_str(),
            path: parts.uri.path(),
            query: parts.uri.query().unwrap_or(""),
            headers: &parts.headers,
            body: &body,
        },
        std::time::SystemTime::now(),
    );
    match signed {
        Ok(access_key_id) => {
            tracing::debug!(
                request_id,
                path = parts.uri.path(),
                access_key_id,
                "sim endpoint"
            );
            next.run(axum::extract::Request::from_parts(parts, body.into()))
                .await
        }
        Err(err) => {
            tracing::info!(request_id, path = parts.uri.path(), code = %err.code, message = %err.message, "refused: not authenticated");
            xml_response(err.status, err.to_xml(&request_id))
        }
    }
}

async fn ec2_post(
    State(s): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    ec2(s, method, uri, headers, body).await
}

async fn ec2_get(
    State(s): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    ec2(s, method, uri, headers, Bytes::new()).await
}

fn xml_response(status: u16, body: String) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
    (
        status,
        [(header::CONTENT_TYPE, "text/xml;charset=UTF-8")],
        body,
    )
        .into_response()
}

async fn ec2(
    s: Arc<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let started = Instant::now();
    let request_id = ids::request_id();
    // Like AWS: nothing is looked at, counted or throttled before the caller is known.
    let signed = auth::verify(
        &s.credentials,
        &s.region,
        &auth::Request {
            method: method.as_str(),
            path: uri.path(),
            query: uri.query().unwrap_or(""),
            headers: &headers,
            body: &body,
        },
        std::time::SystemTime::now(),
    );
    if let Err(err) = signed {
        s.metrics
            .record("-", &err.code, started.elapsed().as_secs_f64());
        tracing::info!(request_id, code = %err.code, message = %err.message, "refused: not authenticated");
        return xml_response(err.status, err.to_xml(&request_id));
    }
    let mut pairs: Vec<(String, String)> = Vec::new();
    for part in [uri.query().unwrap_or("").as_bytes(), &body[..]] {
        match serde_urlencoded::from_bytes::<Vec<(String, String)>>(part) {
            Ok(p) => pairs.extend(p),
            Err(e) => {
                let err = ApiError::new(
                    "MalformedQueryString",
                    format!("The request is not form-encoded: {e}"),
                );
                return xml_response(err.status, err.to_xml(&request_id));
            }
        }
    }
    let params = Params::from_pairs(pairs);
    let action = params.get("Action").unwrap_or("").to_string();
    if !action.is_empty() {
        *lock(&s.counts).entry(action.clone()).or_insert(0) += 1;
    }
    let (throttled, latency) = {
        let mut e = lock(&s.engine);
        let throttled = e.faults.take_throttle(&action, ids::next_f64);
        (throttled, e.faults.latency_for(&action))
    };
    if latency > 0 {
        tokio::time::sleep(Duration::from_millis(latency)).await;
    }
    let result = if throttled {
        Err(ApiError::new(
            "RequestLimitExceeded",
            "Request limit exceeded.",
        ))
    } else {
        let s2 = s.clone();
        let a = action.clone();
        let rid = request_id.clone();
        match tokio::task::spawn_blocking(move || {
            let _span = tracing::debug_span!("ec2_call", action = %a, request_id = %rid).entered();
            lock(&s2.engine).handle(&a, &params, &rid)
        })
        .await
        {
            Ok(r) => r,
            Err(e) => Err(ApiError::internal(format!("request task failed: {e}"))),
        }
    };
    let label = if action.is_empty() { "-" } else { &action };
    let elapsed = started.elapsed().as_secs_f64();
    match result {
        Ok(body) => {
            s.metrics.record(label, "OK", elapsed);
            tracing::debug!(action = label, request_id, "ok");
            xml_response(200, body)
        }
        Err(err) => {
            s.metrics.record(label, &err.code, elapsed);
            tracing::info!(action = label, request_id, code = %err.code, message = %err.message, "error");
            xml_response(err.status, err.to_xml(&request_id))
        }
    }
}

fn json(status: StatusCode, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

async fn get_calls(State(s): State<Arc<Shared>>) -> Response {
    let counts = lock(&s.counts).clone();
    json(
        StatusCode::OK,
        serde_json::to_string(&counts).unwrap_or_else(|_| "{}".into()),
    )
}

async fn reset_calls(State(s): State<Arc<Shared>>) -> Response {
    lock(&s.counts).clear();
    json(StatusCode::OK, "{}".into())
}

async fn get_faults(State(s): State<Arc<Shared>>) -> Response {
    let faults = lock(&s.engine).faults.clone();
    json(
        StatusCode::OK,
        serde_json::to_string(&faults).unwrap_or_else(|_| "{}".into()),
    )
}

async fn put_faults(State(s): State<Arc<Shared>>, body: Bytes) -> Response {
    let text = String::from_utf8_lossy(&body);
    match config::Faults::from_json(&text) {
        Ok(f) => {
            let out = serde_json::to_string(&f).unwrap_or_else(|_| "{}".into());
            lock(&s.engine).faults = f;
            json(StatusCode::OK, out)
        }
        Err(e) => json(
            StatusCode::BAD_REQUEST,
            serde_json::json!({ "error": e.to_string() }).to_string(),
        ),
    }
}

async fn get_attachments(State(s): State<Arc<Shared>>) -> Response {
    let history = lock(&s.engine).history.snapshot();
    let body = serde_json::json!({
        "events": history.events,
        "dropped": history.dropped,
        "refused": history.refused,
        "doubleAttachments": history.double_attachments(),
    });
    json(StatusCode::OK, body.to_string())
}

async fn get_metrics(State(s): State<Arc<Shared>>) -> Response {
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.encode(),
    )
        .into_response()
}
