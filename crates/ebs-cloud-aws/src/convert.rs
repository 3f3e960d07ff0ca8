//! SDK shapes into the plain `ebs-cloud` types.

use std::collections::BTreeMap;

use aws_sdk_ec2::types;
use ebs_cloud::{AttachmentState, BlockDevice, Disk, Instance, Snapshot, VolumeAttachment};

pub(crate) fn tags(tags: &[types::Tag]) -> BTreeMap<String, String> {
    tags.iter()
        .filter_map(|t| Some((t.key()?.to_string(), t.value().unwrap_or("").to_string())))
        .collect()
}

pub(crate) fn disk(v: &types::Volume) -> Disk {
    Disk {
        volume_id: v.volume_id().unwrap_or_default().to_string(),
        size_gib: i64::from(v.size().unwrap_or(0)),
        zone: v.availability_zone().unwrap_or_default().to_string(),
        state: v
            .state()
            .map(|s| s.as_str().to_string())
            .unwrap_or_default(),
        volume_type: v
            .volume_type()
            .map(|t| t.as_str().to_string())
            .unwrap_or_default(),
        iops: v.iops().map(i64::from),
        throughput: v.throughput().map(i64::from),
        encrypted: v.encrypted().unwrap_or(false),
        kms_key_id: v.kms_key_id().map(str::to_string),
        snapshot_id: v
            .snapshot_id()
            .filter(|s| !s.is_empty())
            .map(str::to_string),
        multi_attach: v.multi_attach_enabled().unwrap_or(false),
        tags: tags(v.tags()),
        attachments: v
            .attachments()
            .iter()
            .filter_map(|a| {
                Some(VolumeAttachment {
                    instance_id: a.instance_id()?.to_string(),
                    device: a.device().unwrap_or_default().to_string(),
                    state: a
                        .state()
                        .and_then(|s| AttachmentState::parse(s.as_str()))
                        .unwrap_or(AttachmentState::Busy),
                })
            })
            .collect(),
    }
}

pub(crate) fn instance(i: &types::Instance) -> Instance {
    Instance {
        instance_id: i.instance_id().unwrap_or_default().to_string(),
        zone: i
            .placement()
            .and_then(|p| p.availability_zone())
            .unwrap_or_default()
            .to_string(),
        state: i
            .state()
            .and_then(|s| s.name())
            .map(|n| n.as_str().to_string())
            .unwrap_or_default(),
        root_device: i.root_device_name().map(str::to_string),
        devices: i
            .block_device_mappings()
            .iter()
            .filter_map(|m| {
                Some(BlockDevice {
                    device: m.device_name()?.to_string(),
                    volume_id: m
                        .ebs()
                        .and_then(|e| e.volume_id())
                        .unwrap_or_default()
                        .to_string(),
                })
            })
            .collect(),
    }
}

pub(crate) fn snapshot(s: &types::Snapshot) -> Snapshot {
    Snapshot {
        snapshot_id: s.snapshot_id().unwrap_or_default().to_string(),
        source_volume_id: s.volume_id().unwrap_or_default().to_string(),
        size_gib: i64::from(s.volume_size().unwrap_or(0)),
        state: s
            .state()
            .map(|x| x.as_str().to_string())
            .unwrap_or_default(),
        created: s
            .start_time()
            .map(|t| (t.secs(), t.subsec_nanos()))
            .unwrap_or((0, 0)),
        tags: tags(s.tags()),
    }
}

pub(crate) fn tag_spec(
    resource: types::ResourceType,
    tags: &BTreeMap<String, String>,
) -> types::TagSpecification {
    let mut spec = types::TagSpecification::builder().resource_type(resource);
    for (k, v) in tags {
        spec = spec.tags(types::Tag::builder().key(k).value(v).build());
    }
    spec.build()
}

pub(crate) fn filter(name: &str, values: impl IntoIterator<Item = String>) -> types::Filter {
    types::Filter::builder()
        .name(name)
        .set_values(Some(values.into_iter().collect()))
        .build()
}
