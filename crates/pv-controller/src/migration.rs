//! The migration design (docs/design/migration.md) in the persistentvolume controller: who
//! provisions a class of an in-tree plugin, and the `pv.kubernetes.io/migrated-to` annotation on
//! claims and volumes, which tells the CSI provisioner that a claim or volume of an in-tree plugin
//! is now its business (and takes it away again after a downgrade).

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
    /// csi-provisioner provisions; the claim's storage-provisioner names the driver (and,
    /// as kcm v1.26 writes it, the claim gets no `migrated-to`).
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

/// The `migrated-to` value a claim should carry, as kcm v1.26's `updateMigrationAnnotations`
/// decides it: from the claim's storage-provisioner annotation (the GA one, else the beta one)
/// alone. Only a claim annotated for a migrated in-tree plugin (one annotated before the
/// plugin was migrated) is marked; a claim annotated for the CSI driver, which is what kcm
/// writes for a migrated class, carries no `migrated-to` (kcm removes it): the CSI
/// provisioner provisions it because the annotation names its driver.
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

/// What kcm v1.26 keeps in a volume's `migrated-to`: `None` leaves the annotation as it is
/// (a volume without `pv.kubernetes.io/provisioned-by`, i.e. statically provisioned, is
/// never touched); `Some(Some(driver))` when it was provisioned by a migrated in-tree
/// plugin; `Some(None)` (remove it) when provisioned by anything else.
pub fn volume_migrated_to(
    volume: &PersistentVolume,
    migrated: &MigratedPlugins,
) -> Option<Option<String>> {
    let provisioned_by = volume
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANN_PROVISIONED_BY))?;
    Some(migrated_driver_of(provisioned_by, migrated))
}

/// The CSI driver of `name` when `name` is an in-tree plugin that is migrated (kcm's
/// `IsMigrationEnabledForPlugin`, which is false for any CSI driver's name).
fn migrated_driver_of(name: &str, migrated: &MigratedPlugins) -> Option<String> {
    if !migrated.contains(name) {
        return None;
    }
    csi_translation::csi_name_from_in_tree_name(name)
        .ok()
        .map(str::to_string)
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
    fn claims_and_volumes_follow_kcm_v1_26() {
        let on = gates("CSIMigrationAWS=true");
        let off = MigratedPlugins::none();
        // A claim annotated for the in-tree plugin (before migration) is marked; one annotated
        // for the driver (what kcm writes for a migrated class) is not.
        assert_eq!(
            claim_migrated_to(&claim("kubernetes.io/aws-ebs"), &on).as_deref(),
            Some("ebs.csi.aws.com")
        );
        assert_eq!(
            claim_migrated_to(&claim("kubernetes.io/aws-ebs"), &off),
            None
        );
        assert_eq!(claim_migrated_to(&claim("ebs.csi.aws.com"), &on), None);
        assert_eq!(claim_migrated_to(&claim("hostpath.csi.k8s.io"), &on), None);

        // Statically provisioned: left alone, whatever its source.
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
        assert_eq!(volume_migrated_to(&pv, &on), None);
        assert_eq!(volume_migrated_to(&pv, &off), None);
        let by = |pv: &mut PersistentVolume, p: &str| {
            pv.metadata.annotations = Some(BTreeMap::from([(
                ANN_PROVISIONED_BY.to_string(),
                p.to_string(),
            )]));
        };
        by(&mut pv, "kubernetes.io/aws-ebs");
        assert_eq!(
            volume_migrated_to(&pv, &on),
            Some(Some("ebs.csi.aws.com".to_string()))
        );
        assert_eq!(volume_migrated_to(&pv, &off), Some(None));
        by(&mut pv, "ebs.csi.aws.com");
        assert_eq!(volume_migrated_to(&pv, &on), Some(None));
        by(&mut pv, "hostpath.csi.k8s.io");
        assert_eq!(volume_migrated_to(&pv, &on), Some(None));
    }
}
