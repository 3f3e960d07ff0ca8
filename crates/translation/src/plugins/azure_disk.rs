//! Azure Disk: `kubernetes.io/azure-disk` <-> `disk.csi.azure.com`.
//!
//! Only managed disks migrate (`kind` absent or `Managed`). The CSI handle is the disk URI;
//! caching mode and fsType travel as volume attributes. StorageClass zones use
//! `topology.disk.csi.azure.com/zone`; a purely numeric zone (a fault domain of a region without
//! zones) becomes the empty zone, as the CSI driver expects.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use k8s_openapi::api::core::v1::{
    AzureDiskVolumeSource, CSIPersistentVolumeSource, PersistentVolume, Volume,
};
use k8s_openapi::api::storage::v1::StorageClass;
use regex_lite::Regex;

use super::{
    FsTypeParam, InTreePlugin, PluginNames, edit_spec, go_bool, go_string, inline_source, named_pv,
    pv_source, required_csi_source, spec, translate_block_storage_class,
};
use crate::{Error, Result};

/// In-tree plugin name.
pub const IN_TREE_PLUGIN_NAME: &str = "kubernetes.io/azure-disk";
/// CSI driver name.
pub const DRIVER_NAME: &str = "disk.csi.azure.com";
/// The driver's zone topology key.
pub const TOPOLOGY_KEY: &str = "topology.disk.csi.azure.com/zone";

const MANAGED: &str = "Managed";
const ATTR_KIND: &str = "kind";
const ATTR_CACHING_MODE: &str = "cachingmode";
const ATTR_FS_TYPE: &str = "fstype";

const MANAGED_DISK_PATTERN: &str =
    r".*/subscriptions/(?:.*)/resourceGroups/(?:.*)/providers/Microsoft.Compute/disks/(.+)";
const UNMANAGED_DISK_PATTERN: &str = r"http(?:.*)://(?:.*)/vhds/(.+)";

// Both patterns are constants that the tests compile; a failure here is a programming error.
#[allow(clippy::expect_used)]
static MANAGED_DISK_RE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(MANAGED_DISK_PATTERN).expect("constant pattern compiles"));
#[allow(clippy::expect_used)]
static UNMANAGED_DISK_RE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(UNMANAGED_DISK_PATTERN).expect("constant pattern compiles"));

/// The Azure Disk plugin.
#[derive(Debug, Clone, Copy, Default)]
pub struct AzureDisk;

/// Whether a disk URI names a managed disk: unmanaged disks are blob URLs (`http...`).
pub fn is_managed_disk(disk_uri: &str) -> bool {
    !(disk_uri.len() > 4 && disk_uri.as_bytes()[..4].eq_ignore_ascii_case(b"http"))
}

/// The disk name at the end of a managed disk resource ID or an unmanaged `.../vhds/<name>` URL.
pub fn disk_name(disk_uri: &str) -> Result<String> {
    let (re, pattern) = if is_managed_disk(disk_uri) {
        (&*MANAGED_DISK_RE, MANAGED_DISK_PATTERN)
    } else {
        (&*UNMANAGED_DISK_RE, UNMANAGED_DISK_PATTERN)
    };
    re.captures(disk_uri)
        .and_then(|c| c.get(1))
        .map(|m| m.as_str().to_string())
        .ok_or_else(|| Error::AzureDiskName {
            uri: disk_uri.to_string(),
            pattern,
        })
}

fn check_kind(kind: Option<&String>, field: &'static str) -> Result<()> {
    match kind {
        Some(k) if !k.eq_ignore_ascii_case(MANAGED) => Err(Error::Unsupported {
            field,
            reason: format!(
                "kind({k}) is not supported in CSI migration: only Managed disks migrate"
            ),
        }),
        _ => Ok(()),
    }
}

fn csi_source_for(src: &AzureDiskVolumeSource) -> CSIPersistentVolumeSource {
    let mut attrs = BTreeMap::from([(ATTR_KIND.to_string(), MANAGED.to_string())]);
    if let Some(mode) = src.caching_mode.as_ref().filter(|m| !m.is_empty()) {
        attrs.insert(ATTR_CACHING_MODE.to_string(), mode.clone());
    }
    if let Some(fs) = &src.fs_type {
        attrs.insert(ATTR_FS_TYPE.to_string(), fs.clone());
    }
    CSIPersistentVolumeSource {
        driver: DRIVER_NAME.to_string(),
        volume_handle: src.disk_uri.clone(),
        // `csi.readOnly` is a plain Go bool: `false` is not written.
        read_only: go_bool(src.read_only),
        fs_type: go_string(src.fs_type.as_ref()),
        volume_attributes: Some(attrs),
        ..Default::default()
    }
}

/// A zone value of a region without availability zones is a fault-domain number, which the CSI
/// driver knows as the empty zone.
fn csi_zone(value: &str) -> String {
    if value.parse::<i64>().is_ok() {
        String::new()
    } else {
        value.to_string()
    }
}

impl InTreePlugin for AzureDisk {
    fn names(&self) -> PluginNames {
        PluginNames::new(IN_TREE_PLUGIN_NAME, DRIVER_NAME, "azure-disk")
    }

    fn can_support(&self, pv: &PersistentVolume) -> bool {
        spec(pv).is_some_and(|s| s.azure_disk.is_some())
    }

    fn can_support_inline(&self, volume: &Volume) -> bool {
        volume.azure_disk.is_some()
    }

    fn translate_in_tree_storage_class_to_csi(&self, sc: &StorageClass) -> Result<StorageClass> {
        let translated_existing = sc
            .allowed_topologies
            .as_ref()
            .is_some_and(|t| !t.is_empty());
        let mut out =
            translate_block_storage_class(sc, TOPOLOGY_KEY, FsTypeParam::Kept, |_, _, _, _| false)?;
        if translated_existing {
            for term in out.allowed_topologies.iter_mut().flatten() {
                for exp in term.match_label_expressions.iter_mut().flatten() {
                    if exp.key == TOPOLOGY_KEY {
                        exp.values = exp.values.iter().map(|v| csi_zone(v)).collect();
                    }
                }
            }
        }
        Ok(out)
    }

    fn translate_in_tree_inline_volume_to_csi(
        &self,
        volume: &Volume,
        _pod_namespace: &str,
    ) -> Result<PersistentVolume> {
        let src = inline_source(volume.azure_disk.as_ref(), "azureDisk", IN_TREE_PLUGIN_NAME)?;
        check_kind(src.kind.as_ref(), "azureDisk.kind")?;
        // The disk URI is unique per disk: it is the unique part of the staging path.
        Ok(named_pv(
            src.disk_uri.clone(),
            csi_source_for(src),
            "ReadWriteOnce",
        ))
    }

    fn translate_in_tree_pv_to_csi(&self, pv: &PersistentVolume) -> Result<PersistentVolume> {
        let src = pv_source(pv, "spec.azureDisk", IN_TREE_PLUGIN_NAME, |s| {
            s.azure_disk.as_ref()
        })?;
        check_kind(src.kind.as_ref(), "spec.azureDisk.kind")?;
        let csi = csi_source_for(src);
        Ok(edit_spec(pv, |s| {
            s.azure_disk = None;
            s.csi = Some(csi);
        }))
    }

    fn translate_csi_pv_to_in_tree(&self, pv: &PersistentVolume) -> Result<PersistentVolume> {
        let csi = required_csi_source(pv, DRIVER_NAME)?;
        let mut disk = AzureDiskVolumeSource {
            disk_name: disk_name(&csi.volume_handle)?,
            disk_uri: csi.volume_handle.clone(),
            kind: Some(MANAGED.to_string()),
            // As upstream: both pointers are always set from the CSI source (`""`/`false` when
            // it has none), so a CSI fsType without the fstype attribute is kept.
            read_only: Some(csi.read_only.unwrap_or(false)),
            fs_type: Some(csi.fs_type.clone().unwrap_or_default()),
            ..Default::default()
        };
        for (k, v) in csi.volume_attributes.iter().flatten() {
            match k.to_lowercase().as_str() {
                ATTR_CACHING_MODE if !v.is_empty() => disk.caching_mode = Some(v.clone()),
                ATTR_FS_TYPE if !v.is_empty() => disk.fs_type = Some(v.clone()),
                _ => {}
            }
        }
        Ok(edit_spec(pv, |s| {
            s.csi = None;
            s.azure_disk = Some(disk);
        }))
    }
}
