//! The driver's Prometheus metrics: CSI RPC counts and latency per method, recorded by
//! [`RpcMetricsLayer`] (EC2 calls come from [`ebs_cloud::CloudMetrics`]). `--http-endpoint`
//! serves them with the health checks through [`telemetry::serve_http`].

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;

fn rpc_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// CSI RPCs handled, per method and gRPC status code, and their latency per method.
#[derive(Debug, Clone)]
pub struct RpcMetrics {
    calls: Family<Labels, Counter>,
    latency: Family<Labels, Histogram, fn() -> Histogram>,
    /// Per method whatever the code, for [`RpcMetrics::calls`]; not exported (Prometheus
    /// sums `calls` over `code` itself).
    per_method: Family<String, Counter>,
}

impl Default for RpcMetrics {
    fn default() -> Self {
        Self {
            calls: Family::default(),
            latency: Family::new_with_constructor(rpc_histogram as fn() -> Histogram),
            per_method: Family::default(),
        }
    }
}

impl RpcMetrics {
    pub fn register(&self, registry: &mut Registry) {
        // Under the registry's `ebs_csi` prefix: `ebs_csi_rpc_requests_total` and
        // `ebs_csi_rpc_duration_seconds`.
        registry.register(
            "rpc_requests",
            "CSI RPCs handled, per method and gRPC status code",
            self.calls.clone(),
        );
        registry.register(
            "rpc_duration_seconds",
            "CSI RPC latency per method",
            self.latency.clone(),
        );
    }

    /// RPCs of `method` (`CreateVolume`, `NodeStageVolume`, ...) handled so far, whatever
    /// their outcome: an embedding process reads them to tell which path served an operation.
    pub fn calls(&self, method: &str) -> u64 {
        self.per_method.get_or_create(&method.to_string()).get()
    }

    /// RPCs of `method` that ended with OK.
    pub fn succeeded(&self, method: &str) -> u64 {
        self.calls
            .get_or_create(&vec![
                ("method".to_string(), method.to_string()),
                ("code".to_string(), "OK".to_string()),
            ])
            .get()
    }

    fn record(&self, path: &str, code: &str, seconds: f64) {
        let method = path.rsplit('/').next().unwrap_or(path).to_string();
        self.per_method.get_or_create(&method).inc();
        self.calls
            .get_or_create(&vec![
                ("method".to_string(), method.clone()),
                ("code".to_string(), code.to_string()),
            ])
            .inc();
        self.latency
            .get_or_create(&vec![("method".to_string(), method)])
            .observe(seconds);
    }
}

/// A tower layer for the tonic server that records every RPC.
#[derive(Debug, Clone)]
pub struct RpcMetricsLayer(pub RpcMetrics);

impl<S> tower::Layer<S> for RpcMetricsLayer {
    type Service = RpcMetricsService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        RpcMetricsService {
            inner,
            metrics: self.0.clone(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct RpcMetricsService<S> {
    inner: S,
    metrics: RpcMetrics,
}

impl<S, B, RB> tower::Service<http::Request<B>> for RpcMetricsService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = std::result::Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<std::result::Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let path = req.uri().path().to_string();
        let metrics = self.metrics.clone();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let started = Instant::now();
            let result = fut.await;
            // Errors are trailers-only responses, with grpc-status in the headers; a success
            // carries it in the trailers, after the body.
            let code = match &result {
                Ok(resp) => resp
                    .headers()
                    .get("grpc-status")
                    .and_then(|v| v.to_str().ok())
                    .map(|c| csi_spec::go_code_name(tonic::Code::from_i32(c.parse().unwrap_or(2))))
                    .unwrap_or("OK"),
                Err(_) => "transport error",
            };
            metrics.record(&path, code, started.elapsed().as_secs_f64());
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rpc_metrics_are_named_once_csi() {
        let mut registry = Registry::with_prefix("ebs_csi");
        let m = RpcMetrics::default();
        m.register(&mut registry);
        m.record(
            "/csi.v1.Controller/CreateVolume",
            csi_spec::go_code_name(tonic::Code::Ok),
            0.01,
        );
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("ebs_csi_rpc_requests_total{method=\"CreateVolume\",code=\"OK\"} 1"),
            "{text}"
        );
        assert!(text.contains("ebs_csi_rpc_duration_seconds_count{method=\"CreateVolume\"} 1"));
        assert!(!text.contains("csi_csi"), "{text}");
    }

    #[test]
    fn calls_are_counted_per_method_whatever_the_code() {
        let m = RpcMetrics::default();
        let shared = m.clone();
        m.record("/csi.v1.Node/NodeStageVolume", "OK", 0.01);
        m.record("/csi.v1.Node/NodeStageVolume", "Internal", 0.01);
        m.record("/csi.v1.Node/NodePublishVolume", "OK", 0.01);
        assert_eq!(shared.calls("NodeStageVolume"), 2);
        assert_eq!(shared.succeeded("NodeStageVolume"), 1);
        assert_eq!(shared.calls("NodePublishVolume"), 1);
        assert_eq!(shared.calls("CreateVolume"), 0);
        // The per-method total is not a series of its own.
        let mut registry = Registry::default();
        m.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let requests = text
            .lines()
            .filter(|l| l.starts_with("rpc_requests_total{") && l.contains("NodeStageVolume"))
            .count();
        assert_eq!(requests, 2, "one series per code: {text}");
        assert!(!text.contains("per_method"), "{text}");
    }
}
