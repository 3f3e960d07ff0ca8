//! Should we provision this claim? The PV controller names the provisioner in the claim's
//! annotations (for a class of an in-tree plugin it migrated: our driver's name); we also
//! check the claim's StorageClass ourselves: its provisioner must be our driver or the
//! in-tree plugin our driver replaces.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;

use crate::{
    BETA_STORAGE_PROVISIONER_ANNOTATION, MIGRATED_TO_ANNOTATION, SELECTED_NODE_ANNOTATION,
    STORAGE_PROVISIONER_ANNOTATION,
};

/// The claim's class name before `spec.storageClassName` existed.
const BETA_STORAGE_CLASS_ANNOTATION: &str = "volume.beta.kubernetes.io/storage-class";

/// How the class reaches our driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClassKind {
    /// `provisioner: <our driver>`.
    Csi,
    /// `provisioner: <in-tree plugin>` that our driver replaces (CSI migration).
    MigratedInTree { in_tree_plugin: String },
}

/// What to do with a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Provision(ClassKind),
    /// Not ours, or not yet: the reason is logged at debug level.
    Skip(String),
}

/// The claim's StorageClass name (`spec.storageClassName`, else the beta annotation).
pub fn class_name(pvc: &PersistentVolumeClaim) -> Option<&str> {
    pvc.spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref())
        .or_else(|| annotation(pvc, BETA_STORAGE_CLASS_ANNOTATION))
        .filter(|s| !s.is_empty())
}

pub(crate) fn annotation<'a>(pvc: &'a PersistentVolumeClaim, key: &str) -> Option<&'a str> {
    pvc.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// The node the scheduler selected (WaitForFirstConsumer), if any.
pub fn selected_node(pvc: &PersistentVolumeClaim) -> Option<&str> {
    annotation(pvc, SELECTED_NODE_ANNOTATION).filter(|s| !s.is_empty())
}

/// Whether the class binds only once a pod is scheduled.
pub fn waits_for_first_consumer(class: &StorageClass) -> bool {
    class.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer")
}

/// The in-tree plugin `driver` replaces (`kubernetes.io/aws-ebs` for `ebs.csi.aws.com`).
fn in_tree_plugin_of(driver: &str) -> Option<&'static str> {
    csi_translation::in_tree_name_from_csi_name(driver)
        .ok()
        .filter(|p| csi_translation::is_migratable_in_tree_plugin_by_name(p))
}

/// Decides whether `driver` provisions `pvc` of `class` (`None`: the class does not exist),
/// as the Go sidecar does. The claim is ours when its storage-provisioner annotation names
/// our driver (kube-controller-manager v1.26 writes the driver's name there for a class of a
/// migrated in-tree plugin, and no `migrated-to`), or names the in-tree plugin our driver
/// replaces while `pv.kubernetes.io/migrated-to` names our driver (a claim annotated before
/// the plugin was migrated). A claim annotated for the in-tree plugin without `migrated-to`
/// is the in-tree provisioner's: provisioning it too would make two volumes.
pub fn decide(pvc: &PersistentVolumeClaim, class: Option<&StorageClass>, driver: &str) -> Decision {
    let skip = |why: String| Decision::Skip(why);
    let named = annotation(pvc, STORAGE_PROVISIONER_ANNOTATION)
        .or_else(|| annotation(pvc, BETA_STORAGE_PROVISIONER_ANNOTATION));
    let in_tree = in_tree_plugin_of(driver);
    let migrated_here = named.is_some()
        && named == in_tree
        && annotation(pvc, MIGRATED_TO_ANNOTATION) == Some(driver);
    if named != Some(driver) && !migrated_here {
        return skip(format!(
            "storage-provisioner annotation is {named:?}, not {driver} (nor {in_tree:?} with {MIGRATED_TO_ANNOTATION}: {driver})"
        ));
    }
    if pvc.metadata.deletion_timestamp.is_some() {
        return skip("the claim is being deleted".into());
    }
    let bound = pvc
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .is_some_and(|v| !v.is_empty());
    if bound {
        return skip("the claim is bound (spec.volumeName is set)".into());
    }
    let Some(class) = class else {
        return skip(format!("StorageClass {:?} not found", class_name(pvc)));
    };
    let kind = if class.provisioner == driver {
        ClassKind::Csi
    } else if Some(class.provisioner.as_str()) == in_tree {
        ClassKind::MigratedInTree {
            in_tree_plugin: class.provisioner.clone(),
        }
    } else {
        return skip(format!(
            "class provisioner is {}, not {driver}",
            class.provisioner
        ));
    };
    if waits_for_first_consumer(class) && selected_node(pvc).is_none() {
        return skip(format!(
            "WaitForFirstConsumer: no {SELECTED_NODE_ANNOTATION} yet"
        ));
    }
    Decision::Provision(kind)
}

/// [`decide`] for a provisioner deployed on one node (`--node-deployment`, `node`): only the
/// claims the scheduler placed on that node are its business. Immediate claims (no selected
/// node) and claims of other nodes are left alone: the driver there serves them.
pub fn decide_on_node(
    pvc: &PersistentVolumeClaim,
    class: Option<&StorageClass>,
    driver: &str,
    node: Option<&str>,
) -> Decision {
    let decision = decide(pvc, class, driver);
    let (Some(node), Decision::Provision(_)) = (node, &decision) else {
        return decision;
    };
    match selected_node(pvc) {
        Some(selected) if selected == node => decision,
        Some(selected) => Decision::Skip(format!(
            "--node-deployment: the selected node is {selected}, this provisioner serves {node}"
        )),
        None => Decision::Skip(
            "--node-deployment: no selected node (Immediate claims are not provisioned per node)"
                .into(),
        ),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use k8s_openapi::api::core::v1::PersistentVolumeClaimSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    const D: &str = "ebs.csi.aws.com";

    fn pvc(annotations: &[(&str, &str)]) -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some("c".into()),
                annotations: Some(
                    annotations
                        .iter()
                        .map(|(k, v)| ((*k).into(), (*v).into()))
                        .collect(),
                ),
                ..Default::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                storage_class_name: Some("sc".into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn class(provisioner: &str, wffc: bool) -> StorageClass {
        StorageClass {
            metadata: ObjectMeta {
                name: Some("sc".into()),
                ..Default::default()
            },
            provisioner: provisioner.into(),
            volume_binding_mode: wffc.then(|| "WaitForFirstConsumer".into()),
            ..Default::default()
        }
    }

    #[test]
    fn our_csi_class_is_provisioned_via_either_annotation() {
        let c = class(D, false);
        for key in [
            STORAGE_PROVISIONER_ANNOTATION,
            BETA_STORAGE_PROVISIONER_ANNOTATION,
        ] {
            assert_eq!(
                decide(&pvc(&[(key, D)]), Some(&c), D),
                Decision::Provision(ClassKind::Csi)
            );
        }
        assert!(matches!(
            decide(
                &pvc(&[(STORAGE_PROVISIONER_ANNOTATION, "other")]),
                Some(&c),
                D
            ),
            Decision::Skip(_)
        ));
        assert!(matches!(decide(&pvc(&[]), Some(&c), D), Decision::Skip(_)));
        assert!(matches!(
            decide(&pvc(&[(STORAGE_PROVISIONER_ANNOTATION, D)]), None, D),
            Decision::Skip(_)
        ));
        let mut bound = pvc(&[(STORAGE_PROVISIONER_ANNOTATION, D)]);
        bound.spec.as_mut().unwrap().volume_name = Some("pv".into());
        assert!(matches!(decide(&bound, Some(&c), D), Decision::Skip(_)));
    }

    #[test]
    fn in_tree_class_is_provisioned_as_kcm_v1_26_annotates_it() {
        let c = class("kubernetes.io/aws-ebs", false);
        let migrated = Decision::Provision(ClassKind::MigratedInTree {
            in_tree_plugin: "kubernetes.io/aws-ebs".into(),
        });
        // kcm v1.26: storage-provisioner (and its beta twin) name the driver, no migrated-to.
        let kcm = pvc(&[
            (STORAGE_PROVISIONER_ANNOTATION, D),
            (BETA_STORAGE_PROVISIONER_ANNOTATION, D),
        ]);
        assert_eq!(decide(&kcm, Some(&c), D), migrated);
        // Annotated for the in-tree plugin: its provisioner's, unless migrated-to names us.
        let in_tree = pvc(&[(STORAGE_PROVISIONER_ANNOTATION, "kubernetes.io/aws-ebs")]);
        assert!(matches!(decide(&in_tree, Some(&c), D), Decision::Skip(_)));
        let upgraded = pvc(&[
            (STORAGE_PROVISIONER_ANNOTATION, "kubernetes.io/aws-ebs"),
            (MIGRATED_TO_ANNOTATION, D),
        ]);
        assert_eq!(decide(&upgraded, Some(&c), D), migrated);
        // migrated-to alone does not make a claim of another provisioner ours.
        let other = pvc(&[
            (STORAGE_PROVISIONER_ANNOTATION, "example.com/nfs"),
            (MIGRATED_TO_ANNOTATION, D),
        ]);
        assert!(matches!(decide(&other, Some(&c), D), Decision::Skip(_)));
        // Another driver's in-tree plugin is never ours.
        let gce = class("kubernetes.io/gce-pd", false);
        assert!(matches!(decide(&kcm, Some(&gce), D), Decision::Skip(_)));
    }

    #[test]
    fn wait_for_first_consumer_waits_for_the_selected_node() {
        let c = class(D, true);
        assert!(matches!(
            decide(&pvc(&[(STORAGE_PROVISIONER_ANNOTATION, D)]), Some(&c), D),
            Decision::Skip(_)
        ));
        let p = pvc(&[
            (STORAGE_PROVISIONER_ANNOTATION, D),
            (SELECTED_NODE_ANNOTATION, "n1"),
        ]);
        assert_eq!(decide(&p, Some(&c), D), Decision::Provision(ClassKind::Csi));
    }

    #[test]
    fn a_node_deployed_provisioner_takes_only_its_node_s_claims() {
        let wffc = class(D, true);
        let on = |node: &str| {
            pvc(&[
                (STORAGE_PROVISIONER_ANNOTATION, D),
                (SELECTED_NODE_ANNOTATION, node),
            ])
        };
        assert_eq!(
            decide_on_node(&on("n1"), Some(&wffc), D, Some("n1")),
            Decision::Provision(ClassKind::Csi)
        );
        assert!(matches!(
            decide_on_node(&on("n2"), Some(&wffc), D, Some("n1")),
            Decision::Skip(_)
        ));
        // Immediate: no selected node, so no node-deployed provisioner takes it.
        let immediate = class(D, false);
        let plain = pvc(&[(STORAGE_PROVISIONER_ANNOTATION, D)]);
        assert!(matches!(
            decide_on_node(&plain, Some(&immediate), D, Some("n1")),
            Decision::Skip(_)
        ));
        // Without --node-deployment nothing changes.
        assert_eq!(
            decide_on_node(&plain, Some(&immediate), D, None),
            Decision::Provision(ClassKind::Csi)
        );
    }
}
