//! vSphere: `kubernetes.io/vsphere-volume` <-> `csi.vsphere.vmware.com`.
//!
//! The CSI handle of a migrated volume is its in-tree `volumePath` (`[datastore] dir/disk.vmdk`);
//! volumes the CSI driver provisioned in migration mode carry that path in the
//! `initialvolumefilepath` attribute instead. Zone and region both have CSI keys
//! (`topology.csi.vmware.com/zone|region`). StorageClass parameters the CSI driver only accepts
//! for migrated classes get a `-migrationparam` suffix, unknown ones are dropped, and
//! `csimigration: "true"` is added.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, PersistentVolume, Volume, VsphereVirtualDiskVolumeSource,
};
use k8s_openapi::api::storage::v1::StorageClass;

use super::{
    CSI_FS_TYPE_KEY, FS_TYPE_KEY, InTreePlugin, PluginNames, go_string, inline_source, named_pv,
    parameters, pv_source, required_csi_source, spec,
};
use crate::topology::{
    add_topology_mut, label, replace_topology_mut, topology_labels, topology_values,
    translate_allowed_topologies,
};
use crate::{Error, Result};

/// In-tree plugin name.
pub const IN_TREE_PLUGIN_NAME: &str = "kubernetes.io/vsphere-volume";
/// CSI driver name.
pub const DRIVER_NAME: &str = "csi.vsphere.vmware.com";
/// The driver's zone topology key.
pub const TOPOLOGY_ZONE_KEY: &str = "topology.csi.vmware.com/zone";
/// The driver's region topology key.
pub const TOPOLOGY_REGION_KEY: &str = "topology.csi.vmware.com/region";
/// Volume attribute with the in-tree path of a volume the CSI driver provisioned for migration.
pub const ATTR_INITIAL_VOLUME_FILEPATH: &str = "initialvolumefilepath";

const PARAM_STORAGE_POLICY_NAME: &str = "storagepolicyname";
const PARAM_CSI_MIGRATION: &str = "csimigration";
/// In-tree parameters the CSI driver accepts only as `<name>-migrationparam`.
const MIGRATION_PARAMS: [&str; 8] = [
    "datastore",
    "diskformat",
    "hostfailurestotolerate",
    "forceprovisioning",
    "cachereservation",
    "diskstripes",
    "objectspacereservation",
    "iopslimit",
];

/// The vSphere plugin.
#[derive(Debug, Clone, Copy, Default)]
pub struct VSphere;

/// In-tree zone/region (node affinity, else labels) to the CSI zone and region keys.
fn topology_in_tree_to_csi(pv: &mut PersistentVolume) {
    let (zone_label, region_label) = topology_labels(pv);
    for (in_tree, csi) in [
        (zone_label, TOPOLOGY_ZONE_KEY),
        (region_label, TOPOLOGY_REGION_KEY),
    ] {
        if !topology_values(pv, in_tree).is_empty() {
            replace_topology_mut(pv, in_tree, csi);
        } else if let Some(value) = label(pv, in_tree)
            .filter(|v| !v.is_empty())
            .map(str::to_string)
        {
            // Cannot fail: the value is not blank.
            let _ = add_topology_mut(pv, csi, &[value]);
        }
    }
}

/// CSI zone/region keys back to Kubernetes keys, adding the labels where missing.
fn topology_csi_to_in_tree(pv: &mut PersistentVolume) {
    let (zone_label, region_label) = topology_labels(pv);
    for (csi, in_tree) in [
        (TOPOLOGY_ZONE_KEY, zone_label),
        (TOPOLOGY_REGION_KEY, region_label),
    ] {
        replace_topology_mut(pv, csi, in_tree);
    }
    for in_tree in [zone_label, region_label] {
        if let Some(first) = topology_values(pv, in_tree).into_iter().next() {
            pv.metadata
                .labels
                .get_or_insert_with(BTreeMap::new)
                .entry(in_tree.to_string())
                .or_insert(first);
        }
    }
}

impl InTreePlugin for VSphere {
    fn names(&self) -> PluginNames {
        PluginNames::new(IN_TREE_PLUGIN_NAME, DRIVER_NAME, "vsphere")
    }

    fn can_support(&self, pv: &PersistentVolume) -> bool {
        spec(pv).is_some_and(|s| s.vsphere_volume.is_some())
    }

    fn can_support_inline(&self, volume: &Volume) -> bool {
        volume.vsphere_volume.is_some()
    }

    fn translate_in_tree_storage_class_to_csi(&self, sc: &StorageClass) -> Result<StorageClass> {
        let mut params = BTreeMap::new();
        for (k, v) in parameters(sc) {
            let lower = k.to_lowercase();
            if lower == FS_TYPE_KEY {
                params.insert(CSI_FS_TYPE_KEY.to_string(), v.clone());
            } else if lower == PARAM_STORAGE_POLICY_NAME {
                params.insert(PARAM_STORAGE_POLICY_NAME.to_string(), v.clone());
            } else if MIGRATION_PARAMS.contains(&lower.as_str()) {
                params.insert(format!("{lower}-migrationparam"), v.clone());
            }
            // Anything else is not supported by the CSI driver and dropped, as upstream does.
        }
        // Tells the CSI driver this class came from the in-tree plugin, so that it returns the
        // in-tree path (initialvolumefilepath) that a later translation back needs.
        params.insert(PARAM_CSI_MIGRATION.to_string(), "true".to_string());
        let mut out = sc.clone();
        if sc
            .allowed_topologies
            .as_ref()
            .is_some_and(|t| !t.is_empty())
        {
            out.allowed_topologies =
                translate_allowed_topologies(sc.allowed_topologies.as_deref(), TOPOLOGY_ZONE_KEY);
        }
        out.parameters = Some(params);
        Ok(out)
    }

    fn translate_in_tree_inline_volume_to_csi(
        &self,
        volume: &Volume,
        _pod_namespace: &str,
    ) -> Result<PersistentVolume> {
        let src = inline_source(
            volume.vsphere_volume.as_ref(),
            "vsphereVolume",
            IN_TREE_PLUGIN_NAME,
        )?;
        if src
            .storage_policy_name
            .as_ref()
            .is_some_and(|p| !p.is_empty())
        {
            // Upstream crashes on this case (it indexes a nil map); refuse it instead.
            return Err(Error::Unsupported {
                field: "vsphereVolume.storagePolicyName",
                reason: "a storage policy on an inline vSphere volume cannot be translated to CSI"
                    .into(),
            });
        }
        let csi = CSIPersistentVolumeSource {
            driver: DRIVER_NAME.to_string(),
            volume_handle: src.volume_path.clone(),
            fs_type: go_string(src.fs_type.as_ref()),
            volume_attributes: Some(BTreeMap::new()),
            ..Default::default()
        };
        Ok(named_pv(
            format!("{DRIVER_NAME}-{}", src.volume_path),
            csi,
            "ReadWriteOnce",
        ))
    }

    fn translate_in_tree_pv_to_csi(&self, pv: &PersistentVolume) -> Result<PersistentVolume> {
        let src = pv_source(pv, "spec.vsphereVolume", IN_TREE_PLUGIN_NAME, |s| {
            s.vsphere_volume.as_ref()
        })?;
        let mut attrs = BTreeMap::new();
        if let Some(policy) = src.storage_policy_name.as_ref().filter(|p| !p.is_empty()) {
            attrs.insert(PARAM_STORAGE_POLICY_NAME.to_string(), policy.clone());
        }
        let csi = CSIPersistentVolumeSource {
            driver: DRIVER_NAME.to_string(),
            volume_handle: src.volume_path.clone(),
            fs_type: go_string(src.fs_type.as_ref()),
            volume_attributes: Some(attrs),
            ..Default::default()
        };
        let mut out = pv.clone();
        topology_in_tree_to_csi(&mut out);
        let s = out.spec.get_or_insert_with(Default::default);
        s.vsphere_volume = None;
        s.csi = Some(csi);
        Ok(out)
    }

    fn translate_csi_pv_to_in_tree(&self, pv: &PersistentVolume) -> Result<PersistentVolume> {
        let csi = required_csi_source(pv, DRIVER_NAME)?;
        let attrs = csi.volume_attributes.as_ref();
        let mut src = VsphereVirtualDiskVolumeSource {
            fs_type: go_string(csi.fs_type.as_ref()),
            ..Default::default()
        };
        match attrs.and_then(|a| a.get(ATTR_INITIAL_VOLUME_FILEPATH)) {
            // Provisioned by the CSI driver for a migrated class: the path is in the attribute
            // and the storage policy was only needed to provision.
            Some(path) => src.volume_path = path.clone(),
            // Translated from an in-tree PV (the handle is the path): undo exactly what the
            // forward translation did. Upstream leaves volumePath empty here.
            None => {
                src.volume_path = csi.volume_handle.clone();
                src.storage_policy_name = attrs
                    .and_then(|a| a.get(PARAM_STORAGE_POLICY_NAME))
                    .cloned();
            }
        }
        let mut out = pv.clone();
        topology_csi_to_in_tree(&mut out);
        let s = out.spec.get_or_insert_with(Default::default);
        s.csi = None;
        s.vsphere_volume = Some(src);
        Ok(out)
    }
}
