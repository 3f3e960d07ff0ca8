//! Prometheus metrics: calls per action and error code, and request latency per action.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    action: String,
    /// `OK` or the EC2 error code.
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ActionLabels {
    action: String,
}

fn latency_histogram() -> Histogram {
    // 100 µs .. ~3.3 s: covers in-memory calls up to realistic-profile fault latency.
    Histogram::new(exponential_buckets(0.0001, 2.0, 16))
}

pub(crate) struct Metrics {
    registry: Registry,
    calls: Family<CallLabels, Counter>,
    latency: Family<ActionLabels, Histogram, fn() -> Histogram>,
}

impl Metrics {
    pub(crate) fn new() -> Metrics {
        let mut registry = Registry::default();
        let calls = Family::<CallLabels, Counter>::default();
        let latency = Family::<ActionLabels, Histogram, fn() -> Histogram>::new_with_constructor(
            latency_histogram,
        );
        registry.register(
            "ec2sim_calls",
            "EC2 API calls by action and result code (OK or the error code)",
            calls.clone(),
        );
        registry.register(
            "ec2sim_request_duration_seconds",
            "Time to answer an EC2 API call, including injected latency",
            latency.clone(),
        );
        Metrics {
            registry,
            calls,
            latency,
        }
    }

    pub(crate) fn record(&self, action: &str, code: &str, seconds: f64) {
        self.calls
            .get_or_create(&CallLabels {
                action: action.to_string(),
                code: code.to_string(),
            })
            .inc();
        self.latency
            .get_or_create(&ActionLabels {
                action: action.to_string(),
            })
            .observe(seconds);
    }

    pub(crate) fn encode(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::error!(error = %e, "cannot encode metrics");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn text_has_counters_and_histogram() {
        let m = super::Metrics::new();
        m.record("DescribeVolumes", "OK", 0.001);
        m.record("DescribeVolumes", "RequestLimitExceeded", 0.001);
        let text = m.encode();
        assert!(
            text.contains(r#"ec2sim_calls_total{action="DescribeVolumes",code="OK"} 1"#),
            "{text}"
        );
        assert!(text.contains(r#"code="RequestLimitExceeded"} 1"#), "{text}");
        assert!(
            text.contains("ec2sim_request_duration_seconds_count{action=\"DescribeVolumes\"} 2"),
            "{text}"
        );
    }
}
