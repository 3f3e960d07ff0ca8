//! The request parameters each action understands. AWS answers `UnknownParameter` for a name
//! it does not know; the sim does the same for any name it does not implement, so a client
//! relying on a parameter the sim would silently ignore finds out at once.

use crate::query::Params;
use crate::xml::ApiError;

const FILTERS: &[&str] = &["Filter.N.Name", "Filter.N.Value.N"];
const TAG_SPECS: &[&str] = &[
    "TagSpecification.N.ResourceType",
    "TagSpecification.N.Tag.N.Key",
    "TagSpecification.N.Tag.N.Value",
];
const TAGS: &[&str] = &["Tag.N.Key", "Tag.N.Value"];
const PAGING: &[&str] = &["MaxResults", "NextToken"];

/// Parameter names of `action` with list indexes written `N`; `Action`, `Version` and
/// `DryRun` are understood everywhere.
fn known(action: &str) -> Vec<&'static str> {
    let groups: &[&[&str]] = match action {
        "CreateVolume" => &[
            &[
                "AvailabilityZone",
                "Size",
                "VolumeType",
                "Iops",
                "Throughput",
                "SnapshotId",
                "Encrypted",
                "KmsKeyId",
                "MultiAttachEnabled",
                "ClientToken",
            ],
            TAG_SPECS,
        ],
        "DeleteVolume" => &[&["VolumeId"]],
        "DescribeVolumes" => &[&["VolumeId.N"], FILTERS, PAGING],
        "AttachVolume" => &[&["VolumeId", "InstanceId", "Device"]],
        "DetachVolume" => &[&["VolumeId", "InstanceId", "Device", "Force"]],
        "RunInstances" => &[
            &[
                "ImageId",
                "MinCount",
                "MaxCount",
                "InstanceType",
                "Placement.AvailabilityZone",
                "ClientToken",
                "BlockDeviceMapping.N.DeviceName",
                "BlockDeviceMapping.N.VirtualName",
                "BlockDeviceMapping.N.NoDevice",
                "BlockDeviceMapping.N.Ebs.VolumeSize",
                "BlockDeviceMapping.N.Ebs.VolumeType",
                "BlockDeviceMapping.N.Ebs.Iops",
                "BlockDeviceMapping.N.Ebs.Throughput",
                "BlockDeviceMapping.N.Ebs.SnapshotId",
                "BlockDeviceMapping.N.Ebs.Encrypted",
                "BlockDeviceMapping.N.Ebs.KmsKeyId",
                "BlockDeviceMapping.N.Ebs.DeleteOnTermination",
            ],
            TAG_SPECS,
        ],
        "TerminateInstances" => &[&["InstanceId.N"]],
        "DescribeInstances" => &[&["InstanceId.N"], FILTERS, PAGING],
        "DescribeAvailabilityZones" => &[&["ZoneName.N", "ZoneId.N"], FILTERS],
        "CreateSnapshot" => &[&["VolumeId", "Description"], TAG_SPECS],
        "DeleteSnapshot" => &[&["SnapshotId"]],
        "DescribeSnapshots" => &[&["SnapshotId.N", "Owner.N"], FILTERS, PAGING],
        "ModifyVolume" => &[&[
            "VolumeId",
            "Size",
            "VolumeType",
            "Iops",
            "Throughput",
            "MultiAttachEnabled",
        ]],
        "DescribeVolumesModifications" => &[&["VolumeId.N"], FILTERS, PAGING],
        "CreateTags" | "DeleteTags" => &[&["ResourceId.N"], TAGS],
        _ => &[],
    };
    let mut out = vec!["Action", "Version", "DryRun"];
    for g in groups {
        out.extend_from_slice(g);
    }
    out
}

/// `Filter.12.Value.3` → `Filter.N.Value.N`.
fn pattern(name: &str) -> String {
    name.split('.')
        .map(|seg| {
            if !seg.is_empty() && seg.bytes().all(|b| b.is_ascii_digit()) {
                "N"
            } else {
                seg
            }
        })
        .collect::<Vec<_>>()
        .join(".")
}

/// `UnknownParameter` for the first parameter `action` does not understand. An empty value
/// under a list's own name (`Filter=`) is an empty list, which some serializers send.
pub(crate) fn check(action: &str, params: &Params) -> Result<(), ApiError> {
    let known = known(action);
    for (name, value) in params.iter() {
        let p = pattern(name);
        if known.contains(&p.as_str()) {
            continue;
        }
        let empty_list = value.is_empty() && known.iter().any(|k| k.starts_with(&format!("{p}.N")));
        if empty_list {
            continue;
        }
        return Err(ApiError::new(
            "UnknownParameter",
            format!("The parameter {name} is not recognized"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pairs: &[(&str, &str)]) -> Params {
        Params::from_pairs(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())))
    }

    #[test]
    fn indexes_are_patterns_and_unknown_names_are_named() {
        assert_eq!(pattern("Filter.12.Value.3"), "Filter.N.Value.N");
        assert_eq!(
            pattern("Placement.AvailabilityZone"),
            "Placement.AvailabilityZone"
        );
        let ok = p(&[
            ("Action", "DescribeVolumes"),
            ("Version", "2016-11-15"),
            ("Filter.1.Name", "status"),
            ("Filter.1.Value.2", "available"),
            ("VolumeId.10", "vol-1"),
        ]);
        assert!(check("DescribeVolumes", &ok).is_ok());
        assert!(check("DescribeVolumes", &p(&[("Filter", "")])).is_ok());
        let err = check("DescribeVolumes", &p(&[("Filter", "x")])).unwrap_err();
        assert_eq!(err.code, "UnknownParameter");
        let err = check("CreateVolume", &p(&[("OutpostArn", "arn:x")])).unwrap_err();
        assert_eq!((err.status, err.code.as_str()), (400, "UnknownParameter"));
        assert!(err.message.contains("OutpostArn"), "{}", err.message);
        let err = check("RunInstances", &p(&[("Placement.Tenancy", "dedicated")])).unwrap_err();
        assert!(err.message.contains("Placement.Tenancy"));
        // Known for one action is not known for another.
        assert!(check("DeleteVolume", &p(&[("Force", "true")])).is_err());
    }
}
