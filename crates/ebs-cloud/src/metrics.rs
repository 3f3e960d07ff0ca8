//! EC2 call metrics per action: calls (every attempt), errors by code, throttles, latency.

use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;

fn new_histogram() -> Histogram {
    // 5 ms .. ~40 s: a local simulator answers in milliseconds, a slow AWS call takes seconds.
    Histogram::new(exponential_buckets(0.005, 2.0, 14))
}

/// Cheap to clone; all clones share the series.
#[derive(Debug, Clone)]
pub struct CloudMetrics {
    calls: Family<Labels, Counter>,
    errors: Family<Labels, Counter>,
    throttles: Family<Labels, Counter>,
    latency: Family<Labels, Histogram, fn() -> Histogram>,
}

impl Default for CloudMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl CloudMetrics {
    pub fn new() -> Self {
        Self {
            calls: Family::default(),
            errors: Family::default(),
            throttles: Family::default(),
            latency: Family::new_with_constructor(new_histogram as fn() -> Histogram),
        }
    }

    /// Adds the series to a registry (once per registry).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "ec2_api_requests",
            "EC2 API requests sent, per action (every attempt, retries included)",
            self.calls.clone(),
        );
        registry.register(
            "ec2_api_errors",
            "EC2 API requests that failed, per action and error code",
            self.errors.clone(),
        );
        registry.register(
            "ec2_api_throttles",
            "EC2 API requests answered with a throttling error, per action",
            self.throttles.clone(),
        );
        registry.register(
            "ec2_api_request_duration_seconds",
            "EC2 API request latency per action (one attempt)",
            self.latency.clone(),
        );
    }

    /// Records one attempt: `error` is the EC2 error code when it failed.
    pub fn record(&self, action: &str, error: Option<&str>, elapsed: Duration, throttled: bool) {
        let l = vec![("action".to_string(), action.to_string())];
        self.calls.get_or_create(&l).inc();
        self.latency
            .get_or_create(&l)
            .observe(elapsed.as_secs_f64());
        if throttled {
            self.throttles.get_or_create(&l).inc();
        }
        if let Some(code) = error {
            let e = vec![
                ("action".to_string(), action.to_string()),
                ("code".to_string(), code.to_string()),
            ];
            self.errors.get_or_create(&e).inc();
        }
    }

    /// Requests sent for an action so far (tests and benchmarks).
    pub fn calls(&self, action: &str) -> u64 {
        self.calls
            .get_or_create(&vec![("action".to_string(), action.to_string())])
            .get()
    }

    /// Throttled requests for an action so far.
    pub fn throttles(&self, action: &str) -> u64 {
        self.throttles
            .get_or_create(&vec![("action".to_string(), action.to_string())])
            .get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_and_encodes() {
        let m = CloudMetrics::new();
        let mut r = Registry::default();
        m.register(&mut r);
        m.record("DescribeVolumes", None, Duration::from_millis(3), false);
        m.record(
            "DescribeVolumes",
            Some("RequestLimitExceeded"),
            Duration::from_millis(1),
            true,
        );
        assert_eq!(m.calls("DescribeVolumes"), 2);
        assert_eq!(m.throttles("DescribeVolumes"), 1);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).unwrap();
        assert!(
            text.contains("ec2_api_requests_total{action=\"DescribeVolumes\"} 2"),
            "{text}"
        );
        assert!(text.contains("code=\"RequestLimitExceeded\""), "{text}");
    }
}
