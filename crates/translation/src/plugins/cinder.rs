//! OpenStack Cinder: `kubernetes.io/cinder` <-> `cinder.csi.openstack.org`.
//!
//! The CSI handle is the Cinder volume ID. Zones use `topology.cinder.csi.openstack.org/zone`;
//! a region cannot be derived from a Cinder zone, so none is added on the way back. The
//! StorageClass `availability` parameter is understood by the CSI driver and kept as it is.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, CinderPersistentVolumeSource, PersistentVolume, Volume,
};
use k8s_openapi::api::storage::v1::StorageClass;

use super::{
    CSI_FS_TYPE_KEY, FS_TYPE_KEY, InTreePlugin, PluginNames, edit_spec, go_bool, go_string,
    inline_source, named_pv, parameters, pv_source, required_csi_source, spec,
};
use crate::Result;
use crate::topology::{
    translate_allowed_topologies, translate_topology_from_csi_to_in_tree_mut,
    translate_topology_from_in_tree_to_csi_mut,
};

/// In-tree plugin name.
pub const IN_TREE_PLUGIN_NAME: &str = "kubernetes.io/cinder";
/// CSI driver name.
pub const DRIVER_NAME: &str = "cinder.csi.openstack.org";
/// The driver's zone topology key.
pub const TOPOLOGY_KEY: &str = "topology.cinder.csi.openstack.org/zone";

/// The Cinder plugin.
#[derive(Debug, Clone, Copy, Default)]
pub struct Cinder;

fn csi_for(
    volume_id: &str,
    read_only: Option<bool>,
    fs_type: Option<&String>,
) -> CSIPersistentVolumeSource {
    CSIPersistentVolumeSource {
        driver: DRIVER_NAME.to_string(),
        volume_handle: volume_id.to_string(),
        read_only: go_bool(read_only),
        fs_type: go_string(fs_type),
        volume_attributes: Some(BTreeMap::new()),
        ..Default::default()
    }
}

impl InTreePlugin for Cinder {
    fn names(&self) -> PluginNames {
        PluginNames::new(IN_TREE_PLUGIN_NAME, DRIVER_NAME, "cinder")
    }

    fn can_support(&self, pv: &PersistentVolume) -> bool {
        spec(pv).is_some_and(|s| s.cinder.is_some())
    }

    fn can_support_inline(&self, volume: &Volume) -> bool {
        volume.cinder.is_some()
    }

    fn translate_in_tree_storage_class_to_csi(&self, sc: &StorageClass) -> Result<StorageClass> {
        let params = parameters(sc)
            .map(|(k, v)| {
                let key = if k.eq_ignore_ascii_case(FS_TYPE_KEY) {
                    CSI_FS_TYPE_KEY.to_string()
                } else {
                    k.clone()
                };
                (key, v.clone())
            })
            .collect();
        let mut out = sc.clone();
        out.parameters = Some(params);
        if sc
            .allowed_topologies
            .as_ref()
            .is_some_and(|t| !t.is_empty())
        {
            out.allowed_topologies =
                translate_allowed_topologies(sc.allowed_topologies.as_deref(), TOPOLOGY_KEY);
        }
        Ok(out)
    }

    fn translate_in_tree_inline_volume_to_csi(
        &self,
        volume: &Volume,
        _pod_namespace: &str,
    ) -> Result<PersistentVolume> {
        let src = inline_source(volume.cinder.as_ref(), "cinder", IN_TREE_PLUGIN_NAME)?;
        let csi = csi_for(&src.volume_id, src.read_only, src.fs_type.as_ref());
        Ok(named_pv(
            format!("{DRIVER_NAME}-{}", src.volume_id),
            csi,
            "ReadWriteOnce",
        ))
    }

    fn translate_in_tree_pv_to_csi(&self, pv: &PersistentVolume) -> Result<PersistentVolume> {
        let src = pv_source(pv, "spec.cinder", IN_TREE_PLUGIN_NAME, |s| {
            s.cinder.as_ref()
        })?;
        let csi = csi_for(&src.volume_id, src.read_only, src.fs_type.as_ref());
        let mut out = edit_spec(pv, |s| {
            s.cinder = None;
            s.csi = Some(csi);
        });
        translate_topology_from_in_tree_to_csi_mut(&mut out, TOPOLOGY_KEY);
        Ok(out)
    }

    fn translate_csi_pv_to_in_tree(&self, pv: &PersistentVolume) -> Result<PersistentVolume> {
        let csi = required_csi_source(pv, DRIVER_NAME)?;
        let cinder = CinderPersistentVolumeSource {
            volume_id: csi.volume_handle.clone(),
            fs_type: go_string(csi.fs_type.as_ref()),
            read_only: go_bool(csi.read_only),
            secret_ref: None,
        };
        let mut out = pv.clone();
        // A Cinder region cannot be guessed from a zone: only zone labels come back.
        translate_topology_from_csi_to_in_tree_mut(&mut out, TOPOLOGY_KEY, None)?;
        Ok(edit_spec(&out, |s| {
            s.csi = None;
            s.cinder = Some(cinder);
        }))
    }
}
