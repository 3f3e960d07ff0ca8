//! Prometheus metrics with kube-scheduler's names: `scheduler_schedule_attempts_total{result,
//! profile}` (result `scheduled`, `unschedulable` or `error`) and
//! `scheduler_pending_pods{queue}` (`active`, `backoff`, `gated`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AttemptLabels {
    result: String,
    profile: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabels {
    queue: String,
}

/// How one scheduling attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Scheduled,
    Unschedulable,
    Error,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Self::Scheduled => "scheduled",
            Self::Unschedulable => "unschedulable",
            Self::Error => "error",
        }
    }
}

/// Pending pods by queue, for one pass.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Pending {
    pub active: i64,
    pub backoff: i64,
    pub gated: i64,
}

/// Everything the scheduler records.
#[derive(Debug)]
pub struct Metrics {
    attempts: Family<AttemptLabels, Counter>,
    pending: Family<QueueLabels, Gauge>,
    profile: String,
}

impl Metrics {
    pub fn register(registry: &mut Registry, profile: &str) -> Self {
        let m = Self {
            attempts: Family::default(),
            pending: Family::default(),
            profile: profile.to_string(),
        };
        registry.register(
            "scheduler_schedule_attempts",
            "Number of attempts to schedule pods, by the result. 'unschedulable' means a pod could not be scheduled, while 'error' means an internal scheduler problem.",
            m.attempts.clone(),
        );
        registry.register(
            "scheduler_pending_pods",
            "Number of pending pods, by the queue type.",
            m.pending.clone(),
        );
        m
    }

    pub(crate) fn attempt(&self, outcome: Outcome) {
        self.attempts
            .get_or_create(&AttemptLabels {
                result: outcome.as_str().into(),
                profile: self.profile.clone(),
            })
            .inc();
    }

    pub(crate) fn set_pending(&self, p: Pending) {
        for (queue, value) in [
            ("active", p.active),
            ("backoff", p.backoff),
            ("gated", p.gated),
        ] {
            self.pending
                .get_or_create(&QueueLabels {
                    queue: queue.into(),
                })
                .set(value);
        }
    }

    /// Attempts so far with `outcome` (tests and csi-cluster's status read it).
    pub fn attempts(&self, outcome: Outcome) -> u64 {
        self.attempts
            .get_or_create(&AttemptLabels {
                result: outcome.as_str().into(),
                profile: self.profile.clone(),
            })
            .get()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn names_are_kube_schedulers() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry, "default-scheduler");
        m.attempt(Outcome::Scheduled);
        m.set_pending(Pending {
            active: 2,
            ..Default::default()
        });
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for want in [
            "scheduler_schedule_attempts_total{result=\"scheduled\",profile=\"default-scheduler\"} 1",
            "scheduler_pending_pods{queue=\"active\"} 2",
        ] {
            assert!(text.contains(want), "{want} missing in\n{text}");
        }
        assert_eq!(m.attempts(Outcome::Scheduled), 1);
    }
}
