//! Classes of an in-tree plugin our driver replaces: parameters in the driver's terms going
//! in, the PV in the in-tree form coming out (what the in-tree provisioner would have stored,
//! so everything that reads in-tree PVs keeps working and migration can be turned off again).

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::StorageClass;

use crate::{Error, MIGRATED_TO_ANNOTATION, PROVISIONED_BY_ANNOTATION};

/// The class with parameters and allowedTopologies translated to the CSI driver's.
pub fn translate_class(in_tree_plugin: &str, class: &StorageClass) -> Result<StorageClass, Error> {
    csi_translation::translate_in_tree_storage_class_to_csi(in_tree_plugin, class).map_err(
        |source| Error::Translation {
            what: format!(
                "StorageClass {} of {in_tree_plugin} to CSI",
                class.metadata.name.as_deref().unwrap_or_default()
            ),
            source,
        },
    )
}

/// The CSI PV translated to the in-tree source, `provisioned-by: <in-tree plugin>` and
/// `migrated-to: <driver>` (the PV controller and the deleter read both).
pub fn to_in_tree(
    pv: &PersistentVolume,
    in_tree_plugin: &str,
    driver: &str,
) -> Result<PersistentVolume, Error> {
    let mut out =
        csi_translation::translate_csi_pv_to_in_tree(pv).map_err(|source| Error::Translation {
            what: format!(
                "PersistentVolume {} to in-tree",
                pv.metadata.name.as_deref().unwrap_or_default()
            ),
            source,
        })?;
    merge_duplicate_requirements(&mut out);
    let annotations = out
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    annotations.insert(PROVISIONED_BY_ANNOTATION.into(), in_tree_plugin.into());
    annotations.insert(MIGRATED_TO_ANNOTATION.into(), driver.into());
    Ok(out)
}

/// Drops a node selector requirement that repeats an earlier one of the same term. The EBS
/// driver reports a volume's zone under its own key and under `topology.kubernetes.io/zone`;
/// translation renames the first to the second, which leaves the zone requirement twice. The
/// requirements of a term are ANDed, so the copy changes nothing but makes the PV differ from
/// the one the in-tree provisioner writes.
fn merge_duplicate_requirements(pv: &mut PersistentVolume) {
    let terms = pv
        .spec
        .as_mut()
        .and_then(|s| s.node_affinity.as_mut())
        .and_then(|a| a.required.as_mut())
        .map(|r| &mut r.node_selector_terms);
    for term in terms.into_iter().flatten() {
        if let Some(expressions) = term.match_expressions.as_mut() {
            let mut seen = Vec::with_capacity(expressions.len());
            expressions.retain(|e| {
                let new = !seen.contains(e);
                if new {
                    seen.push(e.clone());
                }
                new
            });
        }
    }
}

/// An in-tree PV handed to our driver: its CSI form (for DeleteVolume's handle).
pub fn to_csi(pv: &PersistentVolume) -> Result<PersistentVolume, Error> {
    csi_translation::translate_in_tree_pv_to_csi(pv).map_err(|source| Error::Translation {
        what: format!(
            "PersistentVolume {} to CSI",
            pv.metadata.name.as_deref().unwrap_or_default()
        ),
        source,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn the_zone_reported_under_both_keys_is_one_in_tree_requirement() {
        let pv: PersistentVolume = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pvc-1"},
            "spec": {
                "csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-1"},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "topology.ebs.csi.aws.com/zone", "operator": "In", "values": ["us-east-1b"]},
                    {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-east-1b"]},
                ]}]}},
            },
        }))
        .unwrap();
        let out = to_in_tree(&pv, "kubernetes.io/aws-ebs", "ebs.csi.aws.com").unwrap();
        let keys: Vec<String> = out
            .spec
            .unwrap()
            .node_affinity
            .unwrap()
            .required
            .unwrap()
            .node_selector_terms[0]
            .match_expressions
            .clone()
            .unwrap()
            .into_iter()
            .map(|e| e.key)
            .collect();
        assert_eq!(
            keys,
            vec![
                "topology.kubernetes.io/zone",
                "topology.kubernetes.io/region"
            ]
        );
    }
}
