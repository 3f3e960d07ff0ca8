//! The "ADC and Kubelet CSI/In-tree Sync" of the migration design (docs/design/migration.md): which
//! backend serves an in-tree volume on a node. The attach/detach controller and the node agent both
//! call [`decide`] with their own migrated-plugin set and the node's CSINode, so a volume is
//! attached, mounted, unmounted and detached by one backend for its whole life.

use std::collections::BTreeSet;

use csi_translation::MIGRATED_PLUGINS_ANNOTATION;
use k8s_openapi::api::storage::v1::CSINode;

use crate::MigratedPlugins;
use crate::feature_gates::MIGRATION_GATES;

/// What the node's kubelet has told the control plane about migration, through its CSINode.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeMigrationInfo {
    /// Whether the CSINode exists. A kubelet too old for migration writes none.
    pub csinode_exists: bool,
    /// The in-tree plugin names in its `storage.alpha.kubernetes.io/migrated-plugins` annotation.
    pub migrated_plugins: BTreeSet<String>,
}

impl NodeMigrationInfo {
    /// From the node's CSINode, if it has one.
    pub fn from_csinode(csinode: Option<&CSINode>) -> Self {
        let Some(csinode) = csinode else {
            return Self::default();
        };
        let annotation = csinode
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(MIGRATED_PLUGINS_ANNOTATION));
        Self::from_annotation(annotation.map(String::as_str))
    }

    /// A CSINode exists, with this `migrated-plugins` annotation value (if any): plugin names,
    /// comma-separated, blanks ignored.
    pub fn from_annotation(value: Option<&str>) -> Self {
        Self {
            csinode_exists: true,
            migrated_plugins: value
                .unwrap_or_default()
                .split(',')
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(str::to_string)
                .collect(),
        }
    }
}

/// Which backend serves a volume of an in-tree plugin on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// The in-tree plugin (no CSI call at all).
    InTree,
    /// The plugin's CSI driver, with the volume translated by `csi-translation`.
    Csi { driver: &'static str },
    /// The kubelet serves the plugin through CSI but this component has it in-tree (the migration
    /// design: "an error should be thrown"): nothing may be attached; the message says what to
    /// change.
    Refused { reason: String },
}

/// The migration design's decision for a volume of `in_tree_plugin` (e.g. `kubernetes.io/aws-ebs`):
///
/// | node's CSINode | its annotation has the plugin | we migrated the plugin | backend |
/// |---|---|---|---|
/// | none | – | either | in-tree (the kubelet predates migration) |
/// | exists | no | either | in-tree (the kubelet's gate is off) |
/// | exists | yes | yes | CSI |
/// | exists | yes | no | refused: the kubelet would mount through CSI what we attached in-tree |
///
/// A plugin that has no CSI driver to migrate to is always in-tree.
pub fn decide(in_tree_plugin: &str, own: &MigratedPlugins, node: &NodeMigrationInfo) -> Backend {
    let Ok(driver) = csi_translation::csi_name_from_in_tree_name(in_tree_plugin) else {
        return Backend::InTree;
    };
    if !node.csinode_exists || !node.migrated_plugins.contains(in_tree_plugin) {
        return Backend::InTree;
    }
    if own.contains(in_tree_plugin) {
        return Backend::Csi { driver };
    }
    let gate = MIGRATION_GATES
        .iter()
        .find(|(_, plugin)| *plugin == in_tree_plugin)
        .map_or("its CSIMigration gate", |(gate, _)| gate);
    Backend::Refused {
        reason: format!(
            "the node's kubelet serves {in_tree_plugin} through the CSI driver {driver} (CSINode \
             annotation {MIGRATED_PLUGINS_ANNOTATION}) but this component has it in-tree: set \
             --feature-gates={gate}=true here, or drain the node and turn it off in its kubelet"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    const EBS: &str = "kubernetes.io/aws-ebs";

    fn csinode(annotation: Option<&str>) -> CSINode {
        CSINode {
            metadata: ObjectMeta {
                name: Some("node-1".into()),
                annotations: annotation
                    .map(|a| [(MIGRATED_PLUGINS_ANNOTATION.to_string(), a.to_string())].into()),
                ..ObjectMeta::default()
            },
            ..CSINode::default()
        }
    }

    /// The migration design's table, plus "no CSINode", for the controller with and without the
    /// gate.
    #[test]
    fn the_seed_table() {
        let on = MigratedPlugins::from_feature_gates("CSIMigrationAWS=true").unwrap();
        let off = MigratedPlugins::none();
        let csi = Backend::Csi {
            driver: "ebs.csi.aws.com",
        };
        let rows: [(&str, Option<CSINode>, &MigratedPlugins, Option<&Backend>); 8] = [
            (
                "no CSINode, controller migrated",
                None,
                &on,
                Some(&Backend::InTree),
            ),
            (
                "no CSINode, controller not migrated",
                None,
                &off,
                Some(&Backend::InTree),
            ),
            (
                "CSINode without annotation, controller migrated",
                Some(csinode(None)),
                &on,
                Some(&Backend::InTree),
            ),
            (
                "annotation lacks the plugin, controller migrated",
                Some(csinode(Some("kubernetes.io/gce-pd"))),
                &on,
                Some(&Backend::InTree),
            ),
            (
                "annotation lacks the plugin, controller not migrated",
                Some(csinode(Some(""))),
                &off,
                Some(&Backend::InTree),
            ),
            (
                "both migrated",
                Some(csinode(Some("kubernetes.io/gce-pd, kubernetes.io/aws-ebs"))),
                &on,
                Some(&csi),
            ),
            (
                "kubelet migrated, controller not",
                Some(csinode(Some(EBS))),
                &off,
                None,
            ),
            (
                "both migrated, annotation alone",
                Some(csinode(Some(EBS))),
                &on,
                Some(&csi),
            ),
        ];
        for (name, node, own, want) in rows {
            let got = decide(EBS, own, &NodeMigrationInfo::from_csinode(node.as_ref()));
            match want {
                Some(want) => assert_eq!(&got, want, "{name}"),
                None => match got {
                    Backend::Refused { reason } => {
                        assert!(reason.contains("CSIMigrationAWS=true"), "{name}: {reason}");
                        assert!(reason.contains("ebs.csi.aws.com"), "{name}: {reason}");
                    }
                    other => panic!("{name}: want refused, got {other:?}"),
                },
            }
        }
    }

    #[test]
    fn plugins_without_a_csi_driver_stay_in_tree() {
        let node = NodeMigrationInfo::from_annotation(Some("kubernetes.io/nfs"));
        let own: MigratedPlugins = ["kubernetes.io/nfs".to_string()].into_iter().collect();
        assert_eq!(decide("kubernetes.io/nfs", &own, &node), Backend::InTree);
    }
}
