//! The public entry points (upstream's `CSITranslator`), as free functions and as methods of the
//! stateless [`Translator`].

use k8s_openapi::api::core::v1::{PersistentVolume, Volume};
use k8s_openapi::api::storage::v1::StorageClass;

use crate::plugins::{InTreePlugin, plugin_by_csi_name, plugin_by_in_tree_name, plugins};
use crate::{Error, Result};

/// Translates an in-tree PV (one of the seven plugins) to a PV with a CSI source. The input is
/// not modified.
pub fn translate_in_tree_pv_to_csi(pv: &PersistentVolume) -> Result<PersistentVolume> {
    pv_plugin(pv)?.translate_in_tree_pv_to_csi(pv)
}

/// Translates a CSI PV of a migrated driver back to the in-tree source of its plugin.
pub fn translate_csi_pv_to_in_tree(pv: &PersistentVolume) -> Result<PersistentVolume> {
    let csi = pv
        .spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .ok_or_else(|| Error::NoPlugin {
            object: "PersistentVolume",
            name: name_of(pv),
            reason: "it has no spec.csi",
        })?;
    let plugin = plugin_by_csi_name(&csi.driver)
        .ok_or_else(|| Error::UnknownCsiDriver(csi.driver.clone()))?;
    plugin.translate_csi_pv_to_in_tree(pv)
}

/// Translates an inline pod volume to a PV with a CSI source. `pod_namespace` is used by plugins
/// whose secrets live in the pod's namespace (Azure File). The PV's volume mode is Filesystem:
/// inline volumes are never raw block.
pub fn translate_in_tree_inline_volume_to_csi(
    volume: &Volume,
    pod_namespace: &str,
) -> Result<PersistentVolume> {
    let plugin = plugins()
        .iter()
        .find(|p| p.can_support_inline(volume))
        .ok_or_else(|| Error::NoPlugin {
            object: "Volume",
            name: volume.name.clone(),
            reason: "it has none of awsElasticBlockStore, gcePersistentDisk, azureDisk, azureFile, cinder, vsphereVolume, portworxVolume",
        })?;
    let mut pv = plugin.translate_in_tree_inline_volume_to_csi(volume, pod_namespace)?;
    let spec = pv.spec.get_or_insert_with(Default::default);
    spec.volume_mode
        .get_or_insert_with(|| "Filesystem".to_string());
    Ok(pv)
}

/// Translates the parameters and allowed topologies of a StorageClass of the in-tree plugin
/// `in_tree_plugin_name` to what its CSI driver expects. Like upstream, the provisioner is not
/// changed (except by Portworx); `csi-translate storageclass` sets it to the CSI driver.
pub fn translate_in_tree_storage_class_to_csi(
    in_tree_plugin_name: &str,
    sc: &StorageClass,
) -> Result<StorageClass> {
    plugin_by_in_tree_name(in_tree_plugin_name)
        .ok_or_else(|| Error::UnknownInTreePlugin(in_tree_plugin_name.to_string()))?
        .translate_in_tree_storage_class_to_csi(sc)
}

/// Whether `name` is one of the seven migrated in-tree plugins.
pub fn is_migratable_in_tree_plugin_by_name(name: &str) -> bool {
    plugin_by_in_tree_name(name).is_some()
}

/// Whether `name` is the CSI driver of a migrated in-tree plugin.
pub fn is_migrated_csi_driver_by_name(name: &str) -> bool {
    plugin_by_csi_name(name).is_some()
}

/// Whether the PV has the in-tree source of a migrated plugin.
pub fn is_pv_migratable(pv: &PersistentVolume) -> bool {
    plugins().iter().any(|p| p.can_support(pv))
}

/// Whether the inline volume has the in-tree source of a migrated plugin.
pub fn is_inline_migratable(volume: &Volume) -> bool {
    plugins().iter().any(|p| p.can_support_inline(volume))
}

/// The CSI driver name of an in-tree plugin.
pub fn csi_name_from_in_tree_name(name: &str) -> Result<&'static str> {
    plugin_by_in_tree_name(name)
        .map(|p| p.csi_plugin_name())
        .ok_or_else(|| Error::UnknownInTreePlugin(name.to_string()))
}

/// The in-tree plugin name of a migrated CSI driver.
pub fn in_tree_name_from_csi_name(name: &str) -> Result<&'static str> {
    plugin_by_csi_name(name)
        .map(|p| p.in_tree_plugin_name())
        .ok_or_else(|| Error::UnknownCsiDriver(name.to_string()))
}

/// The in-tree plugin name of a PV or, when there is no PV, of an inline volume.
pub fn in_tree_plugin_name_from_spec(
    pv: Option<&PersistentVolume>,
    volume: Option<&Volume>,
) -> Result<&'static str> {
    match (pv, volume) {
        (Some(pv), _) => Ok(pv_plugin(pv)?.in_tree_plugin_name()),
        (None, Some(volume)) => plugins()
            .iter()
            .find(|p| p.can_support_inline(volume))
            .map(|p| p.in_tree_plugin_name())
            .ok_or_else(|| Error::NoPlugin {
                object: "Volume",
                name: volume.name.clone(),
                reason: "it has no in-tree source of a migrated plugin",
            }),
        (None, None) => Err(Error::NoPlugin {
            object: "PersistentVolume or Volume",
            name: String::new(),
            reason: "neither was given",
        }),
    }
}

/// Completes a CSI volume handle with what only the node knows (GCE PD: project and zone from
/// the node ID `projects/<p>/zones/<z>/instances/<n>`); other drivers return it unchanged.
pub fn repair_volume_handle(
    driver_name: &str,
    volume_handle: &str,
    node_id: &str,
) -> Result<String> {
    plugin_by_csi_name(driver_name)
        .ok_or_else(|| Error::UnknownCsiDriver(driver_name.to_string()))?
        .repair_volume_handle(volume_handle, node_id)
}

fn pv_plugin(pv: &PersistentVolume) -> Result<&'static dyn InTreePlugin> {
    plugins()
        .iter()
        .copied()
        .find(|p| p.can_support(pv))
        .ok_or_else(|| Error::NoPlugin {
            object: "PersistentVolume",
            name: name_of(pv),
            reason: "its spec has no in-tree source of a migrated plugin",
        })
}

fn name_of(pv: &PersistentVolume) -> String {
    pv.metadata.name.clone().unwrap_or_default()
}

/// The translator as a value, for callers that want to hold or inject one. Stateless: every
/// method forwards to the free function of the same name.
#[derive(Debug, Clone, Copy, Default)]
pub struct Translator;

impl Translator {
    /// See [`translate_in_tree_pv_to_csi`].
    pub fn translate_in_tree_pv_to_csi(&self, pv: &PersistentVolume) -> Result<PersistentVolume> {
        translate_in_tree_pv_to_csi(pv)
    }
    /// See [`translate_csi_pv_to_in_tree`].
    pub fn translate_csi_pv_to_in_tree(&self, pv: &PersistentVolume) -> Result<PersistentVolume> {
        translate_csi_pv_to_in_tree(pv)
    }
    /// See [`translate_in_tree_inline_volume_to_csi`].
    pub fn translate_in_tree_inline_volume_to_csi(
        &self,
        volume: &Volume,
        pod_namespace: &str,
    ) -> Result<PersistentVolume> {
        translate_in_tree_inline_volume_to_csi(volume, pod_namespace)
    }
    /// See [`translate_in_tree_storage_class_to_csi`].
    pub fn translate_in_tree_storage_class_to_csi(
        &self,
        in_tree_plugin_name: &str,
        sc: &StorageClass,
    ) -> Result<StorageClass> {
        translate_in_tree_storage_class_to_csi(in_tree_plugin_name, sc)
    }
    /// See [`is_migratable_in_tree_plugin_by_name`].
    pub fn is_migratable_in_tree_plugin_by_name(&self, name: &str) -> bool {
        is_migratable_in_tree_plugin_by_name(name)
    }
    /// See [`is_migrated_csi_driver_by_name`].
    pub fn is_migrated_csi_driver_by_name(&self, name: &str) -> bool {
        is_migrated_csi_driver_by_name(name)
    }
    /// See [`is_pv_migratable`].
    pub fn is_pv_migratable(&self, pv: &PersistentVolume) -> bool {
        is_pv_migratable(pv)
    }
    /// See [`is_inline_migratable`].
    pub fn is_inline_migratable(&self, volume: &Volume) -> bool {
        is_inline_migratable(volume)
    }
    /// See [`csi_name_from_in_tree_name`].
    pub fn csi_name_from_in_tree_name(&self, name: &str) -> Result<&'static str> {
        csi_name_from_in_tree_name(name)
    }
    /// See [`in_tree_name_from_csi_name`].
    pub fn in_tree_name_from_csi_name(&self, name: &str) -> Result<&'static str> {
        in_tree_name_from_csi_name(name)
    }
    /// See [`in_tree_plugin_name_from_spec`].
    pub fn in_tree_plugin_name_from_spec(
        &self,
        pv: Option<&PersistentVolume>,
        volume: Option<&Volume>,
    ) -> Result<&'static str> {
        in_tree_plugin_name_from_spec(pv, volume)
    }
    /// See [`repair_volume_handle`].
    pub fn repair_volume_handle(
        &self,
        driver_name: &str,
        volume_handle: &str,
        node_id: &str,
    ) -> Result<String> {
        repair_volume_handle(driver_name, volume_handle, node_id)
    }
}
