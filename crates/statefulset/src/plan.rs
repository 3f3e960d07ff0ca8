//! What one pass does to one set, decided from its pods alone (pure, unit-tested), following
//! Kubernetes' StatefulSet rules:
//!
//! - ordinals `0..replicas` are created in order; a Failed or Succeeded pod is deleted (and
//!   created again once it is gone); with `OrderedReady` the pass stops at the first pod that
//!   is missing, terminating, or not Running and Ready, so ordinal i+1 appears only after i
//!   is Running and Ready;
//! - ordinals `>= replicas` are condemned and deleted from the highest; with `OrderedReady`
//!   only while every other pod is Running and Ready, one at a time (the next after the
//!   previous is gone); with `Parallel` all at once.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

/// One write of a pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    /// Create the claims (if missing) and then pod `ordinal`.
    Create(i32),
    /// Delete this pod (by name); `condemned`: scale-down, else a finished pod to re-create.
    Delete { name: String, condemned: bool },
}

pub(crate) fn is_terminating(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default()
}

pub(crate) fn is_running_and_ready(pod: &Pod) -> bool {
    phase(pod) == "Running" && ready_since(pod).is_some()
}

/// When the pod's Ready condition turned True (`Some(None)`: True, time unknown).
pub(crate) fn ready_since(pod: &Pod) -> Option<Option<jiff::Timestamp>> {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready" && c.status == "True"))
        .map(|c| c.last_transition_time.as_ref().map(|t| t.0))
}

fn is_finished(pod: &Pod) -> bool {
    matches!(phase(pod), "Failed" | "Succeeded")
}

fn name(pod: &Pod) -> String {
    pod.metadata.name.clone().unwrap_or_default()
}

/// The writes of this pass for a set of `replicas` whose pods, by ordinal, are `pods`.
pub(crate) fn plan(replicas: i32, parallel: bool, pods: &BTreeMap<i32, Arc<Pod>>) -> Vec<Action> {
    let ordered = !parallel;
    let mut actions = Vec::new();
    for ordinal in 0..replicas.max(0) {
        match pods.get(&ordinal) {
            None => {
                actions.push(Action::Create(ordinal));
                if ordered {
                    return actions;
                }
            }
            Some(pod) if is_terminating(pod) => {
                if ordered {
                    return actions;
                }
            }
            Some(pod) if is_finished(pod) => {
                actions.push(Action::Delete {
                    name: name(pod),
                    condemned: false,
                });
                if ordered {
                    return actions;
                }
            }
            Some(pod) if !is_running_and_ready(pod) => {
                if ordered {
                    return actions;
                }
            }
            Some(_) => {}
        }
    }
    // Highest ordinal first.
    for (_, pod) in pods.range(replicas.max(0)..).rev() {
        if is_terminating(pod) {
            if ordered {
                return actions;
            }
            continue;
        }
        if ordered {
            // Scale down only a healthy set: every other pod Running and Ready.
            let unhealthy_other = pods
                .values()
                .any(|p| !std::ptr::eq(p.as_ref(), pod.as_ref()) && !is_running_and_ready(p));
            if unhealthy_other {
                return actions;
            }
        }
        actions.push(Action::Delete {
            name: name(pod),
            condemned: true,
        });
        if ordered {
            return actions;
        }
    }
    actions
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use serde_json::json;

    fn pod(ordinal: i32, state: &str) -> Arc<Pod> {
        let mut v =
            json!({"metadata": {"name": format!("web-{ordinal}")}, "status": {"phase": "Pending"}});
        match state {
            "ready" => {
                v["status"] = json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]});
            }
            "terminating" => v["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z"),
            "failed" => v["status"]["phase"] = json!("Failed"),
            _ => {}
        }
        Arc::new(serde_json::from_value(v).unwrap())
    }

    fn pods(states: &[&str]) -> BTreeMap<i32, Arc<Pod>> {
        states
            .iter()
            .enumerate()
            .filter(|(_, s)| **s != "-")
            .map(|(i, s)| (i as i32, pod(i as i32, s)))
            .collect()
    }

    fn delete(i: i32, condemned: bool) -> Action {
        Action::Delete {
            name: format!("web-{i}"),
            condemned,
        }
    }

    #[test]
    fn ordered_ready_goes_one_at_a_time() {
        assert_eq!(plan(3, false, &pods(&[])), vec![Action::Create(0)]);
        assert_eq!(plan(3, false, &pods(&["pending"])), vec![]);
        assert_eq!(plan(3, false, &pods(&["ready"])), vec![Action::Create(1)]);
        assert_eq!(plan(3, false, &pods(&["ready", "ready", "ready"])), vec![]);
        // A deleted pod in the middle comes back first.
        assert_eq!(
            plan(3, false, &pods(&["ready", "-", "ready"])),
            vec![Action::Create(1)]
        );
        assert_eq!(
            plan(3, false, &pods(&["ready", "failed"])),
            vec![delete(1, false)]
        );
    }

    #[test]
    fn ordered_scale_down_from_the_top_waiting_for_each() {
        let all = ["ready", "ready", "ready"];
        assert_eq!(plan(1, false, &pods(&all)), vec![delete(2, true)]);
        assert_eq!(
            plan(1, false, &pods(&["ready", "ready", "terminating"])),
            vec![]
        );
        assert_eq!(
            plan(1, false, &pods(&["ready", "ready"])),
            vec![delete(1, true)]
        );
        // Not while another pod is unhealthy.
        assert_eq!(
            plan(1, false, &pods(&["pending", "ready", "ready"])),
            vec![]
        );
    }

    #[test]
    fn parallel_does_everything_at_once() {
        assert_eq!(
            plan(3, true, &pods(&[])),
            vec![Action::Create(0), Action::Create(1), Action::Create(2)]
        );
        assert_eq!(
            plan(0, true, &pods(&["pending", "ready", "terminating"])),
            vec![delete(1, true), delete(0, true)]
        );
    }
}
