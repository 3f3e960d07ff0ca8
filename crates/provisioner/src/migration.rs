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
    let annotations = out
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    annotations.insert(PROVISIONED_BY_ANNOTATION.into(), in_tree_plugin.into());
    annotations.insert(MIGRATED_TO_ANNOTATION.into(), driver.into());
    Ok(out)
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
