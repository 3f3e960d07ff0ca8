//! `FailedScheduling` messages in kube-scheduler's shape, which operators and tools grep:
//! `0/3 nodes are available: 1 node(s) were unschedulable, 2 node(s) had volume node affinity
//! conflict. preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling.`
//! Reasons are counted per node and sorted as strings, as kube-scheduler sorts them; a
//! pre-filter failure (a missing claim) stands alone in place of the per-node reasons. This
//! scheduler never preempts, so the preemption part always says it would not help.

use std::collections::BTreeMap;

fn preemption(total: usize) -> String {
    format!(
        "preemption: 0/{total} nodes are available: {total} Preemption is not helpful for scheduling."
    )
}

/// Every node failed a filter: `reasons` maps each reason to how many nodes gave it.
pub(crate) fn fit_error(total: usize, reasons: &BTreeMap<String, usize>) -> String {
    if total == 0 {
        return "no nodes available to schedule pods".into();
    }
    let mut parts: Vec<String> = reasons.iter().map(|(r, n)| format!("{n} {r}")).collect();
    parts.sort();
    format!(
        "0/{total} nodes are available: {}. {}",
        parts.join(", "),
        preemption(total)
    )
}

/// The pod failed before any node was looked at.
pub(crate) fn pre_filter_error(total: usize, message: &str) -> String {
    if total == 0 {
        return "no nodes available to schedule pods".into();
    }
    format!(
        "0/{total} nodes are available: {message}. {}",
        preemption(total)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worded_as_kube_scheduler() {
        let reasons = BTreeMap::from([
            ("node(s) had volume node affinity conflict".to_string(), 2),
            (
                "node(s) didn't match Pod's node affinity/selector".to_string(),
                1,
            ),
        ]);
        assert_eq!(
            fit_error(3, &reasons),
            "0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, 2 node(s) had volume node affinity conflict. preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."
        );
        assert_eq!(
            pre_filter_error(2, "persistentvolumeclaim \"data\" not found"),
            "0/2 nodes are available: persistentvolumeclaim \"data\" not found. preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling."
        );
        assert_eq!(
            fit_error(0, &BTreeMap::new()),
            "no nodes available to schedule pods"
        );
    }
}
