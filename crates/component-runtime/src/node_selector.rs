//! Kubernetes' NodeSelector rules (`nodeSelectorTerms` of a PV's node affinity, a pod's required
//! node affinity): the one implementation the scheduler, the PV controller and the provisioner's
//! node deployment share, so the three agree on which node a volume or pod may use.
//!
//! - terms are ORed; an empty list matches no node;
//! - within a term, `matchExpressions` (node labels) and `matchFields` are ANDed; a term with
//!   neither matches no node;
//! - `matchFields` supports `metadata.name` only (the API server accepts no other key); any
//!   other key does not match;
//! - operators `In`, `NotIn`, `Exists`, `DoesNotExist`, and `Gt`/`Lt` comparing integers; an
//!   unknown operator does not match.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm};

/// Whether any of `terms` admits the node `name` with `labels`.
pub fn terms_match(
    terms: &[NodeSelectorTerm],
    name: &str,
    labels: &BTreeMap<String, String>,
) -> bool {
    terms.iter().any(|t| term_matches(t, name, labels))
}

/// Whether every requirement of `term` holds for the node `name` with `labels`.
pub fn term_matches(
    term: &NodeSelectorTerm,
    name: &str,
    labels: &BTreeMap<String, String>,
) -> bool {
    let expressions = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if expressions.is_empty() && fields.is_empty() {
        return false;
    }
    expressions
        .iter()
        .all(|r| requirement_matches(r, labels.get(&r.key).map(String::as_str)))
        && fields
            .iter()
            .all(|r| r.key == "metadata.name" && requirement_matches(r, Some(name)))
}

/// Whether one requirement holds for the node's `value` of its key (`None`: no such label).
pub fn requirement_matches(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let contains = |v: &str| values.iter().any(|x| x == v);
    let number = |s: &str| s.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => value.is_some_and(contains),
        "NotIn" => value.is_none_or(|v| !contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(have), Some(bound)) = (
                value.and_then(number),
                values.first().and_then(|b| number(b)),
            ) else {
                return false;
            };
            if r.operator == "Gt" {
                have > bound
            } else {
                have < bound
            }
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn term(v: serde_json::Value) -> NodeSelectorTerm {
        serde_json::from_value(v).unwrap()
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn operators() {
        let l = labels(&[("zone", "a"), ("gen", "3")]);
        let m = |op: &str, key: &str, values: &[&str]| {
            term_matches(
                &term(
                    serde_json::json!({"matchExpressions": [{"key": key, "operator": op, "values": values}]}),
                ),
                "n1",
                &l,
            )
        };
        assert!(
            m("In", "zone", &["a", "b"]) && !m("In", "zone", &["b"]) && !m("In", "nope", &["a"])
        );
        assert!(
            m("NotIn", "zone", &["b"]) && !m("NotIn", "zone", &["a"]) && m("NotIn", "nope", &["a"])
        );
        assert!(m("Exists", "zone", &[]) && !m("Exists", "nope", &[]));
        assert!(m("DoesNotExist", "nope", &[]) && !m("DoesNotExist", "zone", &[]));
        assert!(m("Gt", "gen", &["2"]) && !m("Gt", "gen", &["3"]) && !m("Gt", "zone", &["1"]));
        assert!(m("Lt", "gen", &["4"]) && !m("Lt", "gen", &["3"]));
        assert!(!m("Sometimes", "zone", &["a"]));
    }

    #[test]
    fn fields_terms_and_empties() {
        let l = labels(&[("zone", "a")]);
        let by_name = |n: &str| {
            term(
                serde_json::json!({"matchFields": [{"key": "metadata.name", "operator": "In", "values": [n]}]}),
            )
        };
        assert!(term_matches(&by_name("n1"), "n1", &l));
        assert!(!term_matches(&by_name("n2"), "n1", &l));
        let other_field = term(
            serde_json::json!({"matchFields": [{"key": "spec.unschedulable", "operator": "DoesNotExist"}]}),
        );
        assert!(
            !term_matches(&other_field, "n1", &l),
            "only metadata.name is a field"
        );
        assert!(
            !term_matches(&term(serde_json::json!({})), "n1", &l),
            "an empty term matches nothing"
        );
        assert!(!terms_match(&[], "n1", &l), "no terms match nothing");
        assert!(
            terms_match(&[by_name("n2"), by_name("n1")], "n1", &l),
            "terms are ORed"
        );
        let both = term(serde_json::json!({
            "matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}],
            "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]
        }));
        assert!(
            !term_matches(&both, "n1", &l),
            "expressions and fields are ANDed"
        );
    }
}
