//! Which PVs we delete, and with what: a Released PV with reclaim policy Delete that we
//! provisioned (or an in-tree PV migrated to our driver).

use k8s_openapi::api::core::v1::{PersistentVolume, SecretReference};

use crate::{
    DELETION_SECRET_NAME_ANNOTATION, DELETION_SECRET_NAMESPACE_ANNOTATION, Error,
    MIGRATED_TO_ANNOTATION, PROVISIONED_BY_ANNOTATION,
};

/// What DeleteVolume needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    pub volume_handle: String,
    pub secret: Option<SecretReference>,
    pub migrated: bool,
}

fn annotation<'a>(pv: &'a PersistentVolume, key: &str) -> Option<&'a str> {
    pv.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// Whether `driver` provisioned `pv` (directly, or for a migrated in-tree class).
pub fn is_ours(pv: &PersistentVolume, driver: &str) -> bool {
    match annotation(pv, PROVISIONED_BY_ANNOTATION) {
        Some(by) if by == driver => true,
        Some(by) => {
            csi_translation::csi_name_from_in_tree_name(by).ok() == Some(driver)
                && annotation(pv, MIGRATED_TO_ANNOTATION) == Some(driver)
        }
        None => false,
    }
}

/// The DeleteVolume target when `pv` should be deleted now, `Ok(None)` when not.
pub fn target(pv: &PersistentVolume, driver: &str) -> Result<Option<Target>, Error> {
    let spec = pv.spec.clone().unwrap_or_default();
    let phase = pv.status.as_ref().and_then(|s| s.phase.as_deref());
    let released = phase == Some("Released") || phase == Some("Failed");
    if !released
        || spec.persistent_volume_reclaim_policy.as_deref() != Some("Delete")
        || !is_ours(pv, driver)
    {
        return Ok(None);
    }
    let (handle, migrated) = match &spec.csi {
        Some(csi) if csi.driver == driver => (csi.volume_handle.clone(), false),
        Some(_) => return Ok(None),
        None => {
            let csi_pv = crate::migration::to_csi(pv)?;
            let handle = csi_pv
                .spec
                .and_then(|s| s.csi)
                .map(|c| c.volume_handle)
                .unwrap_or_default();
            (handle, true)
        }
    };
    let secret = match (
        annotation(pv, DELETION_SECRET_NAME_ANNOTATION),
        annotation(pv, DELETION_SECRET_NAMESPACE_ANNOTATION),
    ) {
        (Some(name), Some(ns)) => Some(SecretReference {
            name: Some(name.into()),
            namespace: Some(ns.into()),
        }),
        _ => None,
    };
    Ok(Some(Target {
        volume_handle: handle,
        secret,
        migrated,
    }))
}
