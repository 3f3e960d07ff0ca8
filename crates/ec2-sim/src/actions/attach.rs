//! AttachVolume, DetachVolume.

use super::lookup_instance;
use super::volumes::lookup;
use super::{check_id, dry_run};
use crate::engine::Engine;
use crate::model::{AttachState, Attachment, Step, duration_ms};
use crate::query::Params;
use crate::render;
use crate::xml::{ApiError, Xml};

/// io1/io2 Multi-Attach allows at most 16 instances per volume.
const MULTI_ATTACH_MAX: usize = 16;

/// Linux EBS device names EC2 accepts: `/dev/sd[a-z]`, `/dev/sd[a-z][a-z]`,
/// `/dev/sd[a-z][1-15]`, `/dev/xvd[a-z]`, `/dev/xvd[a-z][a-z]`.
pub(crate) fn valid_device(name: &str) -> bool {
    let lower = |b: &u8| b.is_ascii_lowercase();
    if let Some(rest) = name.strip_prefix("/dev/xvd") {
        let b = rest.as_bytes();
        return (b.len() == 1 || b.len() == 2) && b.iter().all(lower);
    }
    if let Some(rest) = name.strip_prefix("/dev/sd") {
        let b = rest.as_bytes();
        return match b.len() {
            1 => lower(&b[0]),
            2 => lower(&b[0]) && (lower(&b[1]) || (b'1'..=b'9').contains(&b[1])),
            3 => lower(&b[0]) && b[1] == b'1' && (b'0'..=b'5').contains(&b[2]),
            _ => false,
        };
    }
    false
}

/// `/dev/sdf` and `/dev/xvdf` name the same attachment point on Xen and Nitro instances; a
/// partition suffix names the disk it is on.
pub(crate) fn attachment_point(device: &str) -> String {
    let base = device
        .trim_start_matches("/dev/")
        .trim_end_matches(|c: char| c.is_ascii_digit());
    match base.strip_prefix("sd") {
        Some(rest) => format!("xvd{rest}"),
        None => base.to_string(),
    }
}

/// The root volume of every simulated instance sits at `/dev/xvda` (alias `/dev/sda1`).
pub(crate) const ROOT_POINT: &str = "xvda";

pub(crate) fn attach(
    engine: &mut Engine,
    params: &Params,
    now: u64,
    x: &mut Xml,
) -> Result<(), ApiError> {
    let device = params.require("Device")?.to_string();
    let instance_id = params.require("InstanceId")?.to_string();
    let volume_id = params.require("VolumeId")?.to_string();
    let volume = lookup(engine, &volume_id)?;
    let instance = lookup_instance(engine, &instance_id)?;
    let (_, state) = instance.state(now);
    if state == "terminated" || state == "shutting-down" {
        return Err(ApiError::new(
            "IncorrectInstanceState",
            format!("The instance '{instance_id}' is not in the 'running' or 'stopped' states."),
        ));
    }
    if !valid_device(&device) {
        return Err(ApiError::invalid_value(
            "device",
            &device,
            &format!("{device} is not a valid EBS device name."),
        ));
    }
    let status = volume.status(now);
    if status == "creating" {
        return Err(ApiError::new(
            "IncorrectState",
            format!("{volume_id} is not 'available'."),
        ));
    }
    if volume.zone != instance.zone {
        return Err(ApiError::new(
            "InvalidVolume.ZoneMismatch",
            format!(
                "The volume '{volume_id}' is not in the same availability zone as instance '{instance_id}'"
            ),
        ));
    }
    if volume
        .attachments
        .iter()
        .any(|a| a.instance_id == instance_id)
        || (!volume.multi_attach && !volume.attachments.is_empty())
    {
        let others: Vec<String> = volume
            .attachments
            .iter()
            .filter(|a| a.instance_id != instance_id)
            .map(|a| a.instance_id.clone())
            .collect();
        let same = others.len() < volume.attachments.len();
        if !same {
            engine
                .history
                .refused(now, &volume_id, &instance_id, others);
        }
        return Err(ApiError::new(
            "VolumeInUse",
            format!("{volume_id} is already attached to an instance"),
        ));
    }
    if volume.attachments.len() >= MULTI_ATTACH_MAX {
        return Err(ApiError::new(
            "AttachmentLimitExceeded",
            format!("{volume_id} is already attached to {MULTI_ATTACH_MAX} instances"),
        ));
    }
    let point = attachment_point(&device);
    let used: Vec<(String, String)> = engine
        .cloud
        .attachments_of(&instance_id)
        .map(|(v, a)| (v.id.clone(), attachment_point(&a.device)))
        .collect();
    if point == ROOT_POINT || used.iter().any(|(_, p)| *p == point) {
        return Err(ApiError::new(
            "InvalidParameterValue",
            format!(
                "Invalid value '{device}' for unixDevice. Attachment point {device} is already in use"
            ),
        ));
    }
    let max = engine.config.max_attachments_per_instance;
    if used.len() >= max {
        return Err(ApiError::new(
            "AttachmentLimitExceeded",
            format!(
                "Instance {instance_id} already has {max} volumes attached, the most it can have"
            ),
        ));
    }
    dry_run(params)?;
    let attachment = Attachment {
        instance_id,
        device,
        state: AttachState::Attaching,
        attach_ms: now,
        done_ms: now + duration_ms(engine.config.timing, Step::Attach),
        force: false,
        delete_on_termination: false,
        never_attached: false,
    };
    render::attachment_fields(x, &volume_id, &attachment, "attaching");
    if let Some(v) = engine.cloud.volumes.get_mut(&volume_id) {
        v.attachments.push(attachment);
    }
    engine.dirty = true;
    Ok(())
}

pub(crate) fn detach(
    engine: &mut Engine,
    params: &Params,
    now: u64,
    x: &mut Xml,
) -> Result<(), ApiError> {
    let volume_id = params.require("VolumeId")?.to_string();
    let instance_id = params.get("InstanceId").filter(|s| !s.is_empty());
    let device = params.get("Device").filter(|s| !s.is_empty());
    let force = params.flag("Force")?;
    if let Some(i) = instance_id {
        check_id(i, "i", "InvalidInstanceID.Malformed")?;
    }
    let volume = lookup(engine, &volume_id)?;
    if volume.attachments.is_empty() {
        return Err(ApiError::new(
            "IncorrectState",
            format!(
                "Volume '{volume_id}' is in the '{}' state.",
                volume.status(now)
            ),
        ));
    }
    let matching: Vec<usize> = volume
        .attachments
        .iter()
        .enumerate()
        .filter(|(_, a)| instance_id.is_none_or(|i| a.instance_id == i))
        .filter(|(_, a)| device.is_none_or(|d| a.device == d))
        .map(|(n, _)| n)
        .collect();
    let index = match matching.as_slice() {
        [] => {
            return Err(ApiError::new(
                "InvalidAttachment.NotFound",
                format!(
                    "Attachment point {} for volume {volume_id} on instance {} not found",
                    device.unwrap_or("(any)"),
                    instance_id.unwrap_or("(any)")
                ),
            ));
        }
        [one] => *one,
        _ => {
            return Err(ApiError::combination(format!(
                "Volume {volume_id} is attached to several instances; specify InstanceId"
            )));
        }
    };
    dry_run(params)?;
    let delay = duration_ms(engine.config.timing, Step::Detach);
    let Some(a) = engine
        .cloud
        .volumes
        .get_mut(&volume_id)
        .and_then(|v| v.attachments.get_mut(index))
    else {
        return Err(ApiError::internal(
            "attachment vanished during DetachVolume",
        ));
    };
    // A repeated detach is answered with the detach in progress; Force upgrades it.
    if a.state != AttachState::Detaching {
        a.never_attached = a.state == AttachState::Attaching;
        a.state = AttachState::Detaching;
        a.done_ms = now + delay;
    }
    a.force |= force;
    let a = a.clone();
    render::attachment_fields(x, &volume_id, &a, "detaching");
    engine.dirty = true;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_names() {
        for ok in [
            "/dev/xvdba",
            "/dev/xvdf",
            "/dev/sdf",
            "/dev/sdf1",
            "/dev/sdz15",
            "/dev/sdaa",
        ] {
            assert!(valid_device(ok), "{ok}");
        }
        for bad in [
            "xvdf",
            "/dev/xvd",
            "/dev/xvdabc",
            "/dev/sdf16",
            "/dev/sdf0",
            "/dev/nvme1n1",
            "/dev/xvdB",
            "",
        ] {
            assert!(!valid_device(bad), "{bad}");
        }
    }

    #[test]
    fn aliases_share_an_attachment_point() {
        assert_eq!(attachment_point("/dev/sdf"), attachment_point("/dev/xvdf"));
        assert_eq!(attachment_point("/dev/sda1"), ROOT_POINT);
        assert_ne!(
            attachment_point("/dev/xvdba"),
            attachment_point("/dev/xvdb")
        );
    }
}
