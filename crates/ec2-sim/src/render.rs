//! XML shapes of EC2 objects, element names as in the EC2 API (and aws-sdk-ec2's model).

use crate::ids::iso8601;
use crate::model::{Attachment, Instance, Modification, Snapshot, Volume, VolumeShape};
use crate::xml::Xml;

/// The account every resource belongs to.
pub(crate) const OWNER_ID: &str = "111122223333";

pub(crate) fn tags(x: &mut Xml, tags: &[(String, String)]) {
    // AWS omits an empty tagSet.
    if tags.is_empty() {
        return;
    }
    x.start("tagSet");
    for (k, v) in tags {
        x.start("item").leaf("key", k).leaf("value", v).end("item");
    }
    x.end("tagSet");
}

/// Attachment fields, shared by `attachmentSet/item` and the Attach/DetachVolume responses.
pub(crate) fn attachment_fields(x: &mut Xml, volume_id: &str, a: &Attachment, status: &str) {
    x.leaf("volumeId", volume_id)
        .leaf("instanceId", &a.instance_id)
        .leaf("device", &a.device)
        .leaf("status", status)
        .leaf("attachTime", iso8601(a.attach_ms))
        .leaf("deleteOnTermination", a.delete_on_termination);
}

/// Volume fields (the content of a `volumeSet/item`).
pub(crate) fn volume_fields(x: &mut Xml, v: &Volume, status: &str) {
    volume_fields_with(x, v, status, true);
}

/// CreateVolumeResponse: the volume fields without `attachmentSet`, which CreateVolume
/// does not return.
pub(crate) fn created_volume_fields(x: &mut Xml, v: &Volume, status: &str) {
    volume_fields_with(x, v, status, false);
}

fn volume_fields_with(x: &mut Xml, v: &Volume, status: &str, attachments: bool) {
    x.leaf("volumeId", &v.id)
        .leaf("size", v.size_gib)
        .leaf("snapshotId", v.snapshot_id.as_deref().unwrap_or(""))
        .leaf("availabilityZone", &v.zone)
        .leaf("status", status)
        .leaf("createTime", iso8601(v.create_ms));
    if attachments {
        x.start("attachmentSet");
        for a in &v.attachments {
            x.start("item");
            attachment_fields(x, &v.id, a, a.state.as_str());
            x.end("item");
        }
        x.end("attachmentSet");
    }
    tags(x, &v.tags);
    x.leaf("volumeType", &v.volume_type)
        .opt_leaf("iops", v.iops)
        .leaf("encrypted", v.encrypted)
        .opt_leaf("kmsKeyId", v.kms_key_id.as_deref())
        .leaf("multiAttachEnabled", v.multi_attach)
        .opt_leaf("throughput", v.throughput);
}

pub(crate) fn snapshot_fields(x: &mut Xml, s: &Snapshot, now: u64) {
    x.leaf("snapshotId", &s.id)
        .leaf("volumeId", &s.volume_id)
        .leaf("status", s.status(now))
        .leaf("startTime", iso8601(s.start_ms))
        .leaf("progress", format!("{}%", s.progress(now)))
        .leaf("ownerId", OWNER_ID)
        .leaf("volumeSize", s.volume_size)
        .leaf("description", &s.description)
        .leaf("encrypted", s.encrypted)
        .opt_leaf("kmsKeyId", s.kms_key_id.as_deref())
        .leaf("storageTier", "standard");
    tags(x, &s.tags);
}

fn shape(x: &mut Xml, prefix: &str, s: &VolumeShape) {
    x.leaf(&format!("{prefix}Size"), s.size_gib)
        .opt_leaf(&format!("{prefix}Iops"), s.iops)
        .leaf(&format!("{prefix}VolumeType"), &s.volume_type)
        .opt_leaf(&format!("{prefix}Throughput"), s.throughput)
        .leaf(&format!("{prefix}MultiAttachEnabled"), s.multi_attach);
}

pub(crate) fn modification_fields(x: &mut Xml, m: &Modification, now: u64) {
    x.leaf("volumeId", &m.volume_id)
        .leaf("modificationState", m.state(now));
    shape(x, "target", &m.target);
    shape(x, "original", &m.original);
    x.leaf("progress", m.progress(now))
        .leaf("startTime", iso8601(m.start_ms));
    if now >= m.completed_ms {
        x.leaf("endTime", iso8601(m.completed_ms));
    }
}

/// Instance fields (`instancesSet/item`), with `blockDeviceMapping` built from attachments.
pub(crate) fn instance_fields(
    x: &mut Xml,
    i: &Instance,
    attachments: &[(&Volume, &Attachment)],
    now: u64,
) {
    let (code, name) = i.state(now);
    let ip_tail =
        i.id.as_bytes()
            .iter()
            .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(*b)));
    let ip = format!("10.0.{}.{}", (ip_tail >> 8) % 256, ip_tail % 254 + 1);
    x.leaf("instanceId", &i.id)
        .leaf("imageId", &i.image_id)
        .start("instanceState")
        .leaf("code", code)
        .leaf("name", name)
        .end("instanceState")
        .leaf(
            "privateDnsName",
            format!("ip-{}.ec2.internal", ip.replace('.', "-")),
        )
        .leaf("dnsName", "")
        .leaf("amiLaunchIndex", 0)
        .leaf("instanceType", &i.instance_type)
        .leaf("launchTime", iso8601(i.launch_ms))
        .start("placement")
        .leaf("availabilityZone", &i.zone)
        .leaf("tenancy", "default")
        .end("placement")
        .start("monitoring")
        .leaf("state", "disabled")
        .end("monitoring");
    if name != "terminated" {
        x.leaf("privateIpAddress", &ip);
    }
    x.leaf("architecture", "x86_64")
        .leaf("rootDeviceType", "ebs")
        .leaf("rootDeviceName", "/dev/xvda");
    x.start("blockDeviceMapping");
    for (v, a) in attachments {
        x.start("item")
            .leaf("deviceName", &a.device)
            .start("ebs")
            .leaf("volumeId", &v.id)
            .leaf("status", a.state.as_str())
            .leaf("attachTime", iso8601(a.attach_ms))
            .leaf("deleteOnTermination", a.delete_on_termination)
            .end("ebs")
            .end("item");
    }
    x.end("blockDeviceMapping");
    x.leaf("virtualizationType", "hvm")
        .leaf("hypervisor", "xen");
    tags(x, &i.tags);
}
