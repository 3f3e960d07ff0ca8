//! AWS EBS: `kubernetes.io/aws-ebs` <-> `ebs.csi.aws.com`.
//!
//! The in-tree volume ID may be a bare `vol-...` or `aws://[zone]/vol-...`; the CSI handle is
//! the bare ID. `partition` travels as a volume attribute. Zones use
//! `topology.ebs.csi.aws.com/zone`. StorageClass `iopsPerGB` gets
//! `allowautoiopspergbincrease: "true"` to keep the in-tree rounding of IOPS.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    AWSElasticBlockStoreVolumeSource, CSIPersistentVolumeSource, PersistentVolume, Volume,
};
use k8s_openapi::api::storage::v1::StorageClass;

use super::{
    FsTypeParam, InTreePlugin, PluginNames, edit_spec, go_bool, go_string, inline_source, named_pv,
    pv_source, required_csi_source, spec, translate_block_storage_class,
};
use crate::topology::{
    translate_topology_from_csi_to_in_tree_mut, translate_topology_from_in_tree_to_csi_mut,
};
use crate::{Error, Result};

/// In-tree plugin name.
pub const IN_TREE_PLUGIN_NAME: &str = "kubernetes.io/aws-ebs";
/// CSI driver name.
pub const DRIVER_NAME: &str = "ebs.csi.aws.com";
/// The driver's zone topology key.
pub const TOPOLOGY_KEY: &str = "topology.ebs.csi.aws.com/zone";
const IOPS_PER_GB_KEY: &str = "iopsPerGB";
const ALLOW_INCREASE_IOPS_KEY: &str = "allowautoiopspergbincrease";

/// The AWS EBS plugin.
#[derive(Debug, Clone, Copy, Default)]
pub struct AwsEbs;

/// The EBS volume ID inside a Kubernetes volume ID: `vol-x`, `aws:///vol-x` or
/// `aws://zone/vol-x` all give `vol-x`. An `aws://` ID is read as Go's `net/url` reads it
/// (query and fragment cut off, path percent-decoded), so the handle is upstream's.
pub fn kubernetes_volume_id_to_ebs_volume_id(kubernetes_id: &str) -> Result<String> {
    if !kubernetes_id.starts_with("aws://") {
        // A bare ID, taken as it is (upstream does not check it either).
        return Ok(kubernetes_id.to_string());
    }
    // The path, without surrounding slashes, must be one `vol-` segment.
    let path = super::go_url::aws_url_path(kubernetes_id);
    let id = path.as_deref().map(|p| p.trim_matches('/'));
    if let Some(id) = id.filter(|id| id.starts_with("vol-") && !id.contains('/')) {
        Ok(id.to_string())
    } else {
        Err(Error::InvalidField {
            field: "spec.awsElasticBlockStore.volumeID".into(),
            value: kubernetes_id.to_string(),
            reason: "expected vol-..., aws:///vol-... or aws://<zone>/vol-...".into(),
        })
    }
}

/// The region of a list of AWS zones; all must be in the same region. Understands regular
/// (`us-west-2a`), GovCloud (`us-gov-east-1a`), Local Zone (`us-west-2-lax-1a`) and Wavelength
/// (`us-east-1-wl1-bos-wlz-1`) zone names.
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
        let region = match parts.len() {
            // us-west-2a, us-gov-east-1a: the last part is the region number plus one letter.
            3 | 4 => {
                let last = parts[parts.len() - 1].as_bytes();
                // Any two characters, as upstream (`us-west-2a` -> `us-west-2`).
                if last.len() == 2 && parts[parts.len() - 1].is_char_boundary(1) {
                    let mut p = parts.clone();
                    let n = p.len() - 1;
                    p[n] = &parts[n][..1];
                    Some(p.join("-"))
                } else {
                    None
                }
            }
            // Local Zones and Wavelength Zones: the first three parts are the region.
            5 | 7 => Some(parts[..3].join("-")),
            _ => None,
        };
        match region {
            Some(r) => {
                regions.insert(r);
            }
            None => return Err(err(format!("{zone:?} is not a valid AWS zone"))),
        }
    }
    if regions.len() != 1 {
        return Err(err(format!("zones span regions {regions:?}")));
    }
    Ok(regions.into_iter().next().unwrap_or_default())
}

impl AwsEbs {
    fn csi_source(src: &AWSElasticBlockStoreVolumeSource) -> Result<CSIPersistentVolumeSource> {
        Ok(CSIPersistentVolumeSource {
            driver: DRIVER_NAME.to_string(),
            volume_handle: kubernetes_volume_id_to_ebs_volume_id(&src.volume_id)?,
            read_only: go_bool(src.read_only),
            fs_type: go_string(src.fs_type.as_ref()),
            volume_attributes: Some(BTreeMap::from([(
                "partition".to_string(),
                src.partition.unwrap_or(0).to_string(),
            )])),
            ..Default::default()
        })
    }
}

impl InTreePlugin for AwsEbs {
    fn names(&self) -> PluginNames {
        PluginNames::new(IN_TREE_PLUGIN_NAME, DRIVER_NAME, "aws-ebs")
    }

    fn can_support(&self, pv: &PersistentVolume) -> bool {
        spec(pv).is_some_and(|s| s.aws_elastic_block_store.is_some())
    }

    fn can_support_inline(&self, volume: &Volume) -> bool {
        volume.aws_elastic_block_store.is_some()
    }

    fn translate_in_tree_storage_class_to_csi(&self, sc: &StorageClass) -> Result<StorageClass> {
        translate_block_storage_class(
            sc,
            TOPOLOGY_KEY,
            FsTypeParam::Prefixed,
            |lower, _key, value, params| {
                if lower != IOPS_PER_GB_KEY.to_lowercase() {
                    return false;
                }
                params.insert(IOPS_PER_GB_KEY.to_string(), value.to_string());
                params.insert(ALLOW_INCREASE_IOPS_KEY.to_string(), "true".to_string());
                true
            },
        )
    }

    fn translate_in_tree_inline_volume_to_csi(
        &self,
        volume: &Volume,
        _pod_namespace: &str,
    ) -> Result<PersistentVolume> {
        let src = inline_source(
            volume.aws_elastic_block_store.as_ref(),
            "awsElasticBlockStore",
            IN_TREE_PLUGIN_NAME,
        )?;
        let csi = Self::csi_source(src)?;
        // The name must be unique per volume: it is the unique part of the staging path.
        let name = format!("{DRIVER_NAME}-{}", csi.volume_handle);
        Ok(named_pv(name, csi, "ReadWriteOnce"))
    }

    fn translate_in_tree_pv_to_csi(&self, pv: &PersistentVolume) -> Result<PersistentVolume> {
        let src = pv_source(pv, "spec.awsElasticBlockStore", IN_TREE_PLUGIN_NAME, |s| {
            s.aws_elastic_block_store.as_ref()
        })?;
        let csi = Self::csi_source(src)?;
        let mut out = edit_spec(pv, |s| {
            s.aws_elastic_block_store = None;
            s.csi = Some(csi);
        });
        translate_topology_from_in_tree_to_csi_mut(&mut out, TOPOLOGY_KEY);
        Ok(out)
    }

    fn translate_csi_pv_to_in_tree(&self, pv: &PersistentVolume) -> Result<PersistentVolume> {
        let csi = required_csi_source(pv, DRIVER_NAME)?;
        let partition = match csi
            .volume_attributes
            .as_ref()
            .and_then(|a| a.get("partition"))
        {
            None => None,
            Some(p) => {
                let n: i32 = p.parse().map_err(|_| Error::InvalidField {
                    field: "spec.csi.volumeAttributes.partition".into(),
                    value: p.clone(),
                    reason: "expected an integer".into(),
                })?;
                // 0 is "the whole disk", which the in-tree source writes as no partition.
                (n != 0).then_some(n)
            }
        };
        let ebs = AWSElasticBlockStoreVolumeSource {
            volume_id: csi.volume_handle.clone(),
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
        let s = out.spec.get_or_insert_with(Default::default);
        s.csi = None;
        s.aws_elastic_block_store = Some(ebs);
        Ok(out)
    }
}
