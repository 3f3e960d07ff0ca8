//! A `kube::Client` throttled like client-go's: every request waits on a token bucket.
//!
//! client-go gives each REST client a token bucket (`golang.org/x/time/rate`) of `burst` tokens
//! refilled at `qps` per second; a request takes a token or waits for one. `--kube-api-qps 0`
//! means the default 5, a negative value disables the limit. The bucket starts full, so the
//! first `burst` requests go at once.
//!
//! The limiter is a tower layer in kube's client stack. kube puts a `Buffer` in front of the
//! stack, whose single worker polls our `poll_ready` before each call: waiting there keeps
//! requests in arrival order, as client-go's reservations do.
//!
//! The HTTP stack under it speaks HTTP/2 when the server offers it over TLS (ALPN), as
//! client-go does: one connection per client carries every request and watch as a stream.
//! kube's own stack speaks only HTTP/1.1, where each request in flight and each open watch
//! holds a TCP+TLS connection with its buffers on both ends; at 1,000 pods that was ~90 MiB
//! of `csi-cluster`'s heap (docs/benchmarks.md). Plain `http://` servers, and servers that do
//! not offer `h2`, get HTTP/1.1 as before.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use kube::client::{ClientBuilder, ConfigExt};
use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio::time::{Instant, Sleep};
use tower::{Layer, Service};

use crate::Error;

/// Installs rustls' `ring` provider as the process default, once; later calls do nothing.
///
/// The workspace build enables both of rustls' providers (kube asks for `ring`, aws-sdk-ec2
/// for `aws-lc-rs`), and rustls then refuses to pick one, so anything that builds a
/// `kube::Client` calls this first. [`build_client`] and [`rate_limited`] do.
pub fn install_crypto_provider() {
    // Err only means a provider is already installed, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// client-go's default QPS when the flag is 0.
const DEFAULT_QPS: f32 = 5.0;

/// Builds the client a sidecar uses: the kubeconfig at `kubeconfig`, or when `None` the
/// in-cluster configuration, falling back to `$KUBECONFIG` / `~/.kube/config` (so a sidecar
/// also runs outside a cluster). Installs the rustls provider first.
pub async fn build_client(
    kubeconfig: Option<&Path>,
    user_agent: &str,
    qps: f32,
    burst: u32,
) -> Result<kube::Client, Error> {
    install_crypto_provider();
    let config = match kubeconfig.filter(|p| !p.as_os_str().is_empty()) {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path).map_err(|e| Error::Kubeconfig {
                path: path.to_owned(),
                reason: e.to_string(),
            })?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(|e| Error::Kubeconfig {
                    path: path.to_owned(),
                    reason: e.to_string(),
                })?
        }
        None => match kube::Config::incluster() {
            Ok(config) => config,
            Err(in_cluster) => kube::Config::infer().await.map_err(|e| {
                Error::KubeConfig(format!(
                    "no --kubeconfig given, not in a cluster ({in_cluster}), and no default kubeconfig: {e}"
                ))
            })?,
        },
    };
    rate_limited(config, user_agent, qps, burst)
}

/// Builds a client from an existing configuration, with the User-Agent header set to
/// `user_agent` and every request throttled by a `qps`/`burst` token bucket.
pub fn rate_limited(
    client_config: kube::Config,
    user_agent: &str,
    qps: f32,
    burst: u32,
) -> Result<kube::Client, Error> {
    rate_limited_with_limiter(client_config, user_agent, qps, burst).map(|(client, _)| client)
}

/// [`rate_limited`], also returning the limiter (its wait counters are for tests and metrics).
pub fn rate_limited_with_limiter(
    mut client_config: kube::Config,
    user_agent: &str,
    qps: f32,
    burst: u32,
) -> Result<(kube::Client, RateLimiter), Error> {
    install_crypto_provider();
    let limiter = RateLimiter::new(qps, burst)?;
    let value = http::HeaderValue::from_str(user_agent).map_err(|_| {
        Error::ClientSettings(format!(
            "user agent {user_agent:?} is not a valid HTTP header value"
        ))
    })?;
    client_config
        .headers
        .retain(|(name, _)| name != http::header::USER_AGENT);
    client_config
        .headers
        .push((http::header::USER_AGENT, value));
    let layer = RateLimitLayer {
        limiter: limiter.clone(),
    };
    let client = if client_config.proxy_url.is_some() {
        // Through a proxy: kube's own stack, which knows the proxy protocols (HTTP/1.1).
        ClientBuilder::try_from(client_config)
            .map_err(Error::Client)?
            .with_layer(&layer)
            .build()
    } else {
        http2_capable(client_config)?.with_layer(&layer).build()
    };
    Ok((client, limiter))
}

/// client-go's HTTP/2 health check: a PING after 30 s without a frame, the connection closed
/// if its answer takes longer than 15 s (`ReadIdleTimeout`, `PingTimeout`).
const HTTP2_PING_AFTER: Duration = Duration::from_secs(30);
const HTTP2_PING_TIMEOUT: Duration = Duration::from_secs(15);

/// The HTTP service under a [`kube::Client`].
type HttpService = tower::util::BoxService<
    http::Request<kube::client::Body>,
    http::Response<hyper::body::Incoming>,
    tower::BoxError,
>;

/// The HTTP stack kube builds from `config` (base URI, retries, credentials, extra headers),
/// over a connector that offers `h2` and `http/1.1` in the TLS handshake.
fn http2_capable(config: kube::Config) -> Result<ClientBuilder<HttpService>, Error> {
    use hyper_util::client::legacy::connect::HttpConnector;
    use hyper_util::rt::{TokioExecutor, TokioTimer};
    use tower::ServiceBuilder;

    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(config.connect_timeout);
    let tls = config.rustls_client_config().map_err(Error::Client)?;
    let mut https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    if let Some(name) = &config.tls_server_name {
        let name = rustls::pki_types::ServerName::try_from(name.clone()).map_err(|e| {
            Error::ClientSettings(format!(
                "tls-server-name {name:?} is not a server name: {e}"
            ))
        })?;
        https = https.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name));
    }
    let https = https.enable_all_versions().wrap_connector(http);
    let hyper_client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .http2_keep_alive_interval(HTTP2_PING_AFTER)
        .http2_keep_alive_timeout(HTTP2_PING_TIMEOUT)
        .http2_keep_alive_while_idle(true)
        .build(https);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.default_retry.then(|| {
            tower::retry::RetryLayer::new(kube::client::retry::RetryPolicy::server_retry())
        }))
        .option_layer(config.auth_layer().map_err(Error::Client)?)
        .layer(config.extra_headers_layer().map_err(Error::Client)?)
        .map_err(tower::BoxError::from)
        .service(hyper_client);
    Ok(ClientBuilder::new(
        tower::util::BoxService::new(service),
        config.default_namespace,
    ))
}

/// A shared token bucket (cheap to clone: clones share the bucket and the counters).
#[derive(Clone, Debug)]
pub struct RateLimiter {
    inner: Arc<LimiterInner>,
}

#[derive(Debug)]
struct LimiterInner {
    /// `None`: unlimited.
    bucket: Option<Mutex<Bucket>>,
    waits: AtomicU64,
    waited_nanos: AtomicU64,
    requests: AtomicU64,
}

#[derive(Debug)]
struct Bucket {
    qps: f64,
    burst: f64,
    /// May go negative: a negative balance is the queue of reservations made ahead of time.
    tokens: f64,
    last: Instant,
}

impl RateLimiter {
    /// client-go semantics: `qps == 0` → 5, `qps < 0` → unlimited; `burst` must be ≥ 1 when
    /// limited.
    pub fn new(qps: f32, burst: u32) -> Result<Self, Error> {
        if qps.is_nan() || qps.is_infinite() {
            return Err(Error::ClientSettings(format!(
                "--kube-api-qps {qps} is not a finite number"
            )));
        }
        let bucket = if qps < 0.0 {
            None
        } else {
            if burst == 0 {
                return Err(Error::ClientSettings(
                    "--kube-api-burst must be at least 1 when --kube-api-qps is not negative"
                        .to_owned(),
                ));
            }
            let qps = if qps == 0.0 { DEFAULT_QPS } else { qps };
            Some(Mutex::new(Bucket {
                qps: f64::from(qps),
                burst: f64::from(burst),
                tokens: f64::from(burst),
                last: Instant::now(),
            }))
        };
        Ok(Self {
            inner: Arc::new(LimiterInner {
                bucket,
                waits: AtomicU64::new(0),
                waited_nanos: AtomicU64::new(0),
                requests: AtomicU64::new(0),
            }),
        })
    }

    /// Whether requests are throttled at all.
    pub fn is_limited(&self) -> bool {
        self.inner.bucket.is_some()
    }

    /// Requests that had to wait for a token.
    pub fn waits(&self) -> u64 {
        self.inner.waits.load(Ordering::Relaxed)
    }

    /// Total time requests spent waiting for tokens.
    pub fn waited(&self) -> Duration {
        Duration::from_nanos(self.inner.waited_nanos.load(Ordering::Relaxed))
    }

    /// Requests that went through the limiter.
    pub fn requests(&self) -> u64 {
        self.inner.requests.load(Ordering::Relaxed)
    }

    /// Takes a token now and returns how long the caller must wait before using it.
    fn reserve(&self) -> Duration {
        self.inner.requests.fetch_add(1, Ordering::Relaxed);
        let Some(bucket) = &self.inner.bucket else {
            return Duration::ZERO;
        };
        let wait = {
            // A poisoned lock only means another request panicked mid-update of plain numbers;
            // the bucket is still usable.
            let mut b = bucket.lock().unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            let elapsed = now.saturating_duration_since(b.last).as_secs_f64();
            b.last = now;
            b.tokens = (b.tokens + elapsed * b.qps).min(b.burst);
            b.tokens -= 1.0;
            if b.tokens >= 0.0 {
                Duration::ZERO
            } else {
                Duration::from_secs_f64(-b.tokens / b.qps)
            }
        };
        if !wait.is_zero() {
            self.inner.waits.fetch_add(1, Ordering::Relaxed);
            self.inner.waited_nanos.fetch_add(
                u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX),
                Ordering::Relaxed,
            );
        }
        wait
    }
}

/// The tower layer that puts a [`RateLimiter`] in front of kube's HTTP stack.
#[derive(Clone, Debug)]
pub struct RateLimitLayer {
    limiter: RateLimiter,
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimited<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimited {
            inner,
            limiter: self.limiter.clone(),
            state: State::Idle,
        }
    }
}

/// The service [`RateLimitLayer`] builds.
pub struct RateLimited<S> {
    inner: S,
    limiter: RateLimiter,
    state: State,
}

impl<S> std::fmt::Debug for RateLimited<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimited")
            .field("limiter", &self.limiter)
            .finish_non_exhaustive()
    }
}

enum State {
    /// No token reserved for the next call.
    Idle,
    /// A token is reserved; usable when the sleep ends.
    Waiting(Pin<Box<Sleep>>),
    /// A token is held for the next call.
    Ready,
}

impl<S, Req> Service<Req> for RateLimited<S>
where
    S: Service<Req>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        loop {
            match &mut self.state {
                State::Idle => {
                    let wait = self.limiter.reserve();
                    self.state = if wait.is_zero() {
                        State::Ready
                    } else {
                        State::Waiting(Box::pin(tokio::time::sleep(wait)))
                    };
                }
                State::Waiting(sleep) => {
                    if sleep.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    self.state = State::Ready;
                }
                State::Ready => return self.inner.poll_ready(cx),
            }
        }
    }

    fn call(&mut self, req: Req) -> Self::Future {
        // tower's contract: call only after poll_ready returned Ready, which leaves us Ready.
        self.state = State::Idle;
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Namespace;
    use kube::api::Api;

    async fn config_for(server: &apiserver::RunningApiServer) -> kube::Config {
        let kubeconfig: Kubeconfig = Kubeconfig::from_yaml(&server.kubeconfig_yaml()).unwrap();
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .unwrap()
    }

    #[test]
    fn client_go_qps_semantics() {
        assert!(!RateLimiter::new(-1.0, 0).unwrap().is_limited());
        let zero = RateLimiter::new(0.0, 1).unwrap();
        assert!(zero.is_limited());
        let rate = zero.inner.bucket.as_ref().unwrap().lock().unwrap().qps;
        assert_eq!(rate, 5.0, "qps 0 means client-go's default 5");
        let err = RateLimiter::new(5.0, 0).unwrap_err().to_string();
        assert!(err.contains("--kube-api-burst"), "{err}");
        assert!(RateLimiter::new(f32::NAN, 1).is_err());
    }

    #[tokio::test]
    async fn bucket_lets_a_burst_through_then_paces() {
        let limiter = RateLimiter::new(10.0, 3).unwrap();
        for _ in 0..3 {
            assert_eq!(limiter.reserve(), Duration::ZERO);
        }
        let fourth = limiter.reserve();
        let fifth = limiter.reserve();
        assert!(fourth > Duration::from_millis(50), "{fourth:?}");
        assert!(
            fifth > fourth,
            "reservations queue up: {fourth:?} then {fifth:?}"
        );
        assert_eq!(limiter.waits(), 2);
        assert_eq!(limiter.requests(), 5);
    }

    #[tokio::test]
    async fn qps_and_burst_throttle_real_requests() {
        let server = apiserver::ApiServer::start(apiserver::Config::default())
            .await
            .unwrap();
        let (client, limiter) =
            rate_limited_with_limiter(config_for(&server).await, "sidecar-test/1", 20.0, 1)
                .unwrap();
        let namespaces: Api<Namespace> = Api::all(client);
        let start = std::time::Instant::now();
        for _ in 0..21 {
            namespaces.get("default").await.unwrap();
        }
        let elapsed = start.elapsed();
        // 1 token at once, then 20 more at 20/s: at least ~1 s. Lower bound only.
        assert!(elapsed >= Duration::from_millis(900), "{elapsed:?}");
        assert_eq!(limiter.requests(), 21);
        assert!(limiter.waits() >= 19, "waits {}", limiter.waits());
        server.shutdown().await.unwrap();
    }

    /// Established TCP connections to `port` on 127.0.0.1 that this process opened (its
    /// client ends), from /proc/self/net/tcp.
    fn client_connections_to(port: u16) -> usize {
        let table = std::fs::read_to_string("/proc/self/net/tcp").unwrap();
        table
            .lines()
            .skip(1)
            .filter(|line| {
                let cols: Vec<&str> = line.split_whitespace().collect();
                let remote_port = cols[2].rsplit(':').next().unwrap();
                u16::from_str_radix(remote_port, 16).unwrap() == port && cols[3] == "01"
            })
            .count()
    }

    #[tokio::test]
    async fn requests_and_watches_share_one_http2_connection() {
        use futures::StreamExt;
        let server = apiserver::ApiServer::start(apiserver::Config::default())
            .await
            .unwrap();
        let port = server.addr().port();
        let client = rate_limited(config_for(&server).await, "sidecar-test/1", -1.0, 1).unwrap();
        let namespaces: Api<Namespace> = Api::all(client.clone());
        // Ten watches held open, and 50 GETs in flight at once beside them: over HTTP/1.1
        // each would hold a connection of its own.
        let mut watches = Vec::new();
        for _ in 0..10 {
            let stream = kube::runtime::watcher(namespaces.clone(), Default::default()).boxed();
            watches.push(stream);
        }
        for w in &mut watches {
            w.next().await.unwrap().unwrap();
        }
        let gets = (0..50).map(|_| namespaces.get("default"));
        for got in futures::future::join_all(gets).await {
            got.unwrap();
        }
        assert_eq!(
            client_connections_to(port),
            1,
            "10 watches and 50 concurrent GETs over one HTTP/2 connection"
        );
        drop(watches);
        server.shutdown().await.unwrap();
    }

    #[tokio::test]
    async fn negative_qps_adds_no_wait() {
        let server = apiserver::ApiServer::start(apiserver::Config::default())
            .await
            .unwrap();
        let (client, limiter) =
            rate_limited_with_limiter(config_for(&server).await, "sidecar-test/1", -1.0, 1)
                .unwrap();
        let namespaces: Api<Namespace> = Api::all(client);
        for _ in 0..50 {
            namespaces.get("default").await.unwrap();
        }
        assert_eq!(limiter.requests(), 50);
        assert_eq!(limiter.waits(), 0);
        assert_eq!(limiter.waited(), Duration::ZERO);
        server.shutdown().await.unwrap();
    }

    #[tokio::test]
    async fn user_agent_reaches_the_server() {
        // A one-shot HTTP listener that records the request head.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let head = tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut buf = Vec::new();
            let mut chunk = [0u8; 1024];
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = conn.read(&mut chunk).await.unwrap();
                assert!(n > 0, "connection closed before the request head ended");
                buf.extend_from_slice(&chunk[..n]);
            }
            let body = r#"{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"default"}}"#;
            let resp = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            conn.write_all(resp.as_bytes()).await.unwrap();
            String::from_utf8_lossy(&buf).to_lowercase()
        });
        let config = kube::Config::new(format!("http://{addr}").parse().unwrap());
        let client = rate_limited(config, "csi-attacher/v9.9 (test)", 5.0, 10).unwrap();
        let namespaces: Api<Namespace> = Api::all(client);
        namespaces.get("default").await.unwrap();
        let head = head.await.unwrap();
        assert!(
            head.contains("\r\nuser-agent: csi-attacher/v9.9 (test)\r\n"),
            "{head}"
        );
    }

    #[tokio::test]
    async fn build_client_reads_a_kubeconfig_file() {
        let server = apiserver::ApiServer::start(apiserver::Config::default())
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubeconfig");
        std::fs::write(&path, server.kubeconfig_yaml()).unwrap();
        let client = build_client(Some(&path), "sidecar-test", 5.0, 10)
            .await
            .unwrap();
        let namespaces: Api<Namespace> = Api::all(client);
        assert!(namespaces.get("kube-system").await.is_ok());
        server.shutdown().await.unwrap();

        let missing = dir.path().join("absent");
        let Err(err) = build_client(Some(&missing), "sidecar-test", 5.0, 10).await else {
            panic!("a missing kubeconfig must fail");
        };
        let err = err.to_string();
        assert!(err.contains("absent"), "{err}");
    }
}
