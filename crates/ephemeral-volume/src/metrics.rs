//! Prometheus metrics with kube-controller-manager's names:
//! `ephemeral_volume_controller_create_total` (claims the controller tried to create) and
//! `ephemeral_volume_controller_create_failures_total` (creates the API server refused).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;

/// Everything the controller records.
#[derive(Debug, Default, Clone)]
pub struct Metrics {
    creates: Counter,
    failures: Counter,
}

impl Metrics {
    /// Registers the counters (the text format appends `_total` to a counter's name).
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "ephemeral_volume_controller_create",
            "Number of PersistentVolumeClaim creation requests",
            m.creates.clone(),
        );
        registry.register(
            "ephemeral_volume_controller_create_failures",
            "Number of PersistentVolumeClaim creation requests that failed",
            m.failures.clone(),
        );
        m
    }

    pub(crate) fn create_attempt(&self) {
        self.creates.inc();
    }

    pub(crate) fn create_failure(&self) {
        self.failures.inc();
    }

    /// Creation requests so far.
    pub fn creates(&self) -> u64 {
        self.creates.get()
    }

    /// Failed creation requests so far.
    pub fn failures(&self) -> u64 {
        self.failures.get()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn names_are_kubernetes() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        m.create_attempt();
        m.create_attempt();
        m.create_failure();
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        for want in [
            "ephemeral_volume_controller_create_total 2",
            "ephemeral_volume_controller_create_failures_total 1",
        ] {
            assert!(text.contains(want), "{want} missing in\n{text}");
        }
    }
}
