//! The in-tree `kubernetes.io/aws-ebs` provisioner and deleter, as kube-controller-manager's
//! persistentvolume controller runs them for a StorageClass of that plugin while the plugin is
//! not migrated to CSI. EC2 only through [`ebs_cloud::Cloud`].
//!
//! Unlike the Go in-tree plugin, provisioning is idempotent across restarts: the EBS volume is
//! created under the PV's name (`pvc-<claim uid>`, recorded in the `CSIVolumeName` tag with a
//! client token derived from it), and looked up by that name before anything is created, so a
//! crash between CreateVolume and the PV's creation leaves one EC2 volume, found again by the
//! next attempt. The name is the one the EBS CSI driver would use for the same claim, so a
//! class migrated halfway through a provisioning finds the same volume as well.
//!
//! The PV is the one the in-tree plugin made; docs/pv-controller.md lists its fields.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    AWSElasticBlockStoreVolumeSource, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    ObjectReference, PersistentVolume, PersistentVolumeClaim, PersistentVolumeSpec,
    VolumeNodeAffinity,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use sha2::{Digest, Sha256};

use crate::names::AWS_EBS_PLUGIN_NAME;
use crate::{Error, Result};

/// `pv.kubernetes.io/provisioned-by`: who provisioned a PV.
pub const ANN_PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
/// `kubernetes.io/createdby`: the in-tree plugin's own mark on its PVs.
pub const ANN_CREATED_BY: &str = "kubernetes.io/createdby";
/// The value of [`ANN_CREATED_BY`] on the PVs this plugin makes.
pub const CREATED_BY: &str = "aws-ebs-dynamic-provisioner";
/// `pv.kubernetes.io/bound-by-controller`: the controller, not a user, set the claimRef.
pub const ANN_BOUND_BY_CONTROLLER: &str = "pv.kubernetes.io/bound-by-controller";
/// Zone and region labels (and node affinity keys) of the PVs made here.
pub const LABEL_ZONE: &str = "topology.kubernetes.io/zone";
pub const LABEL_REGION: &str = "topology.kubernetes.io/region";
/// The in-tree default volume type.
pub const DEFAULT_VOLUME_TYPE: &str = "gp2";
/// The in-tree default filesystem.
pub const DEFAULT_FS_TYPE: &str = "ext4";
/// Tags the in-tree plugin put on every volume it created.
pub const TAG_PVC_NAME: &str = "kubernetes.io/created-for/pvc/name";
pub const TAG_PVC_NAMESPACE: &str = "kubernetes.io/created-for/pvc/namespace";
pub const TAG_PV_NAME: &str = "kubernetes.io/created-for/pv/name";
/// The legacy cluster tag (the AWS cloud provider writes it next to `kubernetes.io/cluster/<id>`).
pub const TAG_LEGACY_CLUSTER: &str = "KubernetesCluster";

const GIB: u128 = 1 << 30;
/// EC2's io1 IOPS bounds, which the in-tree plugin clamped `iopsPerGB` into (with
/// `allowAutoIOPSPerGBIncrease` for the lower bound).
const IO1_MIN_IOPS: i64 = 100;
const IO1_MAX_IOPS: i64 = 64_000;

/// The StorageClass parameters the in-tree plugin knew, parsed. Keys are case-insensitive as
/// they were in Go.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AwsEbsParameters {
    pub volume_type: String,
    pub zone: Option<String>,
    pub zones: Vec<String>,
    pub iops_per_gb: Option<i64>,
    pub allow_iops_increase: bool,
    pub encrypted: bool,
    pub kms_key_id: Option<String>,
    pub fs_type: String,
}

/// Parses StorageClass `parameters`. An unknown key is refused with the in-tree message
/// (`invalid option "x" for volume plugin kubernetes.io/aws-ebs`), which ends up in the
/// claim's `ProvisioningFailed` Event.
pub fn parse_parameters(parameters: &BTreeMap<String, String>) -> Result<AwsEbsParameters> {
    let mut p = AwsEbsParameters {
        volume_type: DEFAULT_VOLUME_TYPE.into(),
        fs_type: DEFAULT_FS_TYPE.into(),
        ..AwsEbsParameters::default()
    };
    let invalid = |key: &str, value: &str, why: &str| {
        Error::InvalidSpec(format!(
            "StorageClass parameter {key}={value:?} of volume plugin {AWS_EBS_PLUGIN_NAME}: {why}"
        ))
    };
    for (key, value) in parameters {
        match key.to_ascii_lowercase().as_str() {
            "type" => {
                if !value.is_empty() {
                    p.volume_type = value.to_ascii_lowercase();
                }
            }
            "zone" => p.zone = Some(value.clone()).filter(|z| !z.is_empty()),
            "zones" => {
                p.zones = value
                    .split(',')
                    .map(str::trim)
                    .filter(|z| !z.is_empty())
                    .map(str::to_string)
                    .collect();
            }
            "iopspergb" => {
                let n: i64 = value
                    .trim()
                    .parse()
                    .map_err(|_| invalid(key, value, "want a whole number"))?;
                if n <= 0 {
                    return Err(invalid(key, value, "want a number above 0"));
                }
                p.iops_per_gb = Some(n);
            }
            "allowautoiopspergbincrease" => {
                p.allow_iops_increase = parse_go_bool(value)
                    .ok_or_else(|| invalid(key, value, "want true or false"))?;
            }
            "encrypted" => {
                p.encrypted = parse_go_bool(value)
                    .ok_or_else(|| invalid(key, value, "want true or false"))?;
            }
            "kmskeyid" => p.kms_key_id = Some(value.clone()).filter(|k| !k.is_empty()),
            "fstype" => {
                if !value.is_empty() {
                    p.fs_type = value.clone();
                }
            }
            _ => {
                return Err(Error::InvalidSpec(format!(
                    "invalid option {key:?} for volume plugin {AWS_EBS_PLUGIN_NAME}"
                )));
            }
        }
    }
    if p.zone.is_some() && !p.zones.is_empty() {
        return Err(Error::InvalidSpec(format!(
            "both zone and zones StorageClass parameters must not be used at the same time (volume plugin {AWS_EBS_PLUGIN_NAME})"
        )));
    }
    Ok(p)
}

/// Go's `strconv.ParseBool`.
fn parse_go_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Bytes of a Kubernetes quantity (`10Gi`, `1.5G`, `500M`, `1e9`, `100m`), rounded up to a
/// whole byte. `None` for what Kubernetes would not accept as a quantity.
pub fn quantity_to_bytes(quantity: &str) -> Option<u128> {
    let s = quantity.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    let number = number.strip_prefix('+').unwrap_or(number);
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && frac.is_empty() {
        return None;
    }
    if !whole
        .bytes()
        .chain(frac.bytes())
        .all(|b| b.is_ascii_digit())
        || frac.len() > 18
    {
        return None;
    }
    let mantissa: u128 = format!("{whole}{frac}").parse().ok()?;
    let scale = 10u128.checked_pow(u32::try_from(frac.len()).ok()?)?;
    // value = mantissa / scale * num / den
    let (num, den): (u128, u128) = match suffix {
        "" => (1, 1),
        "Ki" => (1 << 10, 1),
        "Mi" => (1 << 20, 1),
        "Gi" => (1 << 30, 1),
        "Ti" => (1 << 40, 1),
        "Pi" => (1 << 50, 1),
        "Ei" => (1 << 60, 1),
        "m" => (1, 1000),
        "k" => (1_000, 1),
        "M" => (1_000_000, 1),
        "G" => (1_000_000_000, 1),
        "T" => (1_000_000_000_000, 1),
        "P" => (1_000_000_000_000_000, 1),
        "E" => (1_000_000_000_000_000_000, 1),
        exp if exp.starts_with(['e', 'E']) => {
            let e: u32 = exp[1..].parse().ok()?;
            (10u128.checked_pow(e)?, 1)
        }
        _ => return None,
    };
    let top = mantissa.checked_mul(num)?;
    let bottom = scale.checked_mul(den)?;
    Some(top.div_ceil(bottom))
}

/// GiB of a claim's request, rounded up as the in-tree plugin did (`RoundUpToGiB`).
pub fn round_up_to_gib(bytes: u128) -> i64 {
    i64::try_from(bytes.div_ceil(GIB)).unwrap_or(i64::MAX)
}

/// What one provisioning needs besides the cloud.
#[derive(Debug, Clone)]
pub struct ProvisionRequest<'a> {
    /// `pvc-<claim uid>`: the PV's name and the EBS volume's name (idempotency key).
    pub pv_name: &'a str,
    pub claim: &'a PersistentVolumeClaim,
    pub storage_class_name: &'a str,
    pub parameters: &'a BTreeMap<String, String>,
    /// The class's `reclaimPolicy` (Delete when unset).
    pub reclaim_policy: &'a str,
    pub mount_options: &'a [String],
    /// `--cluster-name` (kube-controller-manager's default `kubernetes`).
    pub cluster_name: &'a str,
    /// The zone of the node the scheduler picked (`volume.kubernetes.io/selected-node`'s
    /// `topology.kubernetes.io/zone` label), for WaitForFirstConsumer classes.
    pub selected_node_zone: Option<&'a str>,
    /// The zones the class's `allowedTopologies` admit (empty: no restriction).
    pub allowed_zones: &'a [String],
}

/// The provisioned EBS volume and its PV.
#[derive(Debug, Clone)]
pub struct Provisioned {
    pub volume_id: String,
    pub zone: String,
    pub size_gib: i64,
    /// Whether this call created the EBS volume (false: found under the PV's name).
    pub created: bool,
    pub pv: PersistentVolume,
}

/// Creates (or finds) the EBS volume for a claim and returns the PV the in-tree plugin made.
pub async fn provision(
    cloud: &dyn ebs_cloud::Cloud,
    req: &ProvisionRequest<'_>,
) -> Result<Provisioned> {
    let claim_name = req.claim.metadata.name.clone().unwrap_or_default();
    let claim_namespace = req.claim.metadata.namespace.clone().unwrap_or_default();
    let params = parse_parameters(req.parameters)?;
    let spec = req.claim.spec.as_ref();
    if spec.and_then(|s| s.selector.as_ref()).is_some() {
        return Err(Error::InvalidSpec(
            "claim.Spec.Selector is not supported for dynamic provisioning on AWS".into(),
        ));
    }
    if spec.and_then(|s| s.data_source.as_ref()).is_some() {
        return Err(Error::InvalidSpec(format!(
            "plugin {AWS_EBS_PLUGIN_NAME:?} is not a CSI plugin. Only CSI plugin can provision a claim with a datasource"
        )));
    }
    let request = spec
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .ok_or_else(|| {
            Error::InvalidSpec(format!(
                "claim {claim_namespace}/{claim_name} has no spec.resources.requests.storage"
            ))
        })?;
    let bytes = quantity_to_bytes(&request.0).ok_or_else(|| {
        Error::InvalidSpec(format!(
            "claim {claim_namespace}/{claim_name}: spec.resources.requests.storage {:?} is not a quantity",
            request.0
        ))
    })?;
    let size_gib = round_up_to_gib(bytes).max(1);

    let operation = "create";
    let cloud_err = |source| Error::Cloud {
        operation,
        volume_id: req.pv_name.to_string(),
        source,
    };
    let (disk, created) = match cloud
        .get_disk_by_name(req.pv_name)
        .await
        .map_err(cloud_err)?
    {
        Some(disk) => (disk, false),
        None => {
            let zone = choose_zone(cloud, &params, req).await?;
            let options = ebs_cloud::DiskOptions {
                size_gib,
                volume_type: params.volume_type.clone(),
                iops: iops(&params, size_gib),
                encrypted: params.encrypted,
                kms_key_id: params.kms_key_id.clone(),
                zone,
                tags: tags(req, &claim_name, &claim_namespace),
                ..ebs_cloud::DiskOptions::default()
            };
            (
                cloud
                    .create_disk(req.pv_name, &options)
                    .await
                    .map_err(cloud_err)?,
                true,
            )
        }
    };
    let pv = persistent_volume(
        req,
        &params,
        &disk.volume_id,
        &disk.zone,
        disk.size_gib.max(size_gib),
    );
    Ok(Provisioned {
        volume_id: disk.volume_id,
        zone: disk.zone,
        size_gib: disk.size_gib.max(size_gib),
        created,
        pv,
    })
}

/// Deletes the EBS volume of an in-tree PV. `Ok(false)`: it was already gone.
pub async fn delete(cloud: &dyn ebs_cloud::Cloud, pv: &PersistentVolume) -> Result<bool> {
    let name = pv.metadata.name.clone().unwrap_or_default();
    let spec_id = pv
        .spec
        .as_ref()
        .and_then(|s| s.aws_elastic_block_store.as_ref())
        .map(|s| s.volume_id.clone())
        .ok_or_else(|| {
            Error::InvalidSpec(format!(
                "PersistentVolume {name} has no spec.awsElasticBlockStore: not a {AWS_EBS_PLUGIN_NAME} volume"
            ))
        })?;
    let volume_id = super::volume_id_from_spec(&spec_id)?;
    cloud
        .delete_disk(&volume_id)
        .await
        .map_err(|source| Error::Cloud {
            operation: "delete",
            volume_id,
            source,
        })
}

/// IOPS from `iopsPerGB` (io1/io2 only, as EC2 takes IOPS for those), clamped into EC2's
/// bounds; the lower bound only with `allowAutoIOPSPerGBIncrease`, as in-tree.
fn iops(params: &AwsEbsParameters, size_gib: i64) -> Option<i64> {
    let per_gb = params.iops_per_gb?;
    if !matches!(params.volume_type.as_str(), "io1" | "io2") {
        return None;
    }
    let mut iops = per_gb.saturating_mul(size_gib);
    if params.allow_iops_increase && iops < IO1_MIN_IOPS {
        iops = IO1_MIN_IOPS;
    }
    Some(iops.min(IO1_MAX_IOPS))
}

/// The tags the in-tree plugin wrote, plus both cluster tags of the AWS cloud provider.
fn tags(
    req: &ProvisionRequest<'_>,
    claim_name: &str,
    claim_namespace: &str,
) -> BTreeMap<String, String> {
    let mut tags = BTreeMap::new();
    tags.insert(TAG_PVC_NAME.to_string(), claim_name.to_string());
    tags.insert(TAG_PVC_NAMESPACE.to_string(), claim_namespace.to_string());
    tags.insert(TAG_PV_NAME.to_string(), req.pv_name.to_string());
    tags.insert(
        "Name".to_string(),
        format!("{}-dynamic-{}", req.cluster_name, req.pv_name),
    );
    tags.insert(
        format!("kubernetes.io/cluster/{}", req.cluster_name),
        "owned".to_string(),
    );
    tags.insert(TAG_LEGACY_CLUSTER.to_string(), req.cluster_name.to_string());
    tags
}

/// The zone: the class's `zone`; else the selected node's zone (when `zones`/allowed
/// topologies admit it); else one of `zones`, the allowed topologies or the region's zones,
/// picked by a hash of the claim's name so that retries and restarts choose the same one.
async fn choose_zone(
    cloud: &dyn ebs_cloud::Cloud,
    params: &AwsEbsParameters,
    req: &ProvisionRequest<'_>,
) -> Result<String> {
    if let Some(zone) = &params.zone {
        return Ok(zone.clone());
    }
    let mut candidates: Vec<String> = if !params.zones.is_empty() {
        params.zones.clone()
    } else if !req.allowed_zones.is_empty() {
        req.allowed_zones.to_vec()
    } else {
        Vec::new()
    };
    if let Some(node_zone) = req.selected_node_zone {
        if candidates.is_empty() || candidates.iter().any(|z| z == node_zone) {
            return Ok(node_zone.to_string());
        }
    }
    if candidates.is_empty() {
        candidates = cloud
            .availability_zones()
            .await
            .map_err(|source| Error::Cloud {
                operation: "create",
                volume_id: req.pv_name.to_string(),
                source,
            })?;
    }
    candidates.sort();
    candidates.dedup();
    let claim_name = req.claim.metadata.name.as_deref().unwrap_or_default();
    let digest = Sha256::digest(claim_name.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    let n = u64::from_be_bytes(first);
    let len = u64::try_from(candidates.len()).unwrap_or(1).max(1);
    let index = usize::try_from(n % len).unwrap_or(0);
    candidates.get(index).cloned().ok_or_else(|| {
        Error::InvalidSpec(format!(
            "no availability zone to create {} in (the region lists none)",
            req.pv_name
        ))
    })
}

/// The region of a zone (`us-east-1a` → `us-east-1`), through csi-translation's rules.
fn region_of(zone: &str) -> Option<String> {
    csi_translation::plugins::aws_ebs::region_from_zones(&[zone.to_string()]).ok()
}

/// The PV the in-tree plugin (and kube-controller-manager around it) created.
fn persistent_volume(
    req: &ProvisionRequest<'_>,
    params: &AwsEbsParameters,
    volume_id: &str,
    zone: &str,
    size_gib: i64,
) -> PersistentVolume {
    let claim = req.claim;
    let claim_spec = claim.spec.clone().unwrap_or_default();
    let mut labels = BTreeMap::new();
    labels.insert(LABEL_ZONE.to_string(), zone.to_string());
    let region = region_of(zone);
    if let Some(region) = &region {
        labels.insert(LABEL_REGION.to_string(), region.clone());
    }
    let mut annotations = BTreeMap::new();
    annotations.insert(
        ANN_PROVISIONED_BY.to_string(),
        AWS_EBS_PLUGIN_NAME.to_string(),
    );
    annotations.insert(ANN_CREATED_BY.to_string(), CREATED_BY.to_string());
    annotations.insert(ANN_BOUND_BY_CONTROLLER.to_string(), "yes".to_string());
    let mut requirements = vec![NodeSelectorRequirement {
        key: LABEL_ZONE.to_string(),
        operator: "In".to_string(),
        values: Some(vec![zone.to_string()]),
    }];
    if let Some(region) = region {
        requirements.push(NodeSelectorRequirement {
            key: LABEL_REGION.to_string(),
            operator: "In".to_string(),
            values: Some(vec![region]),
        });
    }
    let mut capacity = BTreeMap::new();
    capacity.insert("storage".to_string(), Quantity(format!("{size_gib}Gi")));
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(req.pv_name.to_string()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeSpec {
            access_modes: claim_spec.access_modes.clone(),
            capacity: Some(capacity),
            claim_ref: Some(ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("PersistentVolumeClaim".into()),
                namespace: claim.metadata.namespace.clone(),
                name: claim.metadata.name.clone(),
                uid: claim.metadata.uid.clone(),
                resource_version: claim.metadata.resource_version.clone(),
                ..ObjectReference::default()
            }),
            aws_elastic_block_store: Some(AWSElasticBlockStoreVolumeSource {
                volume_id: format!("aws://{zone}/{volume_id}"),
                fs_type: Some(params.fs_type.clone()),
                ..AWSElasticBlockStoreVolumeSource::default()
            }),
            mount_options: Some(req.mount_options.to_vec()).filter(|m| !m.is_empty()),
            node_affinity: Some(VolumeNodeAffinity {
                required: Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_expressions: Some(requirements),
                        match_fields: None,
                    }],
                }),
            }),
            persistent_volume_reclaim_policy: Some(req.reclaim_policy.to_string()),
            storage_class_name: Some(req.storage_class_name.to_string()),
            volume_mode: Some(
                claim_spec
                    .volume_mode
                    .clone()
                    .unwrap_or_else(|| "Filesystem".to_string()),
            ),
            ..PersistentVolumeSpec::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests;
