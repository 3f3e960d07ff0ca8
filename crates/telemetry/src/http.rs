//! The `--http-endpoint` server: Prometheus metrics and health checks on one port.
//!
//! | path | answer |
//! |---|---|
//! | `metrics_path` (`--metrics-path`, default `/metrics`) | the registry in OpenMetrics text |
//! | `/healthz` | 200 `ok` once the sidecar called [`Health::set_ready`]`(true)` (connected to its driver), else 503 |
//! | `/healthz/leader-election` | 200 unless this process leads and has not renewed its lease for longer than the lease duration + 20 s (then 500) |
//! | `/readyz` | the [`ReadyCheck`] given to [`Health::set_ready_check`] (a driver's Probe), run per request: 200 / 503; without one, as `/healthz` |
//! | anything else | 404 |
//!
//! `/healthz/leader-election` follows client-go's `HealthzAdaptor`, which the Go sidecars
//! serve there: it is a liveness check, so candidates (not leading) and processes running
//! without leader election are healthy; only a leader stuck without renewing is not, so the
//! kubelet restarts it and another replica takes over.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::Error;

/// client-go's `NewLeaderHealthzAdaptor(20 * time.Second)`: how far past the lease duration a
/// leader may go without renewing before it counts as unhealthy.
pub const LEADER_HEALTH_TOLERANCE: Duration = Duration::from_secs(20);

/// OpenMetrics text, what `prometheus_client::encoding::text` writes.
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Readiness and leader state, shared (cheap clones) between the sidecar and its HTTP server.
#[derive(Clone, Default, Debug)]
pub struct Health {
    inner: Arc<HealthInner>,
}

/// An asynchronous readiness check for `/readyz`, run on every request (e.g. a CSI Probe).
pub type ReadyCheck = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = bool> + Send>> + Send + Sync>;

#[derive(Default)]
struct HealthInner {
    ready: AtomicBool,
    ready_check: Mutex<Option<ReadyCheck>>,
    leader: Mutex<LeaderHealth>,
    /// `leader_election_master_status`: 1 while leading (client-go's gauge name).
    leader_gauge: Gauge,
}

impl std::fmt::Debug for HealthInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HealthInner")
            .field("ready", &self.ready)
            .field("leader", &self.leader)
            .finish_non_exhaustive()
    }
}

#[derive(Default, Debug)]
struct LeaderHealth {
    leading: bool,
    last_renew: Option<Instant>,
    /// `None`: a leader is always healthy (no lease duration known).
    stale_after: Option<Duration>,
}

impl Health {
    /// Marks the sidecar ready (`/healthz` answers 200) or not (503).
    pub fn set_ready(&self, ready: bool) {
        self.inner.ready.store(ready, Ordering::Relaxed);
    }

    /// Whether `/healthz` answers 200.
    pub fn is_ready(&self) -> bool {
        self.inner.ready.load(Ordering::Relaxed)
    }

    /// What `/readyz` runs on each request (without one it answers as `/healthz`).
    pub fn set_ready_check(&self, check: ReadyCheck) {
        *self
            .inner
            .ready_check
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(check);
    }

    /// `/readyz`: the check if one is set, else [`Health::is_ready`].
    pub async fn check_ready(&self) -> bool {
        let check = self
            .inner
            .ready_check
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        match check {
            Some(check) => check().await,
            None => self.is_ready(),
        }
    }

    /// Marks this process as leading (counts as a renewal now) or not.
    pub fn set_leader(&self, leading: bool) {
        let mut leader = self.lock_leader();
        leader.leading = leading;
        if leading {
            leader.last_renew = Some(Instant::now());
        }
        self.inner.leader_gauge.set(i64::from(leading));
    }

    /// Whether this process currently leads.
    pub fn is_leader(&self) -> bool {
        self.lock_leader().leading
    }

    /// Records a successful lease renewal.
    pub fn lease_renewed(&self) {
        self.lock_leader().last_renew = Some(Instant::now());
    }

    /// A leader that has not renewed for `lease_duration` + [`LEADER_HEALTH_TOLERANCE`] is
    /// unhealthy. Leader election sets this; without it a leader is always healthy.
    pub fn set_lease_duration(&self, lease_duration: Duration) {
        self.lock_leader().stale_after = Some(lease_duration + LEADER_HEALTH_TOLERANCE);
    }

    /// What `/healthz/leader-election` reports: healthy unless leading with a stale lease.
    pub fn leader_election_healthy(&self) -> bool {
        let leader = self.lock_leader();
        if !leader.leading {
            return true;
        }
        match (leader.stale_after, leader.last_renew) {
            (Some(stale_after), Some(last)) => last.elapsed() <= stale_after,
            _ => true,
        }
    }

    /// Registers `leader_election_master_status{name=lease_name}` (1 while leading), the gauge
    /// client-go's leader election exports.
    pub fn register_leader_metric(&self, registry: &mut Registry, lease_name: &str) {
        registry
            .sub_registry_with_label(("name".into(), lease_name.to_owned().into()))
            .register(
                "leader_election_master_status",
                "Whether this process leads (1) or not (0), per lease name",
                self.inner.leader_gauge.clone(),
            );
    }

    fn lock_leader(&self) -> std::sync::MutexGuard<'_, LeaderHealth> {
        // Plain data; a panic elsewhere while holding the lock leaves it consistent.
        self.inner
            .leader
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A running HTTP server; stop it with [`HttpServer::shutdown`] (dropping it stops it too).
#[derive(Debug)]
pub struct HttpServer {
    local_addr: SocketAddr,
    stop: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl HttpServer {
    /// The bound address (the real port when `:0` was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting, finishes in-flight requests, and returns when the server is gone.
    pub async fn shutdown(mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

#[derive(Clone)]
struct AppState {
    registry: Arc<Registry>,
    health: Health,
}

/// Binds `addr` (`host:port`, or Go's `:port` for all interfaces) and serves the metrics of
/// `registry` at `metrics_path` plus the health endpoints of [`Health`] (see the module docs).
pub async fn serve_http(
    addr: &str,
    metrics_path: &str,
    registry: Arc<Registry>,
    health: Health,
) -> Result<HttpServer, Error> {
    let bind_err = |reason: String| Error::HttpBind {
        addr: addr.to_owned(),
        reason,
    };
    if !metrics_path.starts_with('/') {
        return Err(bind_err(format!(
            "--metrics-path {metrics_path:?} must start with '/'"
        )));
    }
    if metrics_path.starts_with("/healthz") {
        return Err(bind_err(format!(
            "--metrics-path {metrics_path:?} collides with the /healthz endpoints"
        )));
    }
    let bind_to = go_listen_address(addr).map_err(bind_err)?;
    let listener = tokio::net::TcpListener::bind(&bind_to)
        .await
        .map_err(|e| bind_err(format!("cannot listen: {e}")))?;
    let local_addr = listener
        .local_addr()
        .map_err(|e| bind_err(format!("cannot read the bound address: {e}")))?;
    let app = Router::new()
        .route(metrics_path, get(metrics))
        .route("/healthz", get(healthz))
        .route("/healthz/leader-election", get(leader_healthz))
        .route("/readyz", get(readyz))
        .with_state(AppState { registry, health });
    let stop = CancellationToken::new();
    let stopped = stop.clone();
    let task = tokio::spawn(async move {
        let result = axum::serve(listener, app)
            .with_graceful_shutdown(async move { stopped.cancelled().await })
            .await;
        if let Err(e) = result {
            tracing::error!(error = %e, "HTTP server failed");
        }
    });
    tracing::info!(%local_addr, metrics_path, "serving metrics and health checks");
    Ok(HttpServer {
        local_addr,
        stop,
        task: Some(task),
    })
}

/// Go's `net.Listen("tcp", ":8080")` listens on every interface; tokio needs a host.
fn go_listen_address(addr: &str) -> Result<String, String> {
    let Some((host, port)) = addr.rsplit_once(':') else {
        return Err("expected host:port or :port".to_owned());
    };
    if port.parse::<u16>().is_err() {
        return Err(format!("port {port:?} is not a number from 0 to 65535"));
    }
    Ok(if host.is_empty() {
        format!("0.0.0.0:{port}")
    } else {
        addr.to_owned()
    })
}

async fn metrics(State(state): State<AppState>) -> Response {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, &state.registry) {
        Ok(()) => ([(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)], body).into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding metrics failed: {e}\n"),
        )
            .into_response(),
    }
}

async fn healthz(State(state): State<AppState>) -> Response {
    if state.health.is_ready() {
        (StatusCode::OK, "ok\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n").into_response()
    }
}

async fn readyz(State(state): State<AppState>) -> Response {
    if state.health.check_ready().await {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n").into_response()
    }
}

async fn leader_healthz(State(state): State<AppState>) -> Response {
    if state.health.leader_election_healthy() {
        (StatusCode::OK, "ok\n").into_response()
    } else {
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            "leader has not renewed its lease in time\n",
        )
            .into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A bare HTTP/1.1 GET: status code, headers (lowercased) and body.
    async fn get(addr: SocketAddr, path: &str) -> (u16, String, String) {
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        conn.write_all(
            format!("GET {path} HTTP/1.1\r\nhost: test\r\nconnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut raw = Vec::new();
        conn.read_to_end(&mut raw).await.unwrap();
        let text = String::from_utf8(raw).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        let status = head.split(' ').nth(1).unwrap().parse().unwrap();
        (status, head.to_lowercase(), body.to_owned())
    }

    #[test]
    fn go_style_listen_addresses() {
        assert_eq!(go_listen_address(":8080").unwrap(), "0.0.0.0:8080");
        assert_eq!(go_listen_address("127.0.0.1:0").unwrap(), "127.0.0.1:0");
        assert_eq!(go_listen_address("[::1]:9000").unwrap(), "[::1]:9000");
        assert!(go_listen_address("8080").is_err());
        assert!(go_listen_address(":http").is_err());
        assert!(go_listen_address("host:70000").is_err());
    }

    #[tokio::test]
    async fn serves_metrics_health_and_404() {
        let mut registry = Registry::default();
        let counter: Counter = Counter::default();
        registry.register("test_things", "Things counted by the test", counter.clone());
        counter.inc_by(3);
        let health = Health::default();
        health.register_leader_metric(&mut registry, "external-attacher-leader-x");
        let server = serve_http(
            "127.0.0.1:0",
            "/custom-metrics",
            Arc::new(registry),
            health.clone(),
        )
        .await
        .unwrap();
        let addr = server.local_addr();
        assert_ne!(addr.port(), 0);

        let (status, head, body) = get(addr, "/custom-metrics").await;
        assert_eq!(status, 200);
        assert!(
            head.contains(&format!("content-type: {METRICS_CONTENT_TYPE}")),
            "{head}"
        );
        assert!(body.contains("test_things_total 3"), "{body}");
        assert!(
            body.contains("leader_election_master_status{name=\"external-attacher-leader-x\"} 0"),
            "{body}"
        );
        assert!(body.ends_with("# EOF\n"), "{body}");

        // Not ready until the sidecar says so.
        assert_eq!(get(addr, "/healthz").await.0, 503);
        health.set_ready(true);
        let (status, _, body) = get(addr, "/healthz").await;
        assert_eq!((status, body.as_str()), (200, "ok\n"));

        // Without leader election, and as a candidate, the leader check passes.
        assert_eq!(get(addr, "/healthz/leader-election").await.0, 200);
        health.set_lease_duration(Duration::from_secs(15));
        health.set_leader(true);
        assert_eq!(get(addr, "/healthz/leader-election").await.0, 200);
        let (_, _, body) = get(addr, "/custom-metrics").await;
        assert!(
            body.contains("leader_election_master_status{name=\"external-attacher-leader-x\"} 1"),
            "{body}"
        );

        assert_eq!(
            get(addr, "/metrics").await.0,
            404,
            "only the configured path"
        );
        assert_eq!(get(addr, "/nope").await.0, 404);

        // /readyz follows /healthz until a check is set, then asks the check on every request.
        assert_eq!(get(addr, "/readyz").await.0, 200);
        let answer = Arc::new(AtomicBool::new(false));
        let a = Arc::clone(&answer);
        health.set_ready_check(Arc::new(move || {
            let a = Arc::clone(&a);
            Box::pin(async move { a.load(Ordering::SeqCst) })
        }));
        assert_eq!(get(addr, "/readyz").await.0, 503);
        answer.store(true, Ordering::SeqCst);
        let (status, _, body) = get(addr, "/readyz").await;
        assert_eq!((status, body.as_str()), (200, "ready\n"));
        server.shutdown().await;
        assert!(
            tokio::net::TcpStream::connect(addr).await.is_err(),
            "stopped"
        );
    }

    #[test]
    fn a_leader_that_stops_renewing_is_unhealthy() {
        let health = Health::default();
        health.set_lease_duration(Duration::ZERO);
        assert!(health.leader_election_healthy(), "not leading");
        health.set_leader(true);
        // Force a renewal far enough in the past.
        health.lock_leader().last_renew =
            Instant::now().checked_sub(LEADER_HEALTH_TOLERANCE + Duration::from_secs(1));
        assert!(!health.leader_election_healthy());
        health.lease_renewed();
        assert!(health.leader_election_healthy());
        health.set_leader(false);
        assert!(!health.is_leader());
        assert!(health.leader_election_healthy());
    }

    #[tokio::test]
    async fn bad_endpoints_name_the_flag() {
        let registry = Arc::new(Registry::default());
        let err = serve_http("nonsense", "/metrics", registry.clone(), Health::default())
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("--http-endpoint \"nonsense\""), "{err}");
        let err = serve_http("127.0.0.1:0", "metrics", registry, Health::default())
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("--metrics-path"), "{err}");
    }
}
