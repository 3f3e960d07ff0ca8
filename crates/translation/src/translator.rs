//! The public entry points (upstream's `CSITranslator`), as free functions and as methods of the
//! stateless [`Translator`].

use k8s_openapi::api::core::v1::{PersistentVolume, Volume};
use k8s_openapi::api::storage::v1::StorageClass;

use crate::plugins::{InTreePlugin, plugin_by_csi_name, plugin_by_in_tree_name, plugins};
use crate::{Error, Result};

/// CSINode annotation listing the in-tree plugins whose operations the node's kubelet sends to
/// their CSI drivers (the migration design, docs/design/migration.md,
/// "Kubelet Initialization & Migration Annotation").
pub const MIGRATED_PLUGINS_ANNOTATION: &str = "storage.alpha.kubernetes.io/migrated-plugins";

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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pv(v: serde_json::Value) -> PersistentVolume {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn names_map_both_ways_for_all_seven_plugins() {
        let pairs = [
            ("kubernetes.io/aws-ebs", "ebs.csi.aws.com"),
            ("kubernetes.io/gce-pd", "pd.csi.storage.gke.io"),
            ("kubernetes.io/azure-disk", "disk.csi.azure.com"),
            ("kubernetes.io/azure-file", "file.csi.azure.com"),
            ("kubernetes.io/cinder", "cinder.csi.openstack.org"),
            ("kubernetes.io/vsphere-volume", "csi.vsphere.vmware.com"),
            ("kubernetes.io/portworx-volume", "pxd.portworx.com"),
        ];
        for (in_tree, csi) in pairs {
            assert_eq!(csi_name_from_in_tree_name(in_tree).unwrap(), csi);
            assert_eq!(in_tree_name_from_csi_name(csi).unwrap(), in_tree);
            assert!(is_migratable_in_tree_plugin_by_name(in_tree));
            assert!(is_migrated_csi_driver_by_name(csi));
        }
        assert!(!is_migratable_in_tree_plugin_by_name("kubernetes.io/nfs"));
        assert!(matches!(
            csi_name_from_in_tree_name("kubernetes.io/nfs"),
            Err(Error::UnknownInTreePlugin(_))
        ));
        assert!(matches!(
            in_tree_name_from_csi_name("nfs.csi.k8s.io"),
            Err(Error::UnknownCsiDriver(_))
        ));
    }

    #[test]
    fn plugin_name_from_spec_prefers_the_pv() {
        let p = pv(json!({"spec": {"cinder": {"volumeID": "v"}}}));
        let v: Volume = serde_json::from_value(
            json!({"name": "x", "awsElasticBlockStore": {"volumeID": "vol-1"}}),
        )
        .unwrap();
        assert_eq!(
            in_tree_plugin_name_from_spec(Some(&p), Some(&v)).unwrap(),
            "kubernetes.io/cinder"
        );
        assert_eq!(
            in_tree_plugin_name_from_spec(None, Some(&v)).unwrap(),
            "kubernetes.io/aws-ebs"
        );
        assert!(in_tree_plugin_name_from_spec(None, None).is_err());
        let nfs =
            pv(json!({"metadata": {"name": "n"}, "spec": {"nfs": {"server": "s", "path": "/"}}}));
        let err = in_tree_plugin_name_from_spec(Some(&nfs), None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"n\""), "{err}");
        assert!(!is_pv_migratable(&nfs));
    }

    #[test]
    fn csi_pv_of_an_unknown_driver_or_without_csi_is_an_error() {
        let other = pv(json!({"spec": {"csi": {"driver": "nfs.csi.k8s.io", "volumeHandle": "h"}}}));
        assert!(
            matches!(translate_csi_pv_to_in_tree(&other), Err(Error::UnknownCsiDriver(d)) if d == "nfs.csi.k8s.io")
        );
        let none = pv(json!({"metadata": {"name": "x"}, "spec": {}}));
        assert!(matches!(
            translate_csi_pv_to_in_tree(&none),
            Err(Error::NoPlugin { .. })
        ));
        assert!(matches!(
            translate_in_tree_pv_to_csi(&none),
            Err(Error::NoPlugin { .. })
        ));
    }

    #[test]
    fn repair_only_changes_gce_handles() {
        assert_eq!(
            repair_volume_handle("ebs.csi.aws.com", "vol-1", "i-123").unwrap(),
            "vol-1"
        );
        // As upstream: an UNSPECIFIED handle cannot be repaired without a node ID (an error, not
        // the handle unchanged, so the attacher never matches a wrong handle).
        assert!(
            repair_volume_handle(
                "pd.csi.storage.gke.io",
                "projects/UNSPECIFIED/zones/UNSPECIFIED/disks/d",
                ""
            )
            .is_err()
        );
        assert_eq!(
            repair_volume_handle("pd.csi.storage.gke.io", "projects/p/zones/z/disks/d", "")
                .unwrap(),
            "projects/p/zones/z/disks/d",
            "a complete handle needs no node ID"
        );
        assert!(repair_volume_handle("other", "h", "n").is_err());
    }

    #[test]
    fn inline_volumes_get_filesystem_mode_and_unknown_ones_fail() {
        let v: Volume =
            serde_json::from_value(json!({"name": "x", "cinder": {"volumeID": "c1"}})).unwrap();
        let out = translate_in_tree_inline_volume_to_csi(&v, "ns").unwrap();
        assert_eq!(
            out.metadata.name.as_deref(),
            Some("cinder.csi.openstack.org-c1")
        );
        assert_eq!(out.spec.unwrap().volume_mode.as_deref(), Some("Filesystem"));
        let e: Volume = serde_json::from_value(json!({"name": "cfg", "emptyDir": {}})).unwrap();
        assert!(!is_inline_migratable(&e));
        let err = translate_in_tree_inline_volume_to_csi(&e, "")
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"cfg\""), "{err}");
    }

    #[test]
    fn storage_class_of_an_unknown_plugin_is_an_error() {
        let sc: StorageClass = serde_json::from_value(json!({"provisioner": "x"})).unwrap();
        assert!(matches!(
            translate_in_tree_storage_class_to_csi("x", &sc),
            Err(Error::UnknownInTreePlugin(_))
        ));
    }

    #[test]
    fn vsphere_round_trip_and_provisioned_path() {
        let in_tree = pv(
            json!({"metadata": {"name": "v"}, "spec": {"vsphereVolume": {
            "volumePath": "[ds] kubevols/a.vmdk", "storagePolicyName": "gold", "fsType": "ext4"}}}),
        );
        let csi = translate_in_tree_pv_to_csi(&in_tree).unwrap();
        assert_eq!(translate_csi_pv_to_in_tree(&csi).unwrap(), in_tree);

        // Provisioned by the CSI driver for a migrated class: path from the attribute, as upstream.
        let provisioned = pv(
            json!({"spec": {"csi": {"driver": "csi.vsphere.vmware.com", "volumeHandle": "uuid",
            "volumeAttributes": {"initialvolumefilepath": "[ds] b.vmdk", "storagepolicyname": "gold"}}}}),
        );
        let back = translate_csi_pv_to_in_tree(&provisioned).unwrap();
        let src = back.spec.unwrap().vsphere_volume.unwrap();
        assert_eq!(src.volume_path, "[ds] b.vmdk");
        assert_eq!(src.storage_policy_name, None);
    }
}
