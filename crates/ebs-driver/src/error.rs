//! The one place where domain errors become gRPC statuses (CSI spec codes).

use ebs_cloud::CloudError;
use tonic::{Code, Status};

use crate::Error;

/// The CSI code for a domain error.
pub(crate) fn code(e: &Error) -> Code {
    match e {
        Error::InvalidArgument { .. } => Code::InvalidArgument,
        // Another call for the volume is running: the CO retries (CSI: ABORTED).
        Error::OperationInFlight(_) => Code::Aborted,
        // The volume (its device, the published path) is not there.
        Error::DeviceNotFound { .. }
        | Error::PathNotFound { .. }
        | Error::NotMounted(_)
        | Error::NoSuchVolumeId(_)
        | Error::OtherVolumeAtPath { .. } => Code::NotFound,
        // CSI: "published but incompatible" with this request.
        Error::PublishedIncompatible { .. } => Code::AlreadyExists,
        // The world is not in the state the call needs; retrying as is will not help until it
        // changes (stage first, repair the filesystem, finish the resize...).
        Error::NotStaged(_)
        | Error::StagedWithOtherDevice { .. }
        | Error::FsTypeMismatch { .. }
        | Error::DeviceTooSmall { .. } => Code::FailedPrecondition,
        Error::Mount(m) => mount_code(m),
        // A stale link or an unidentifiable device: the node's view is inconsistent.
        Error::WrongVolume { .. } | Error::BadDevice { .. } => Code::Internal,
        Error::AlreadyExists { .. } => Code::AlreadyExists,
        Error::NotFound { .. } => Code::NotFound,
        Error::AttachedElsewhere { .. } | Error::FailedPrecondition(_) => Code::FailedPrecondition,
        Error::AttachLimit { .. } => Code::ResourceExhausted,
        Error::OutOfRange(_) => Code::OutOfRange,
        // A later call changed the goal; CSI: the CO retries an ABORTED call.
        Error::Superseded { .. } => Code::Aborted,
        // CSI: ListSnapshots with a token the plugin did not hand out is ABORTED.
        Error::BadToken(_) => Code::Aborted,
        Error::DeadlineExceeded(_) => Code::DeadlineExceeded,
        // The attach failed on the cloud side and was undone; a retry starts afresh.
        Error::StuckAttaching { .. } => Code::Internal,
        Error::Cloud(c) => cloud_code(c),
        Error::Io { .. } | Error::Endpoint(_) | Error::Http(_) | Error::Internal(_) => {
            Code::Internal
        }
    }
}

/// The CSI code for a node-side tool error.
fn mount_code(e: &mount_utils::Error) -> Code {
    use mount_utils::Error as M;
    match e {
        // The request names a filesystem the driver does not support.
        M::UnsupportedFsType(_) => Code::InvalidArgument,
        // The volume's content must be repaired (or wiped) by a human first: retrying as is
        // cannot help.
        M::FsckFailed { .. } | M::UnsupportedContent { .. } => Code::FailedPrecondition,
        // The node service words these as its own errors (same codes) before they get here;
        // the device's content or the request must change first either way.
        M::UnsupportedFilesystem { .. } | M::FsTypeMismatch { .. } | M::ReadOnlyBlank { .. } => {
            Code::FailedPrecondition
        }
        M::Command { .. }
        | M::Spawn { .. }
        | M::Io { .. }
        | M::MountInfo(_)
        | M::Sysfs { .. }
        | M::StillMounted { .. } => Code::Internal,
    }
}

/// EC2 codes that mean "a volume cannot be provisioned in that zone": the zone does not exist,
/// the volume type is not offered there, or the zone has no capacity left.
const ZONE_CANNOT_PROVISION: &[&str] = &[
    "InvalidZone.NotFound",
    "VolumeTypeNotAvailableInZone",
    "InsufficientVolumeCapacity",
];

/// The CSI code for a cloud-layer error.
fn cloud_code(e: &CloudError) -> Code {
    match e {
        // CreateVolume's "unable to provision in accessible_topology": the zone came from the
        // request's topology requirements, which are valid, but nothing can be made there.
        CloudError::InvalidArgument { code, .. } | CloudError::Other { code, .. }
            if ZONE_CANNOT_PROVISION.contains(&code.as_str()) =>
        {
            Code::ResourceExhausted
        }
        CloudError::NotFound { .. } => Code::NotFound,
        CloudError::IdempotentParameterMismatch { .. } => Code::AlreadyExists,
        CloudError::VolumeInUse { .. } => Code::FailedPrecondition,
        CloudError::AttachmentLimit { .. } => Code::ResourceExhausted,
        CloudError::InvalidArgument { .. } | CloudError::KmsKeyUnavailable { .. } => {
            Code::InvalidArgument
        }
        // Throttled past every retry: the CO should come back later.
        CloudError::Throttled { .. } => Code::Unavailable,
        CloudError::Timeout { .. } => Code::DeadlineExceeded,
        CloudError::Other { .. } => Code::Internal,
    }
}

impl From<Error> for Status {
    fn from(e: Error) -> Self {
        Status::new(code(&e), e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    #[test]
    fn codes_follow_the_csi_spec() {
        let cases = [
            (
                Error::invalid("volume_id", "is required"),
                Code::InvalidArgument,
            ),
            (Error::OperationInFlight("vol-1".into()), Code::Aborted),
            (Error::NotMounted(PathBuf::from("/t")), Code::NotFound),
            (
                Error::PublishedIncompatible {
                    path: "/t".into(),
                    reason: "ro".into(),
                },
                Code::AlreadyExists,
            ),
            (Error::NotStaged("/s".into()), Code::FailedPrecondition),
            (Error::Internal("x".into()), Code::Internal),
            (
                Error::AttachLimit {
                    node_id: "i-1".into(),
                    reason: "full".into(),
                },
                Code::ResourceExhausted,
            ),
            (
                Error::Cloud(CloudError::Throttled {
                    action: "DescribeVolumes",
                    message: "slow down".into(),
                }),
                Code::Unavailable,
            ),
            (
                Error::Cloud(CloudError::IdempotentParameterMismatch {
                    what: "volume",
                    name: "pvc".into(),
                }),
                Code::AlreadyExists,
            ),
            (
                Error::Cloud(CloudError::InvalidArgument {
                    action: "CreateVolume",
                    code: "InvalidZone.NotFound".into(),
                    message: "no such zone".into(),
                }),
                Code::ResourceExhausted,
            ),
            (
                Error::Cloud(CloudError::InvalidArgument {
                    action: "CreateVolume",
                    code: "InvalidParameterValue".into(),
                    message: "size".into(),
                }),
                Code::InvalidArgument,
            ),
            (Error::NoSuchVolumeId("pv-1".into()), Code::NotFound),
            (
                Error::Mount(mount_utils::Error::UnsupportedFsType("zfs".into())),
                Code::InvalidArgument,
            ),
            (
                Error::Mount(mount_utils::Error::UnsupportedContent {
                    device: "/dev/xvdba".into(),
                    details: "gpt".into(),
                }),
                Code::FailedPrecondition,
            ),
            (
                Error::Superseded {
                    call: "ControllerPublishVolume",
                    volume_id: "vol-1".into(),
                    node_id: "i-1".into(),
                    by: "ControllerUnpublishVolume",
                },
                Code::Aborted,
            ),
        ];
        for (err, want) in cases {
            let msg = err.to_string();
            let status = Status::from(err);
            assert_eq!(status.code(), want, "{msg}");
            assert_eq!(status.message(), msg);
        }
    }
}
