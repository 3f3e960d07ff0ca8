//! The seven migrated in-tree plugins, one module each, behind [`InTreePlugin`].

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, PersistentVolume, PersistentVolumeSpec, Volume,
};
use k8s_openapi::api::storage::v1::StorageClass;

use crate::{Error, Result};

pub mod aws_ebs;
pub mod azure_disk;
pub mod azure_file;
pub mod cinder;
pub mod gce_pd;
mod go_url;
pub mod portworx;
pub mod vsphere;

pub use aws_ebs::AwsEbs;
pub use azure_disk::AzureDisk;
pub use azure_file::AzureFile;
pub use cinder::Cinder;
pub use gce_pd::GcePd;
pub use portworx::Portworx;
pub use vsphere::VSphere;

/// StorageClass parameter of the in-tree plugins that names the filesystem.
pub(crate) const FS_TYPE_KEY: &str = "fstype";
/// The same parameter as the CSI external-provisioner expects it.
pub(crate) const CSI_FS_TYPE_KEY: &str = "csi.storage.k8s.io/fstype";
/// StorageClass parameter with one zone.
pub(crate) const ZONE_KEY: &str = "zone";
/// StorageClass parameter with comma-separated zones.
pub(crate) const ZONES_KEY: &str = "zones";

/// What a plugin is called: in-tree, as a CSI driver, and for short.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PluginNames {
    pub in_tree: &'static str,
    pub csi: &'static str,
    pub short: &'static str,
}

impl PluginNames {
    pub const fn new(in_tree: &'static str, csi: &'static str, short: &'static str) -> Self {
        Self {
            in_tree,
            csi,
            short,
        }
    }
}

/// Translation rules of one in-tree volume plugin.
///
/// Every method takes its input by reference and returns a new object.
pub trait InTreePlugin: std::fmt::Debug + Send + Sync {
    /// The plugin's three names.
    fn names(&self) -> PluginNames;
    /// The in-tree plugin name, e.g. `kubernetes.io/aws-ebs`.
    fn in_tree_plugin_name(&self) -> &'static str {
        self.names().in_tree
    }
    /// The CSI driver name, e.g. `ebs.csi.aws.com`.
    fn csi_plugin_name(&self) -> &'static str {
        self.names().csi
    }
    /// Short name used in tables and vectors, e.g. `aws-ebs`.
    fn short_name(&self) -> &'static str {
        self.names().short
    }
    /// Whether the PV carries this plugin's in-tree source.
    fn can_support(&self, pv: &PersistentVolume) -> bool;
    /// Whether the inline volume carries this plugin's in-tree source.
    fn can_support_inline(&self, volume: &Volume) -> bool;
    /// StorageClass parameters and allowed topologies in the CSI driver's terms. Like upstream,
    /// the provisioner is left alone (the caller decides who provisions), except for Portworx.
    fn translate_in_tree_storage_class_to_csi(&self, sc: &StorageClass) -> Result<StorageClass>;
    /// A PV with a CSI source for an inline volume of a pod in `pod_namespace`.
    fn translate_in_tree_inline_volume_to_csi(
        &self,
        volume: &Volume,
        pod_namespace: &str,
    ) -> Result<PersistentVolume>;
    /// The PV with its in-tree source replaced by the CSI source.
    fn translate_in_tree_pv_to_csi(&self, pv: &PersistentVolume) -> Result<PersistentVolume>;
    /// The PV with its CSI source replaced by this plugin's in-tree source.
    fn translate_csi_pv_to_in_tree(&self, pv: &PersistentVolume) -> Result<PersistentVolume>;
    /// Fills in parts of a volume handle that only the node knows (GCE PD); others return the
    /// handle unchanged.
    fn repair_volume_handle(&self, volume_handle: &str, _node_id: &str) -> Result<String> {
        Ok(volume_handle.to_string())
    }
}

static PLUGINS: [&dyn InTreePlugin; 7] = [
    &AwsEbs, &GcePd, &AzureDisk, &AzureFile, &Cinder, &VSphere, &Portworx,
];

/// All migrated plugins, in a fixed order.
pub fn plugins() -> &'static [&'static dyn InTreePlugin] {
    &PLUGINS
}

/// The plugin with this in-tree name (`kubernetes.io/...`).
pub fn plugin_by_in_tree_name(name: &str) -> Option<&'static dyn InTreePlugin> {
    PLUGINS
        .iter()
        .copied()
        .find(|p| p.in_tree_plugin_name() == name)
}

/// The plugin whose CSI driver has this name.
pub fn plugin_by_csi_name(name: &str) -> Option<&'static dyn InTreePlugin> {
    PLUGINS
        .iter()
        .copied()
        .find(|p| p.csi_plugin_name() == name)
}

/// The plugin with this short name (`aws-ebs`, `gce-pd`, ...).
pub fn plugin_by_short_name(name: &str) -> Option<&'static dyn InTreePlugin> {
    PLUGINS.iter().copied().find(|p| p.short_name() == name)
}

/// A Go `bool` field with `omitempty` (the in-tree and CSI `readOnly`): `false` is the same as
/// absent and, as upstream's output, is not written.
pub(crate) fn go_bool(v: Option<bool>) -> Option<bool> {
    v.filter(|b| *b)
}

/// A Go `string` field with `omitempty` (`fsType` outside Azure Disk): `""` is not written.
pub(crate) fn go_string(v: Option<&String>) -> Option<String> {
    v.filter(|s| !s.is_empty()).cloned()
}

/// A translation's input lacks the source it translates: `object`'s `field`, for `plugin`.
pub(crate) fn missing(object: &'static str, field: &'static str, plugin: &'static str) -> Error {
    Error::MissingSource {
        object,
        field,
        plugin,
    }
}

/// An inline volume's in-tree source `field`, or the error naming it.
pub(crate) fn inline_source<'a, T>(
    source: Option<&'a T>,
    field: &'static str,
    plugin: &'static str,
) -> Result<&'a T> {
    source.ok_or_else(|| missing("Volume", field, plugin))
}

/// A PV's in-tree source `field` (`spec.cinder`) as `get` takes it from the spec, or the error
/// naming it.
pub(crate) fn pv_source<'a, T>(
    pv: &'a PersistentVolume,
    field: &'static str,
    plugin: &'static str,
    get: impl FnOnce(&'a PersistentVolumeSpec) -> Option<&'a T>,
) -> Result<&'a T> {
    spec(pv)
        .and_then(get)
        .ok_or_else(|| missing("PersistentVolume", field, plugin))
}

/// A PV's `spec.csi`, or the error naming the CSI driver whose translation needs it.
pub(crate) fn required_csi_source<'a>(
    pv: &'a PersistentVolume,
    driver: &'static str,
) -> Result<&'a CSIPersistentVolumeSource> {
    csi_source(pv).ok_or_else(|| missing("PersistentVolume", "spec.csi", driver))
}

pub(crate) fn spec(pv: &PersistentVolume) -> Option<&PersistentVolumeSpec> {
    pv.spec.as_ref()
}

pub(crate) fn csi_source(pv: &PersistentVolume) -> Option<&CSIPersistentVolumeSource> {
    spec(pv)?.csi.as_ref()
}

/// `metadata.name` of a new PV for an inline volume.
pub(crate) fn named_pv(
    name: String,
    csi: CSIPersistentVolumeSource,
    access_mode: &str,
) -> PersistentVolume {
    PersistentVolume {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(name),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            csi: Some(csi),
            access_modes: Some(vec![access_mode.to_string()]),
            ..Default::default()
        }),
        status: None,
    }
}

/// A copy of `pv` whose spec is handed to `edit` (created when absent).
pub(crate) fn edit_spec(
    pv: &PersistentVolume,
    edit: impl FnOnce(&mut PersistentVolumeSpec),
) -> PersistentVolume {
    let mut out = pv.clone();
    edit(out.spec.get_or_insert_with(Default::default));
    out
}

/// Parameters of a StorageClass, or an empty map.
pub(crate) fn parameters(sc: &StorageClass) -> impl Iterator<Item = (&String, &String)> {
    sc.parameters.iter().flatten()
}

/// Whether [`translate_block_storage_class`] renames `fstype` to the CSI parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FsTypeParam {
    /// `fstype` becomes `csi.storage.k8s.io/fstype` (AWS EBS, GCE PD).
    Prefixed,
    /// `fstype` is passed on as it is: the Azure Disk CSI driver reads it (as upstream).
    Kept,
}

/// `fstype` / `zone` / `zones` handling shared by the block-storage plugins (AWS EBS, GCE PD,
/// Azure Disk): `fstype` as `fs_type` says, `zone(s)` become allowed topologies under
/// `topology_key`, existing allowed topologies are re-keyed, and both at once is an error.
/// `extra` may claim other (lower-cased) keys and write into the new parameters.
pub(crate) fn translate_block_storage_class(
    sc: &StorageClass,
    topology_key: &str,
    fs_type: FsTypeParam,
    mut extra: impl FnMut(&str, &str, &str, &mut BTreeMap<String, String>) -> bool,
) -> Result<StorageClass> {
    let mut params = BTreeMap::new();
    let mut generated = None;
    for (k, v) in parameters(sc) {
        let lower = k.to_lowercase();
        match lower.as_str() {
            FS_TYPE_KEY if fs_type == FsTypeParam::Prefixed => {
                params.insert(CSI_FS_TYPE_KEY.to_string(), v.clone());
            }
            ZONE_KEY => generated = Some(vec![v.clone()]),
            ZONES_KEY => generated = Some(v.split(',').map(str::to_string).collect()),
            _ => {
                if !extra(&lower, k, v, &mut params) {
                    params.insert(k.clone(), v.clone());
                }
            }
        }
    }
    let mut out = sc.clone();
    let has_allowed = sc
        .allowed_topologies
        .as_ref()
        .is_some_and(|t| !t.is_empty());
    match generated {
        Some(_) if has_allowed => {
            return Err(crate::Error::Conflict {
                first: "allowedTopologies",
                second: "the zone/zones parameters",
            });
        }
        Some(zones) => {
            out.allowed_topologies = Some(crate::topology::generate_topology_selectors(
                topology_key,
                zones,
            ));
        }
        None if has_allowed => {
            out.allowed_topologies = crate::topology::translate_allowed_topologies(
                sc.allowed_topologies.as_deref(),
                topology_key,
            );
        }
        None => {}
    }
    out.parameters = Some(params);
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn each_plugin_names_the_source_its_input_lacks() {
        let empty_pv = PersistentVolume {
            spec: Some(PersistentVolumeSpec::default()),
            ..PersistentVolume::default()
        };
        for p in plugins() {
            let names = p.names();
            let e = p.translate_csi_pv_to_in_tree(&empty_pv).unwrap_err();
            let want = format!(
                "PersistentVolume has no spec.csi: not a {} volume",
                names.csi
            );
            assert_eq!(e.to_string(), want);
            let e = p.translate_in_tree_pv_to_csi(&empty_pv).unwrap_err();
            let (prefix, suffix) = ("PersistentVolume has no spec.", names.in_tree);
            assert!(e.to_string().starts_with(prefix), "{e}");
            assert!(
                e.to_string().ends_with(&format!("not a {suffix} volume")),
                "{e}"
            );
            let e = p
                .translate_in_tree_inline_volume_to_csi(&Volume::default(), "ns")
                .unwrap_err();
            assert!(e.to_string().starts_with("Volume has no "), "{e}");
            assert!(!e.to_string().contains("spec."), "an inline source: {e}");
        }
    }
}
