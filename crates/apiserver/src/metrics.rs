//! Prometheus metrics on `/metrics` (names after kube-apiserver's where they mean the same).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    verb: String,
    resource: String,
    code: String,
}

pub(crate) struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    watchers: Gauge,
    resource_version: Gauge,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        let watchers = Gauge::default();
        let resource_version = Gauge::default();
        registry.register(
            "apiserver_request",
            "Requests by verb (HTTP method, or WATCH), resource and response code",
            requests.clone(),
        );
        registry.register(
            "apiserver_registered_watchers",
            "Open watch streams",
            watchers.clone(),
        );
        registry.register(
            "apiserver_resource_version",
            "The current resourceVersion (etcd's revision)",
            resource_version.clone(),
        );
        Self {
            registry,
            requests,
            watchers,
            resource_version,
        }
    }

    pub fn request(&self, verb: &str, resource: &str, code: u16) {
        self.requests
            .get_or_create(&RequestLabels {
                verb: verb.to_string(),
                resource: resource.to_string(),
                code: code.to_string(),
            })
            .inc();
    }

    /// The text exposition, with the gauges read now.
    pub fn render(&self, watchers: usize, resource_version: u64) -> String {
        self.watchers
            .set(i64::try_from(watchers).unwrap_or(i64::MAX));
        self.resource_version
            .set(i64::try_from(resource_version).unwrap_or(i64::MAX));
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::warn!(error = %e, "encoding metrics failed");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_and_gauges() {
        let m = Metrics::new();
        m.request("GET", "pods", 200);
        m.request("GET", "pods", 200);
        let text = m.render(3, 42);
        assert!(
            text.contains("apiserver_request_total{verb=\"GET\",resource=\"pods\",code=\"200\"} 2"),
            "{text}"
        );
        assert!(text.contains("apiserver_registered_watchers 3"), "{text}");
        assert!(text.contains("apiserver_resource_version 42"), "{text}");
    }
}
