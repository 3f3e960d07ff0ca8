//! RunInstances' `BlockDeviceMapping.N`: EBS volumes created with the instance and attached
//! at launch, validated like CreateVolume and AttachVolume.

use super::attach::{ROOT_POINT, attachment_point, valid_device};
use super::volumes::{PlannedVolume, VolumeRequest, plan_volume};
use crate::engine::Engine;
use crate::query::Params;
use crate::xml::ApiError;

/// One EBS mapping of a RunInstances request.
#[derive(Debug, Clone)]
pub(crate) struct EbsMapping {
    pub(crate) device: String,
    pub(crate) volume: PlannedVolume,
    pub(crate) delete_on_termination: bool,
}

/// The EBS mappings of a request, in index order. Mappings without `Ebs` (`NoDevice`,
/// `VirtualName` instance-store entries) create nothing: the sim has no AMI mappings to
/// suppress and no instance store.
pub(crate) fn ebs_mappings(
    engine: &Engine,
    params: &Params,
    now: u64,
) -> Result<Vec<EbsMapping>, ApiError> {
    let mut out: Vec<EbsMapping> = Vec::new();
    for n in params.indexes("BlockDeviceMapping") {
        let key = |field: &str| format!("BlockDeviceMapping.{n}.{field}");
        let device = params.require(&key("DeviceName"))?.to_string();
        if !valid_device(&device) {
            return Err(ApiError::invalid_value(
                &key("DeviceName"),
                &device,
                &format!("{device} is not a valid EBS device name."),
            ));
        }
        let point = attachment_point(&device);
        if out.iter().any(|m| attachment_point(&m.device) == point) {
            return Err(ApiError::new(
                "InvalidParameterValue",
                format!(
                    "Invalid value '{device}' for {}. Attachment point {device} is already in use",
                    key("DeviceName")
                ),
            ));
        }
        if !params.has_prefix(&key("Ebs.")) {
            continue;
        }
        let volume = plan_volume(
            engine,
            &VolumeRequest {
                size: params.int(&key("Ebs.VolumeSize"))?,
                volume_type: params.get(&key("Ebs.VolumeType")).unwrap_or("gp2"),
                iops: params.int(&key("Ebs.Iops"))?,
                throughput: params.int(&key("Ebs.Throughput"))?,
                snapshot_id: params.get(&key("Ebs.SnapshotId")),
                encrypted: params.bool(&key("Ebs.Encrypted"))?,
                kms_key_id: params.get(&key("Ebs.KmsKeyId")),
                multi_attach: false,
            },
            now,
        )
        .map_err(|mut e| {
            e.message = format!("{}: {}", key("Ebs"), e.message);
            e
        })?;
        // Launch-time volumes go with the instance unless told otherwise.
        let delete_on_termination = params
            .bool(&key("Ebs.DeleteOnTermination"))?
            .unwrap_or(true);
        out.push(EbsMapping {
            device,
            volume,
            delete_on_termination,
        });
    }
    // The root device counts too; the rest must fit the per-instance attachment limit.
    let max = engine.config.max_attachments_per_instance;
    let data = out
        .iter()
        .filter(|m| attachment_point(&m.device) != ROOT_POINT)
        .count();
    if data > max {
        return Err(ApiError::new(
            "AttachmentLimitExceeded",
            format!("{data} EBS volumes requested; an instance can have at most {max} attached"),
        ));
    }
    Ok(out)
}
