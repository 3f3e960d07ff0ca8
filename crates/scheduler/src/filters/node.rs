//! Filters on the node alone: NodeUnschedulable, TaintToleration (with a not-Ready node seen
//! as carrying the `node.kubernetes.io/not-ready` taint the node lifecycle controller would
//! put on it) and NodeAffinity (`nodeSelector` and required node affinity). Also the label
//! matching that volume node affinity and `allowedTopologies` share.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, NodeSelectorTerm, Pod, Taint, Toleration};
use k8s_openapi::api::storage::v1::StorageClass;

/// kube-scheduler's reasons (counted per node in the FailedScheduling message).
pub(crate) const UNSCHEDULABLE: &str = "node(s) were unschedulable";
pub(crate) const AFFINITY_MISMATCH: &str = "node(s) didn't match Pod's node affinity/selector";
const NOT_READY_TAINT: &str = "node.kubernetes.io/not-ready";
const UNSCHEDULABLE_TAINT: &str = "node.kubernetes.io/unschedulable";

pub(crate) fn labels(node: &Node) -> &BTreeMap<String, String> {
    static EMPTY: BTreeMap<String, String> = BTreeMap::new();
    node.metadata.labels.as_ref().unwrap_or(&EMPTY)
}

pub(crate) fn name(node: &Node) -> &str {
    node.metadata.name.as_deref().unwrap_or_default()
}

/// The first reason `node` cannot take `pod` by itself, or `None`.
pub(crate) fn filter(pod: &Pod, node: &Node) -> Option<String> {
    let tolerations = pod
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or_default();
    let unschedulable = node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
    let tolerates_unschedulable = tolerations.iter().any(|t| {
        tolerates(
            t,
            &Taint {
                key: UNSCHEDULABLE_TAINT.into(),
                effect: "NoSchedule".into(),
                ..Default::default()
            },
        )
    });
    if unschedulable && !tolerates_unschedulable {
        return Some(UNSCHEDULABLE.into());
    }
    let mut taints: Vec<Taint> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    if !is_ready(node) && !taints.iter().any(|t| t.key == NOT_READY_TAINT) {
        taints.push(Taint {
            key: NOT_READY_TAINT.into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        });
    }
    let untolerated = taints.iter().find(|taint| {
        matches!(taint.effect.as_str(), "NoSchedule" | "NoExecute")
            && !tolerations.iter().any(|t| tolerates(t, taint))
    });
    if let Some(taint) = untolerated {
        return Some(format!(
            "node(s) had untolerated taint {{{}: {}}}",
            taint.key,
            taint.value.as_deref().unwrap_or_default()
        ));
    }
    if !matches_pod_affinity(pod, node) {
        return Some(AFFINITY_MISMATCH.into());
    }
    None
}

/// The node's Ready condition is True.
pub(crate) fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Kubernetes' ToleratesTaint: effect (empty tolerates all), then key and operator.
fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    if let Some(effect) = t.effect.as_deref().filter(|e| !e.is_empty())
        && effect != taint.effect
    {
        return false;
    }
    let key = t.key.as_deref().unwrap_or_default();
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match t.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        "Equal" | "" => {
            !key.is_empty()
                && t.value.as_deref().unwrap_or_default()
                    == taint.value.as_deref().unwrap_or_default()
        }
        _ => false,
    }
}

/// `spec.nodeSelector` and the required terms of `spec.affinity.nodeAffinity`.
fn matches_pod_affinity(pod: &Pod, node: &Node) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return true;
    };
    let node_labels = labels(node);
    if let Some(selector) = &spec.node_selector
        && !selector
            .iter()
            .all(|(k, v)| node_labels.get(k).is_some_and(|have| have == v))
    {
        return false;
    }
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    match required {
        Some(selector) => matches_terms(&selector.node_selector_terms, node),
        None => true,
    }
}

/// Whether `terms` admit the node (Kubernetes' NodeSelector rules, shared with the PV controller).
pub(crate) fn matches_terms(terms: &[NodeSelectorTerm], node: &Node) -> bool {
    component_runtime::node_selector::terms_match(terms, name(node), labels(node))
}

/// A class's `allowedTopologies` admits the node (no list: every node).
pub(crate) fn class_allows(class: &StorageClass, node: &Node) -> bool {
    let Some(terms) = class
        .allowed_topologies
        .as_deref()
        .filter(|t| !t.is_empty())
    else {
        return true;
    };
    let node_labels = labels(node);
    terms.iter().any(|term| {
        term.match_label_expressions
            .as_deref()
            .unwrap_or_default()
            .iter()
            .all(|e| {
                node_labels
                    .get(&e.key)
                    .is_some_and(|v| e.values.contains(v))
            })
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use serde_json::json;

    fn node(v: serde_json::Value) -> Node {
        serde_json::from_value(v).unwrap()
    }

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": spec})).unwrap()
    }

    fn ready(name: &str, labels: serde_json::Value) -> Node {
        node(json!({"metadata": {"name": name, "labels": labels},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}))
    }

    #[test]
    fn readiness_unschedulable_and_taints() {
        let p = pod(json!({"containers": []}));
        assert_eq!(filter(&p, &ready("a", json!({}))), None);
        let not_ready = node(json!({"metadata": {"name": "a"}}));
        assert_eq!(
            filter(&p, &not_ready).unwrap(),
            "node(s) had untolerated taint {node.kubernetes.io/not-ready: }"
        );
        let mut cordoned = ready("a", json!({}));
        cordoned.spec = Some(serde_json::from_value(json!({"unschedulable": true})).unwrap());
        assert_eq!(filter(&p, &cordoned).unwrap(), UNSCHEDULABLE);
        let mut tainted = ready("a", json!({}));
        tainted.spec = Some(
            serde_json::from_value(
                json!({"taints": [{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]}),
            )
            .unwrap(),
        );
        assert_eq!(
            filter(&p, &tainted).unwrap(),
            "node(s) had untolerated taint {dedicated: db}"
        );
        let tolerant = pod(json!({"containers": [], "tolerations": [
            {"key": "dedicated", "operator": "Equal", "value": "db", "effect": "NoSchedule"}]}));
        assert_eq!(filter(&tolerant, &tainted), None);
        let everything = pod(json!({"containers": [], "tolerations": [{"operator": "Exists"}]}));
        assert_eq!(filter(&everything, &not_ready), None);
    }

    #[test]
    fn selector_and_required_affinity() {
        let n = ready("node-1", json!({"zone": "a", "gen": "3"}));
        let sel = pod(json!({"containers": [], "nodeSelector": {"zone": "b"}}));
        assert_eq!(filter(&sel, &n).unwrap(), AFFINITY_MISMATCH);
        let aff = |expr: serde_json::Value| {
            pod(json!({"containers": [], "affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [expr]}}}}))
        };
        for (term, fits) in [
            (
                json!({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}),
                true,
            ),
            (
                json!({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}),
                false,
            ),
            (
                json!({"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["2"]}]}),
                true,
            ),
            (
                json!({"matchExpressions": [{"key": "gen", "operator": "Lt", "values": ["2"]}]}),
                false,
            ),
            (
                json!({"matchExpressions": [{"key": "x", "operator": "DoesNotExist"}]}),
                true,
            ),
            (
                json!({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}),
                true,
            ),
            (
                json!({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-2"]}]}),
                false,
            ),
            (json!({}), false),
        ] {
            assert_eq!(filter(&aff(term.clone()), &n).is_none(), fits, "{term}");
        }
    }

    #[test]
    fn allowed_topologies() {
        let n = ready("n", json!({"topology.hostpath.csi/node": "n"}));
        let class = |t: serde_json::Value| -> StorageClass {
            serde_json::from_value(
                json!({"metadata": {"name": "c"}, "provisioner": "p", "allowedTopologies": t}),
            )
            .unwrap()
        };
        assert!(class_allows(&class(json!([])), &n));
        assert!(class_allows(
            &class(
                json!([{"matchLabelExpressions": [{"key": "topology.hostpath.csi/node", "values": ["x", "n"]}]}])
            ),
            &n
        ));
        assert!(!class_allows(
            &class(
                json!([{"matchLabelExpressions": [{"key": "topology.hostpath.csi/node", "values": ["x"]}]}])
            ),
            &n
        ));
    }
}
