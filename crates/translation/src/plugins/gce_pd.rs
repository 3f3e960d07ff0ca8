//! GCE PD: `kubernetes.io/gce-pd` <-> `pd.csi.storage.gke.io`.
//!
//! The CSI handle is `projects/<p>/zones/<z>/disks/<name>` or, for a regional disk (zone label
//! `a__b`), `projects/<p>/regions/<r>/disks/<name>`. The project (and a missing zone) is
//! `UNSPECIFIED`: only the node knows them, so [`GcePd::repair_volume_handle`] fills them in from
//! the node ID. Access modes are narrowed to what the CSI driver accepts.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, GCEPersistentDiskVolumeSource, PersistentVolume, Volume,
};
use k8s_openapi::api::storage::v1::StorageClass;

use super::{
    FsTypeParam, InTreePlugin, PluginNames, edit_spec, go_bool, go_string, inline_source, named_pv,
    pv_source, required_csi_source, spec, translate_block_storage_class,
};
use crate::topology::{
    LABEL_FAILURE_DOMAIN_BETA_ZONE, LABEL_MULTI_ZONE_DELIMITER, LABEL_TOPOLOGY_ZONE, label,
    translate_topology_from_csi_to_in_tree_mut, translate_topology_from_in_tree_to_csi_mut,
};
use crate::{Error, Result};

/// In-tree plugin name.
pub const IN_TREE_PLUGIN_NAME: &str = "kubernetes.io/gce-pd";
/// CSI driver name.
pub const DRIVER_NAME: &str = "pd.csi.storage.gke.io";
/// The driver's zone topology key.
pub const TOPOLOGY_KEY: &str = "topology.gke.io/zone";
/// Placeholder for a project or zone that only the node knows.
pub const UNSPECIFIED: &str = "UNSPECIFIED";

// Positions in `projects/<p>/{zones|regions}/<z|r>/disks/<name>` and
// `projects/<p>/zones/<z>/instances/<name>`.
const ID_PROJECT: usize = 1;
const ID_SCOPE: usize = 2;
const ID_ZONE_OR_REGION: usize = 3;
const ID_DISK_NAME: usize = 5;
const ID_TOTAL_ELEMENTS: usize = 6;

/// The GCE PD plugin.
#[derive(Debug, Clone, Copy, Default)]
pub struct GcePd;

/// The region of GCE zones (`{locale}-{region}-{zone}`, e.g. `us-central1-a` -> `us-central1`);
/// all zones must be in one region.
pub fn region_from_zones(zones: &[String]) -> Result<String> {
    let err = |reason: String| Error::Region {
        zones: zones.to_vec(),
        reason,
    };
    if zones.is_empty() {
        return Err(err("no zones given".into()));
    }
    let mut regions = std::collections::BTreeSet::new();
    for zone in zones {
        let parts: Vec<&str> = zone.split('-').collect();
        if parts.len() != 3 {
            return Err(err(format!(
                "zone {zone:?} is not of the form {{locale}}-{{region}}-{{zone}}"
            )));
        }
        regions.insert(parts[..2].join("-"));
    }
    if regions.len() != 1 {
        return Err(err(format!("zones span regions {regions:?}")));
    }
    Ok(regions.into_iter().next().unwrap_or_default())
}

/// Access modes the GCE PD CSI driver accepts for what in-tree allowed: in-tree treated
/// ReadWriteMany and "ReadOnlyMany + ReadWriteOnce" as ReadWriteOnce, which CSI validates.
pub fn backward_compatible_access_modes(modes: Option<&[String]>) -> Option<Vec<String>> {
    let modes = modes?;
    let has = |m: &str| {
        modes
            .iter()
            .any(|x| x == m || (m == "ReadWriteOnce" && x == "ReadWriteMany"))
    };
    let mode = if has("ReadWriteOnce") || !has("ReadOnlyMany") {
        "ReadWriteOnce"
    } else {
        "ReadOnlyMany"
    };
    Some(vec![mode.to_string()])
}

fn pd_name_from_volume_id(id: &str) -> Result<String> {
    let parts: Vec<&str> = id.split('/').collect();
    if parts.len() < ID_TOTAL_ELEMENTS {
        return Err(Error::InvalidField {
            field: "spec.csi.volumeHandle".into(),
            value: id.to_string(),
            reason: "expected projects/<project>/zones|regions/<zone|region>/disks/<name>".into(),
        });
    }
    Ok(parts[ID_DISK_NAME].to_string())
}

fn partition_attribute(partition: Option<i32>) -> String {
    match partition {
        Some(p) if p != 0 => p.to_string(),
        _ => String::new(),
    }
}

impl InTreePlugin for GcePd {
    fn names(&self) -> PluginNames {
        PluginNames::new(IN_TREE_PLUGIN_NAME, DRIVER_NAME, "gce-pd")
    }

    fn can_support(&self, pv: &PersistentVolume) -> bool {
        spec(pv).is_some_and(|s| s.gce_persistent_disk.is_some())
    }

    fn can_support_inline(&self, volume: &Volume) -> bool {
        volume.gce_persistent_disk.is_some()
    }

    fn translate_in_tree_storage_class_to_csi(&self, sc: &StorageClass) -> Result<StorageClass> {
        translate_block_storage_class(sc, TOPOLOGY_KEY, FsTypeParam::Prefixed, |_, _, _, _| false)
    }

    fn translate_in_tree_inline_volume_to_csi(
        &self,
        volume: &Volume,
        _pod_namespace: &str,
    ) -> Result<PersistentVolume> {
        let src = inline_source(
            volume.gce_persistent_disk.as_ref(),
            "gcePersistentDisk",
            IN_TREE_PLUGIN_NAME,
        )?;
        let read_only = src.read_only == Some(true);
        let csi = CSIPersistentVolumeSource {
            driver: DRIVER_NAME.to_string(),
            volume_handle: format!(
                "projects/{UNSPECIFIED}/zones/{UNSPECIFIED}/disks/{}",
                src.pd_name
            ),
            read_only: go_bool(src.read_only),
            fs_type: go_string(src.fs_type.as_ref()),
            volume_attributes: Some(BTreeMap::from([(
                "partition".to_string(),
                partition_attribute(src.partition),
            )])),
            ..Default::default()
        };
        let mode = if read_only {
            "ReadOnlyMany"
        } else {
            "ReadWriteOnce"
        };
        let mut pv = named_pv(format!("{DRIVER_NAME}-{}", src.pd_name), csi, mode);
        if let Some(s) = pv.spec.as_mut() {
            s.volume_mode = Some("Filesystem".to_string());
        }
        Ok(pv)
    }

    fn translate_in_tree_pv_to_csi(&self, pv: &PersistentVolume) -> Result<PersistentVolume> {
        let src = pv_source(pv, "spec.gcePersistentDisk", IN_TREE_PLUGIN_NAME, |s| {
            s.gce_persistent_disk.as_ref()
        })?;
        // Whichever zone label the PV was labelled with when it was created.
        let zones_label = label(pv, LABEL_FAILURE_DOMAIN_BETA_ZONE)
            .filter(|z| !z.is_empty())
            .or_else(|| label(pv, LABEL_TOPOLOGY_ZONE))
            .unwrap_or("");
        let zones: Vec<String> = zones_label
            .split(LABEL_MULTI_ZONE_DELIMITER)
            .map(str::to_string)
            .collect();
        let handle = if zones.len() == 1 && !zones[0].is_empty() {
            format!(
                "projects/{UNSPECIFIED}/zones/{}/disks/{}",
                zones[0], src.pd_name
            )
        } else if zones.len() > 1 {
            let region = region_from_zones(&zones)?;
            format!(
                "projects/{UNSPECIFIED}/regions/{region}/disks/{}",
                src.pd_name
            )
        } else {
            format!(
                "projects/{UNSPECIFIED}/zones/{UNSPECIFIED}/disks/{}",
                src.pd_name
            )
        };
        let csi = CSIPersistentVolumeSource {
            driver: DRIVER_NAME.to_string(),
            volume_handle: handle,
            read_only: go_bool(src.read_only),
            fs_type: go_string(src.fs_type.as_ref()),
            volume_attributes: Some(BTreeMap::from([(
                "partition".to_string(),
                partition_attribute(src.partition),
            )])),
            ..Default::default()
        };
        let mut out = pv.clone();
        translate_topology_from_in_tree_to_csi_mut(&mut out, TOPOLOGY_KEY);
        let s = out.spec.get_or_insert_with(Default::default);
        s.gce_persistent_disk = None;
        s.csi = Some(csi);
        s.access_modes = backward_compatible_access_modes(s.access_modes.as_deref());
        Ok(out)
    }

    fn translate_csi_pv_to_in_tree(&self, pv: &PersistentVolume) -> Result<PersistentVolume> {
        let csi = required_csi_source(pv, DRIVER_NAME)?;
        let pd_name = pd_name_from_volume_id(&csi.volume_handle)?;
        let partition = match csi
            .volume_attributes
            .as_ref()
            .and_then(|a| a.get("partition"))
        {
            Some(p) if !p.is_empty() => {
                let n: i32 = p.parse().map_err(|_| Error::InvalidField {
                    field: "spec.csi.volumeAttributes.partition".into(),
                    value: p.clone(),
                    reason: "expected an integer".into(),
                })?;
                (n != 0).then_some(n)
            }
            _ => None,
        };
        let gce = GCEPersistentDiskVolumeSource {
            pd_name,
            fs_type: go_string(csi.fs_type.as_ref()),
            read_only: go_bool(csi.read_only),
            partition,
        };
        let mut out = pv.clone();
        translate_topology_from_csi_to_in_tree_mut(
            &mut out,
            TOPOLOGY_KEY,
            Some(region_from_zones),
        )?;
        Ok(edit_spec(&out, |s| {
            s.csi = None;
            s.gce_persistent_disk = Some(gce);
        }))
    }

    fn repair_volume_handle(&self, volume_handle: &str, node_id: &str) -> Result<String> {
        let tok: Vec<&str> = volume_handle.split('/').collect();
        if tok.len() < ID_TOTAL_ELEMENTS {
            return Err(Error::InvalidField {
                field: "volumeHandle".into(),
                value: volume_handle.to_string(),
                reason: format!(
                    "has {} /-separated elements, expected {ID_TOTAL_ELEMENTS} or more",
                    tok.len()
                ),
            });
        }
        if tok[ID_PROJECT] != UNSPECIFIED {
            return Ok(volume_handle.to_string());
        }
        let node: Vec<&str> = node_id.split('/').collect();
        if node.len() < ID_TOTAL_ELEMENTS {
            return Err(Error::InvalidField {
                field: "nodeID".into(),
                value: node_id.to_string(),
                reason: "expected projects/<project>/zones/<zone>/instances/<name>".into(),
            });
        }
        let project = node[ID_PROJECT];
        let disk = tok[ID_DISK_NAME];
        match tok[ID_SCOPE] {
            "zones" => {
                let zone = if tok[ID_ZONE_OR_REGION] == UNSPECIFIED {
                    node[ID_ZONE_OR_REGION]
                } else {
                    tok[ID_ZONE_OR_REGION]
                };
                Ok(format!("projects/{project}/zones/{zone}/disks/{disk}"))
            }
            "regions" => {
                let region = if tok[ID_ZONE_OR_REGION] == UNSPECIFIED {
                    region_from_zones(&[node[ID_ZONE_OR_REGION].to_string()])?
                } else {
                    tok[ID_ZONE_OR_REGION].to_string()
                };
                Ok(format!("projects/{project}/regions/{region}/disks/{disk}"))
            }
            other => Err(Error::InvalidField {
                field: "volumeHandle".into(),
                value: volume_handle.to_string(),
                reason: format!(
                    "expected \"zones\" or \"regions\" as third element, got {other:?}"
                ),
            }),
        }
    }
}
