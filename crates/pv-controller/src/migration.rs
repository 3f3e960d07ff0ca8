//! Seed 003 in the persistentvolume controller: who provisions a class of an in-tree plugin,
//! and the `pv.kubernetes.io/migrated-to` annotation on claims and volumes, which tells the
//! CSI provisioner that a claim or volume of an in-tree plugin is now its business (and takes
//! it away again after a downgrade).

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use volume_plugins::MigratedPlugins;
use volume_plugins::names::AWS_EBS_PLUGIN_NAME;

use crate::names::{
    ANN_BETA_STORAGE_PROVISIONER, ANN_MIGRATED_TO, ANN_PROVISIONED_BY, ANN_STORAGE_PROVISIONER,
};

/// Who provisions the claims of a StorageClass, by its `provisioner`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClassProvisioner {
    /// An external provisioner (a CSI driver's csi-provisioner, or any other).
    External(String),
    /// An in-tree plugin migrated to a CSI driver (`--feature-gates`): the driver's
    /// csi-provisioner provisions, the claim gets `migrated-to: <driver>`.
    Migrated { in_tree: String, driver: String },
    /// The in-tree `kubernetes.io/aws-ebs` plugin, not migrated: this controller provisions.
    InTreeAwsEbs,
    /// Another in-tree plugin (`kubernetes.io/...`) that is not migrated: not served here.
    Unsupported(String),
}

impl ClassProvisioner {
    /// The value of the claim's storage-provisioner annotations.
    pub fn annotation_value(&self) -> &str {
        match self {
            ClassProvisioner::External(p) | ClassProvisioner::Unsupported(p) => p,
            ClassProvisioner::Migrated { driver, .. } => driver,
            ClassProvisioner::InTreeAwsEbs => AWS_EBS_PLUGIN_NAME,
        }
    }

    /// The driver a claim of this class is migrated to.
    pub fn migrated_to(&self) -> Option<&str> {
        match self {
            ClassProvisioner::Migrated { driver, .. } => Some(driver),
            _ => None,
        }
    }
}

/// Who provisions claims of a class whose `provisioner` is `provisioner`.
pub fn class_provisioner(provisioner: &str, migrated: &MigratedPlugins) -> ClassProvisioner {
    if migrated.contains(provisioner) {
        if let Ok(driver) = csi_translation::csi_name_from_in_tree_name(provisioner) {
            return ClassProvisioner::Migrated {
                in_tree: provisioner.to_string(),
                driver: driver.to_string(),
            };
        }
    }
    if provisioner == AWS_EBS_PLUGIN_NAME {
        ClassProvisioner::InTreeAwsEbs
    } else if provisioner.starts_with("kubernetes.io/") {
        ClassProvisioner::Unsupported(provisioner.to_string())
    } else {
        ClassProvisioner::External(provisioner.to_string())
    }
}

/// The `migrated-to` value a claim should carry: from its storage-provisioner annotation (the
/// GA one, else the beta one). A claim annotated for an in-tree plugin that is migrated, or
/// for the CSI driver of a migrated plugin, is migrated; any other has no `migrated-to`.
pub fn claim_migrated_to(
    claim: &PersistentVolumeClaim,
    migrated: &MigratedPlugins,
) -> Option<String> {
    let ann = claim.metadata.annotations.as_ref()?;
    let provisioner = ann
        .get(ANN_STORAGE_PROVISIONER)
        .or_else(|| ann.get(ANN_BETA_STORAGE_PROVISIONER))?;
    migrated_driver_of(provisioner, migrated)
}

/// The `migrated-to` value a volume should carry: it was provisioned by a migrated in-tree
/// plugin (`pv.kubernetes.io/provisioned-by`), or, not provisioned dynamically, it has the
/// in-tree source of a migrated plugin.
pub fn volume_migrated_to(volume: &PersistentVolume, migrated: &MigratedPlugins) -> Option<String> {
    let provisioned_by = volume
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANN_PROVISIONED_BY));
    match provisioned_by {
        Some(p) => migrated_driver_of(p, migrated),
        None => {
            let plugin = csi_translation::in_tree_plugin_name_from_spec(Some(volume), None).ok()?;
            migrated_driver_of(plugin, migrated)
        }
    }
}

/// The CSI driver of `name` when `name` is a migrated in-tree plugin or that plugin's driver.
fn migrated_driver_of(name: &str, migrated: &MigratedPlugins) -> Option<String> {
    if migrated.contains(name) {
        return csi_translation::csi_name_from_in_tree_name(name)
            .ok()
            .map(str::to_string);
    }
    let in_tree = csi_translation::in_tree_name_from_csi_name(name).ok()?;
    migrated.contains(in_tree).then(|| name.to_string())
}

/// The `migrated-to` an object carries now.
pub(crate) fn current_migrated_to(
    annotations: Option<&std::collections::BTreeMap<String, String>>,
) -> Option<&str> {
    annotations
        .and_then(|a| a.get(ANN_MIGRATED_TO))
        .map(String::as_str)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use k8s_openapi::api::core::v1::{AWSElasticBlockStoreVolumeSource, PersistentVolumeSpec};
    use std::collections::BTreeMap;

    fn gates(s: &str) -> MigratedPlugins {
        MigratedPlugins::from_feature_gates(s).unwrap()
    }

    fn claim(provisioner: &str) -> PersistentVolumeClaim {
        let mut c = PersistentVolumeClaim::default();
        c.metadata.annotations = Some(BTreeMap::from([(
            ANN_STORAGE_PROVISIONER.to_string(),
            provisioner.to_string(),
        )]));
        c
    }

    #[test]
    fn class_provisioners() {
        let on = gates("CSIMigrationAWS=true");
        let off = gates("CSIMigrationAWS=false");
        assert_eq!(
            class_provisioner("kubernetes.io/aws-ebs", &on),
            ClassProvisioner::Migrated {
                in_tree: "kubernetes.io/aws-ebs".into(),
                driver: "ebs.csi.aws.com".into()
            }
        );
        assert_eq!(
            class_provisioner("kubernetes.io/aws-ebs", &off),
            ClassProvisioner::InTreeAwsEbs
        );
        assert_eq!(
            class_provisioner("kubernetes.io/gce-pd", &off),
            ClassProvisioner::Unsupported("kubernetes.io/gce-pd".into())
        );
        assert_eq!(
            class_provisioner("hostpath.csi.k8s.io", &on),
            ClassProvisioner::External("hostpath.csi.k8s.io".into())
        );
        assert_eq!(
            class_provisioner("kubernetes.io/aws-ebs", &on).annotation_value(),
            "ebs.csi.aws.com"
        );
    }

    #[test]
    fn claims_and_volumes_follow_the_gates() {
        let on = gates("CSIMigrationAWS=true");
        let off = MigratedPlugins::none();
        for p in ["kubernetes.io/aws-ebs", "ebs.csi.aws.com"] {
            assert_eq!(
                claim_migrated_to(&claim(p), &on).as_deref(),
                Some("ebs.csi.aws.com"),
                "{p}"
            );
            assert_eq!(claim_migrated_to(&claim(p), &off), None, "{p}");
        }
        assert_eq!(claim_migrated_to(&claim("hostpath.csi.k8s.io"), &on), None);

        let mut pv = PersistentVolume {
            spec: Some(PersistentVolumeSpec {
                aws_elastic_block_store: Some(AWSElasticBlockStoreVolumeSource {
                    volume_id: "vol-1".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            volume_migrated_to(&pv, &on).as_deref(),
            Some("ebs.csi.aws.com")
        );
        assert_eq!(volume_migrated_to(&pv, &off), None);
        pv.metadata.annotations = Some(BTreeMap::from([(
            ANN_PROVISIONED_BY.to_string(),
            "kubernetes.io/aws-ebs".to_string(),
        )]));
        assert_eq!(
            volume_migrated_to(&pv, &on).as_deref(),
            Some("ebs.csi.aws.com")
        );
        pv.metadata.annotations = Some(BTreeMap::from([(
            ANN_PROVISIONED_BY.to_string(),
            "hostpath.csi.k8s.io".to_string(),
        )]));
        assert_eq!(volume_migrated_to(&pv, &on), None);
    }
}
