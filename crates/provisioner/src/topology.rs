//! CreateVolume's `accessibility_requirements`, built as the Go sidecar builds them:
//!
//! - a selected node (WaitForFirstConsumer): its segment (its labels for the topology keys its
//!   CSINode lists for our driver) is preferred first; requisite is `allowedTopologies`, else
//!   every node's segment with the same keys, or with `--strict-topology` that one segment;
//! - no selected node (Immediate): requisite is `allowedTopologies`, else with
//!   `--immediate-topology` every node's segment, else nothing; preferred is requisite sorted
//!   and rotated by a hash of the volume name, so volumes spread over the segments.

use std::collections::{BTreeMap, BTreeSet};

use csi_spec::v1::{Topology, TopologyRequirement};
use k8s_openapi::api::core::v1::TopologySelectorTerm;

use crate::Error;

/// A topology segment: key → value.
pub type Segment = BTreeMap<String, String>;

/// What we know of one node for our driver: its CSINode topology keys and its labels.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeTopology {
    pub name: String,
    pub keys: Vec<String>,
    pub labels: BTreeMap<String, String>,
}

impl NodeTopology {
    /// The node's segment; every key must be a label of the node.
    pub fn segment(&self) -> Result<Segment, Error> {
        self.keys
            .iter()
            .map(|k| {
                self.labels.get(k).map(|v| (k.clone(), v.clone())).ok_or_else(|| {
                    Error::Topology(format!(
                        "topology labels from selected node {:?} does not match topology keys from CSINode: node has no label {k:?}",
                        self.name
                    ))
                })
            })
            .collect()
    }
}

/// Everything the requirement depends on.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    /// The selected node, when the claim has one.
    pub selected: Option<&'a NodeTopology>,
    /// Every node whose CSINode lists our driver.
    pub nodes: &'a [NodeTopology],
    /// The class's `allowedTopologies` (empty: none).
    pub allowed: &'a [TopologySelectorTerm],
    pub strict: bool,
    pub immediate: bool,
    /// Seeds the rotation of `preferred` when there is no selected node.
    pub volume_name: &'a str,
}

/// The requirement, or `None` when there is no topology to ask for.
pub fn requirements(i: Inputs<'_>) -> Result<Option<TopologyRequirement>, Error> {
    let selected = i.selected.map(NodeTopology::segment).transpose()?;
    let allowed = flatten(i.allowed);
    let requisite: BTreeSet<Segment> = match (&selected, allowed.is_empty()) {
        (Some(seg), _) if i.strict => BTreeSet::from([seg.clone()]),
        (_, false) => allowed,
        (Some(_), true) => {
            let keys = i.selected.map(|n| sorted(&n.keys)).unwrap_or_default();
            segments_with_keys(i.nodes, &keys)
        }
        (None, true) if i.immediate => {
            let keys = i
                .nodes
                .iter()
                .find(|n| !n.keys.is_empty())
                .map(|n| sorted(&n.keys));
            keys.map(|k| segments_with_keys(i.nodes, &k))
                .unwrap_or_default()
        }
        (None, true) => BTreeSet::new(),
    };
    if requisite.is_empty() && selected.is_none() {
        return Ok(None);
    }
    let mut requisite: Vec<Segment> = requisite.into_iter().collect();
    let preferred: Vec<Segment> = match &selected {
        Some(seg) => {
            if !requisite.contains(seg) {
                requisite.push(seg.clone());
            }
            std::iter::once(seg.clone())
                .chain(requisite.iter().filter(|s| *s != seg).cloned())
                .collect()
        }
        None => {
            let mut p = requisite.clone();
            if !p.is_empty() {
                let shift = fnv(i.volume_name) % p.len();
                p.rotate_left(shift);
            }
            p
        }
    };
    Ok(Some(TopologyRequirement {
        requisite: requisite.into_iter().map(topology).collect(),
        preferred: preferred.into_iter().map(topology).collect(),
    }))
}

fn sorted(keys: &[String]) -> Vec<String> {
    let mut k = keys.to_vec();
    k.sort();
    k
}

/// Segments of the nodes whose keys are exactly `keys` (the Go sidecar skips nodes with
/// other keys: they are of another topology generation of the driver).
fn segments_with_keys(nodes: &[NodeTopology], keys: &[String]) -> BTreeSet<Segment> {
    nodes
        .iter()
        .filter(|n| sorted(&n.keys) == keys)
        .filter_map(|n| n.segment().ok())
        .filter(|s| !s.is_empty())
        .collect()
}

/// Each term is the product of its expressions' values.
fn flatten(terms: &[TopologySelectorTerm]) -> BTreeSet<Segment> {
    let mut out = BTreeSet::new();
    for term in terms {
        let mut segments = vec![Segment::new()];
        for expr in term.match_label_expressions.iter().flatten() {
            segments = segments
                .into_iter()
                .flat_map(|s| {
                    expr.values.iter().map(move |v| {
                        let mut s = s.clone();
                        s.insert(expr.key.clone(), v.clone());
                        s
                    })
                })
                .collect();
        }
        out.extend(segments.into_iter().filter(|s| !s.is_empty()));
    }
    out
}

fn topology(s: Segment) -> Topology {
    Topology {
        segments: s.into_iter().collect(),
    }
}

/// FNV-1a: a stable hash (std's is seeded per process).
fn fnv(s: &str) -> usize {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    usize::try_from(h % 1_000_003).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use k8s_openapi::api::core::v1::TopologySelectorLabelRequirement;

    const K: &str = "topology.hostpath.csi/node";

    fn node(name: &str) -> NodeTopology {
        NodeTopology {
            name: name.into(),
            keys: vec![K.into()],
            labels: [(K.to_string(), name.to_string())].into(),
        }
    }

    fn seg(v: &str) -> Topology {
        topology([(K.to_string(), v.to_string())].into())
    }

    fn inputs<'a>(
        selected: Option<&'a NodeTopology>,
        nodes: &'a [NodeTopology],
        allowed: &'a [TopologySelectorTerm],
    ) -> Inputs<'a> {
        Inputs {
            selected,
            nodes,
            allowed,
            strict: false,
            immediate: true,
            volume_name: "pvc-1",
        }
    }

    #[test]
    fn selected_node_is_preferred_first_and_strict_narrows_requisite() {
        let nodes = [node("a"), node("b"), node("c")];
        let r = requirements(inputs(Some(&nodes[1]), &nodes, &[]))
            .unwrap()
            .unwrap();
        assert_eq!(r.requisite, vec![seg("a"), seg("b"), seg("c")]);
        assert_eq!(r.preferred[0], seg("b"));
        assert_eq!(r.preferred.len(), 3);
        let strict = Inputs {
            strict: true,
            ..inputs(Some(&nodes[1]), &nodes, &[])
        };
        let r = requirements(strict).unwrap().unwrap();
        assert_eq!((r.requisite, r.preferred), (vec![seg("b")], vec![seg("b")]));
    }

    #[test]
    fn allowed_topologies_are_flattened_and_immediate_can_be_off() {
        let nodes = [node("a"), node("b")];
        let allowed = [TopologySelectorTerm {
            match_label_expressions: Some(vec![TopologySelectorLabelRequirement {
                key: K.into(),
                values: vec!["x".into(), "y".into()],
            }]),
        }];
        let r = requirements(inputs(None, &nodes, &allowed))
            .unwrap()
            .unwrap();
        assert_eq!(r.requisite, vec![seg("x"), seg("y")]);
        let mut p = r.preferred.clone();
        p.sort_by_key(|t| t.segments.get(K).cloned());
        assert_eq!(p, r.requisite);
        let off = Inputs {
            immediate: false,
            ..inputs(None, &nodes, &[])
        };
        assert!(requirements(off).unwrap().is_none());
        let r = requirements(inputs(None, &nodes, &[])).unwrap().unwrap();
        assert_eq!(r.requisite, vec![seg("a"), seg("b")]);
    }

    #[test]
    fn a_selected_node_without_the_label_is_an_error() {
        let mut n = node("a");
        n.labels.clear();
        let e = requirements(inputs(Some(&n), &[], &[])).unwrap_err();
        assert!(e.to_string().contains(K), "{e}");
    }
}
