//! Zone and region topology shared by the plugins.
//!
//! In-tree PVs carry their zone in labels (`failure-domain.beta.kubernetes.io/zone`, later
//! `topology.kubernetes.io/zone`; a regional disk lists several zones joined by `__`) and/or in
//! `spec.nodeAffinity`. CSI PVs carry it in `spec.nodeAffinity` under the driver's own key
//! (e.g. `topology.gke.io/zone`). These helpers move requirements between those keys.
//!
//! The public functions take `&PersistentVolume` and return a new one; the `*_mut` versions work
//! on the copy a plugin is already building.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, PersistentVolume,
    TopologySelectorLabelRequirement, TopologySelectorTerm, VolumeNodeAffinity,
};

use crate::{Error, Result};

/// GA zone label / node-affinity key.
pub const LABEL_TOPOLOGY_ZONE: &str = "topology.kubernetes.io/zone";
/// GA region label / node-affinity key.
pub const LABEL_TOPOLOGY_REGION: &str = "topology.kubernetes.io/region";
/// Beta (deprecated) zone label.
pub const LABEL_FAILURE_DOMAIN_BETA_ZONE: &str = "failure-domain.beta.kubernetes.io/zone";
/// Beta (deprecated) region label.
pub const LABEL_FAILURE_DOMAIN_BETA_REGION: &str = "failure-domain.beta.kubernetes.io/region";
/// Separator of the zones of a regional (multi-zone) volume in a zone label.
pub const LABEL_MULTI_ZONE_DELIMITER: &str = "__";

/// Derives the one region that a list of zones belongs to.
pub type RegionParser = fn(&[String]) -> Result<String>;

/// Whether `key` appears in any match expression of the PV's required node affinity.
pub fn topology_key_exists(pv: &PersistentVolume, key: &str) -> bool {
    terms(pv).iter().any(|term| {
        term.match_expressions
            .iter()
            .flatten()
            .any(|req| req.key == key)
    })
}

/// The zone and region label pair a PV uses: GA or beta. Node affinity wins over labels, GA
/// over beta; with neither, GA.
pub fn topology_labels(pv: &PersistentVolume) -> (&'static str, &'static str) {
    let ga = (LABEL_TOPOLOGY_ZONE, LABEL_TOPOLOGY_REGION);
    let beta = (
        LABEL_FAILURE_DOMAIN_BETA_ZONE,
        LABEL_FAILURE_DOMAIN_BETA_REGION,
    );
    if topology_key_exists(pv, LABEL_TOPOLOGY_ZONE) {
        return ga;
    }
    if topology_key_exists(pv, LABEL_FAILURE_DOMAIN_BETA_ZONE) {
        return beta;
    }
    let labels = pv.metadata.labels.as_ref();
    if labels.is_some_and(|l| l.contains_key(LABEL_TOPOLOGY_ZONE)) {
        return ga;
    }
    if labels.is_some_and(|l| l.contains_key(LABEL_FAILURE_DOMAIN_BETA_ZONE)) {
        return beta;
    }
    ga
}

/// All distinct values of `key` in the PV's node affinity, sorted. Several terms are ORed, so
/// their values are collapsed into one list.
pub fn topology_values(pv: &PersistentVolume, key: &str) -> Vec<String> {
    let set: BTreeSet<&String> = terms(pv)
        .iter()
        .flat_map(|term| term.match_expressions.iter().flatten())
        .filter(|req| req.key == key)
        .flat_map(|req| req.values.iter().flatten())
        .collect();
    set.into_iter().cloned().collect()
}

/// Returns a copy of `pv` with `old_key` renamed to `new_key` in every node-affinity
/// requirement. Existing `new_key` requirements are not merged with the renamed ones.
pub fn replace_topology(pv: &PersistentVolume, old_key: &str, new_key: &str) -> PersistentVolume {
    let mut out = pv.clone();
    replace_topology_mut(&mut out, old_key, new_key);
    out
}

/// Returns a copy of `pv` with a `key In zones` requirement appended to every node-selector
/// term (one term is created when there is none). Zones are trimmed, deduplicated and sorted;
/// an error when no non-blank zone is left.
pub fn add_topology(
    pv: &PersistentVolume,
    key: &str,
    zones: &[String],
) -> Result<PersistentVolume> {
    let mut out = pv.clone();
    add_topology_mut(&mut out, key, zones)?;
    Ok(out)
}

/// Returns a copy of `pv` whose in-tree zone topology (node affinity, else the zone label) is
/// expressed with the CSI key `csi_key`; a beta region requirement is upgraded to the GA key.
pub fn translate_topology_from_in_tree_to_csi(
    pv: &PersistentVolume,
    csi_key: &str,
) -> PersistentVolume {
    let mut out = pv.clone();
    translate_topology_from_in_tree_to_csi_mut(&mut out, csi_key);
    out
}

/// Returns a copy of `pv` whose CSI zone requirements (`csi_key`) are turned back into the
/// Kubernetes zone key, with zone (and, given a `region_parser`, region) labels and a region
/// requirement added where missing.
pub fn translate_topology_from_csi_to_in_tree(
    pv: &PersistentVolume,
    csi_key: &str,
    region_parser: Option<RegionParser>,
) -> Result<PersistentVolume> {
    let mut out = pv.clone();
    translate_topology_from_csi_to_in_tree_mut(&mut out, csi_key, region_parser)?;
    Ok(out)
}

/// StorageClass `allowedTopologies` with the beta and GA zone keys replaced by `key`; other keys
/// pass through unchanged.
pub fn translate_allowed_topologies(
    terms: Option<&[TopologySelectorTerm]>,
    key: &str,
) -> Option<Vec<TopologySelectorTerm>> {
    let terms = terms?;
    Some(
        terms
            .iter()
            .map(|term| TopologySelectorTerm {
                match_label_expressions: term.match_label_expressions.as_ref().map(|exprs| {
                    exprs
                        .iter()
                        .map(|exp| {
                            if exp.key == LABEL_FAILURE_DOMAIN_BETA_ZONE
                                || exp.key == LABEL_TOPOLOGY_ZONE
                            {
                                TopologySelectorLabelRequirement {
                                    key: key.to_string(),
                                    values: exp.values.clone(),
                                }
                            } else {
                                exp.clone()
                            }
                        })
                        .collect()
                }),
            })
            .collect(),
    )
}

/// One `allowedTopologies` term: `key` in `values` (the StorageClass `zone`/`zones` parameters).
pub fn generate_topology_selectors(key: &str, values: Vec<String>) -> Vec<TopologySelectorTerm> {
    vec![TopologySelectorTerm {
        match_label_expressions: Some(vec![TopologySelectorLabelRequirement {
            key: key.to_string(),
            values,
        }]),
    }]
}

fn terms(pv: &PersistentVolume) -> &[NodeSelectorTerm] {
    pv.spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
        .map(|r| r.node_selector_terms.as_slice())
        .unwrap_or(&[])
}

pub(crate) fn replace_topology_mut(pv: &mut PersistentVolume, old_key: &str, new_key: &str) {
    let Some(required) = pv
        .spec
        .as_mut()
        .and_then(|s| s.node_affinity.as_mut())
        .and_then(|a| a.required.as_mut())
    else {
        return;
    };
    for term in &mut required.node_selector_terms {
        for req in term.match_expressions.iter_mut().flatten() {
            if req.key == old_key {
                req.key = new_key.to_string();
            }
        }
    }
}

pub(crate) fn add_topology_mut(
    pv: &mut PersistentVolume,
    key: &str,
    zones: &[String],
) -> Result<()> {
    let filtered: BTreeSet<&str> = zones
        .iter()
        .map(|z| z.trim())
        .filter(|z| !z.is_empty())
        .collect();
    if filtered.is_empty() {
        return Err(Error::NoValidZones(zones.to_vec()));
    }
    let requirement = NodeSelectorRequirement {
        key: key.to_string(),
        operator: "In".to_string(),
        values: Some(filtered.into_iter().map(str::to_string).collect()),
    };
    let spec = pv.spec.get_or_insert_with(Default::default);
    let affinity = spec
        .node_affinity
        .get_or_insert_with(VolumeNodeAffinity::default);
    let required = affinity.required.get_or_insert_with(NodeSelector::default);
    if required.node_selector_terms.is_empty() {
        required
            .node_selector_terms
            .push(NodeSelectorTerm::default());
    }
    for term in &mut required.node_selector_terms {
        term.match_expressions
            .get_or_insert_with(Vec::new)
            .push(requirement.clone());
    }
    Ok(())
}

pub(crate) fn translate_topology_from_in_tree_to_csi_mut(pv: &mut PersistentVolume, csi_key: &str) {
    let (zone_label, region_label) = topology_labels(pv);
    if !topology_values(pv, zone_label).is_empty() {
        replace_topology_mut(pv, zone_label, csi_key);
    } else if let Some(label) = label(pv, zone_label) {
        let zones: Vec<String> = label
            .split(LABEL_MULTI_ZONE_DELIMITER)
            .map(str::to_string)
            .collect();
        // A blank zone label carries no topology: nothing to add (upstream ignores it too).
        let _ = add_topology_mut(pv, csi_key, &zones);
    }
    // Nodes of newer clusters only have the GA region label: upgrade a beta region requirement
    // so such a PV still schedules. The zone key was replaced above already.
    if region_label == LABEL_FAILURE_DOMAIN_BETA_REGION
        && !topology_values(pv, region_label).is_empty()
    {
        replace_topology_mut(pv, region_label, LABEL_TOPOLOGY_REGION);
    }
}

pub(crate) fn translate_topology_from_csi_to_in_tree_mut(
    pv: &mut PersistentVolume,
    csi_key: &str,
    region_parser: Option<RegionParser>,
) -> Result<()> {
    let (zone_label, region_label) = topology_labels(pv);
    replace_topology_mut(pv, csi_key, zone_label);
    let zones = topology_values(pv, zone_label);
    if zones.is_empty() {
        return Ok(());
    }
    let labels = pv.metadata.labels.get_or_insert_with(BTreeMap::new);
    labels
        .entry(zone_label.to_string())
        .or_insert_with(|| zones.join(LABEL_MULTI_ZONE_DELIMITER));
    if let Some(parse) = region_parser {
        let region = parse(&zones)?;
        labels
            .entry(region_label.to_string())
            .or_insert_with(|| region.clone());
        if !topology_key_exists(pv, region_label) {
            add_topology_mut(pv, region_label, &[region])?;
        }
    }
    Ok(())
}

pub(crate) fn label<'a>(pv: &'a PersistentVolume, key: &str) -> Option<&'a str> {
    pv.metadata.labels.as_ref()?.get(key).map(String::as_str)
}
