//! The in-tree `kubernetes.io/aws-ebs` volume plugin, what a cluster without
//! CSI migration uses. It makes no CSI call:
//!
//! - [`AwsEbsPlugin`] (the attach/detach controller's side): EC2 AttachVolume, with the device
//!   name picked by the `ebs-cloud` allocator, DetachVolume (never forced), and the periodic
//!   "is it still attached?" check, all through the [`ebs_cloud::Cloud`] trait, so this crate
//!   never compiles an AWS SDK;
//! - [`mount_device`] / [`unmount_device`] (the kubelet's side): wait for the device, format it
//!   only when it is provably blank, fsck, mount at the plugin's staging path
//!   ([`aws_ebs_staging_path`]), with `mount-utils`;
//! - the names Kubernetes' AWS code reads: the instance in `Node.spec.providerID`
//!   ([`instance_id_from_provider_id`]) and the EBS volume in `awsElasticBlockStore.volumeID`
//!   ([`volume_id_from_spec`]).

mod attacher;
#[cfg(test)]
mod fake_cloud;
mod mounter;
pub mod provisioner;

use std::path::{Path, PathBuf};

pub use crate::names::AWS_EBS_PLUGIN_NAME;
pub use attacher::AwsEbsPlugin;
pub use mounter::{mount_device, unmount_device, wait_for_attach, wait_for_attach_under};

use crate::{Error, Result};

/// The directory under a plugin's directory where it mounts devices (Kubernetes'
/// `MountsInGlobalPDPath`).
const MOUNTS_DIR: &str = "mounts";

/// The EC2 instance of a node, from its `spec.providerID` as the AWS cloud provider writes it:
/// `aws:///us-east-1a/i-0123` (also `aws://us-east-1a/i-0123`, `aws:///i-0123`, or a bare
/// `i-0123`, which Kubernetes' AWS code accepts too) gives `i-0123`. `None` for anything else:
/// another cloud's provider ID (`gce://...`, `kind://...`), an empty one, a path of more than
/// zone and instance, or a last part that is not `i-...`.
pub fn instance_id_from_provider_id(provider_id: &str) -> Option<String> {
    let path = match provider_id.strip_prefix("aws://") {
        // Everything after the authority (the zone, usually empty), as Go's url.Parse splits
        // it; query and fragment are not part of the path.
        Some(rest) => {
            let rest = rest.split(['?', '#']).next().unwrap_or_default();
            let (_authority, path) = rest.split_once('/')?;
            path
        }
        None if provider_id.contains("://") => return None,
        None => provider_id,
    };
    let tokens: Vec<&str> = path.trim_matches('/').split('/').collect();
    let id = match tokens.as_slice() {
        [id] | [_, id] => *id,
        _ => return None,
    };
    let valid = id
        .strip_prefix("i-")
        .is_some_and(|rest| !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_alphanumeric()));
    valid.then(|| id.to_string())
}

/// The EBS volume ID of an `awsElasticBlockStore.volumeID`: `vol-123`, `aws://us-east-1a/vol-123`
/// and `aws:///vol-123` all give `vol-123`. An `aws://` ID is read as Go's `net/url` reads it,
/// with the same code `csi-translation` uses, so the in-tree and the migrated path always agree
/// on the volume. Anything else, including a bare ID that does not start with `vol-` (which
/// Kubernetes' AWS code refuses as well), is [`Error::InvalidSpec`] naming the field.
pub fn volume_id_from_spec(volume_id: &str) -> Result<String> {
    let invalid = || {
        Error::InvalidSpec(format!(
            "awsElasticBlockStore.volumeID {volume_id:?} is not an EBS volume ID: want vol-..., aws://<zone>/vol-... or aws:///vol-..."
        ))
    };
    let id = if volume_id.starts_with("aws://") {
        csi_translation::plugins::aws_ebs::kubernetes_volume_id_to_ebs_volume_id(volume_id)
            .map_err(|_| invalid())?
    } else {
        volume_id.to_string()
    };
    let valid = id.strip_prefix("vol-").is_some_and(|rest| {
        !rest.is_empty()
            && !rest
                .chars()
                .any(|c| c == '/' || c.is_whitespace() || c.is_control())
    });
    if valid { Ok(id) } else { Err(invalid()) }
}

/// The kubelet's in-tree staging path (Kubernetes' `makeGlobalPDPath`) of a volume:
/// `<root>/plugins/kubernetes.io/aws-ebs/mounts/<volumeID with "://" replaced by "/">`, so
/// `aws://us-east-1a/vol-1` is staged at `.../mounts/aws/us-east-1a/vol-1` and `vol-1` at
/// `.../mounts/vol-1`. As Go's `filepath.Join` does, empty components are dropped:
/// `aws:///vol-1` gives `.../mounts/aws/vol-1`, where a real kubelet stages it. `.` and `..`
/// are dropped as well, so no volume ID can name a path outside `mounts/`.
pub fn aws_ebs_staging_path(root_dir: &Path, spec_volume_id: &str) -> PathBuf {
    let mut path = root_dir.join("plugins");
    path.extend(AWS_EBS_PLUGIN_NAME.split('/'));
    path.push(MOUNTS_DIR);
    let name = spec_volume_id.replace("://", "/");
    path.extend(
        name.split('/')
            .filter(|c| !c.is_empty() && *c != "." && *c != ".."),
    );
    path
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_ids_as_the_aws_cloud_provider_writes_them() {
        let good = [
            ("aws:///us-east-1a/i-0123", "i-0123"),
            (
                "aws:///us-east-1a/i-0123456789abcdef0",
                "i-0123456789abcdef0",
            ),
            ("aws://us-east-1a/i-0123", "i-0123"),
            ("aws:///i-0123", "i-0123"),
            ("aws:///us-east-1a/i-0123/", "i-0123"),
            ("aws:///us-east-1a/i-0123?x=y", "i-0123"),
            ("i-0123", "i-0123"),
        ];
        for (provider_id, want) in good {
            assert_eq!(
                instance_id_from_provider_id(provider_id).as_deref(),
                Some(want),
                "{provider_id}"
            );
        }
        let bad = [
            "",
            "aws://",
            "aws:///",
            "aws:///us-east-1a/",
            "aws:///us-east-1a/vol-0123",
            "aws:///a/b/i-0123",
            "aws:///us-east-1a/i-",
            "aws:///us-east-1a/i-01 23",
            "gce://project/us-central1-a/instance-1",
            "kind://docker/kind/kind-worker",
            "azure:///subscriptions/x/i-0123",
            "vol-0123",
        ];
        for provider_id in bad {
            assert_eq!(
                instance_id_from_provider_id(provider_id),
                None,
                "{provider_id}"
            );
        }
    }

    #[test]
    fn volume_ids_in_all_three_spellings() {
        for spec in [
            "vol-123",
            "aws://us-east-1a/vol-123",
            "aws:///vol-123",
            "aws://us-east-1a/vol-123/",
        ] {
            assert_eq!(volume_id_from_spec(spec).unwrap(), "vol-123", "{spec}");
        }
        assert_eq!(
            volume_id_from_spec("aws://us-east-1a/vol-0123456789abcdef0").unwrap(),
            "vol-0123456789abcdef0"
        );
        for spec in [
            "",
            "vol-",
            "123",
            "snap-123",
            "aws://",
            "aws://us-east-1a/",
            "aws://us-east-1a/snap-123",
            "aws://us-east-1a/x/vol-123",
            "aws://us east/vol-123",
            "gce://us-east-1a/vol-123",
            "vol-12/3",
            "vol-1 2",
        ] {
            let err = volume_id_from_spec(spec).unwrap_err();
            assert!(matches!(err, Error::InvalidSpec(_)), "{spec}: {err}");
            let msg = err.to_string();
            assert!(
                msg.contains("awsElasticBlockStore.volumeID") && msg.contains(&format!("{spec:?}")),
                "{msg}"
            );
        }
    }

    #[test]
    fn staging_paths_as_the_kubelet_makes_them() {
        let root = Path::new("/var/lib/kubelet");
        let base = "/var/lib/kubelet/plugins/kubernetes.io/aws-ebs/mounts";
        let rows = [
            (
                "aws://us-east-1a/vol-123",
                format!("{base}/aws/us-east-1a/vol-123"),
            ),
            ("vol-123", format!("{base}/vol-123")),
            ("aws:///vol-123", format!("{base}/aws/vol-123")),
            ("../../etc/vol-1", format!("{base}/etc/vol-1")),
        ];
        for (spec, want) in rows {
            assert_eq!(
                aws_ebs_staging_path(root, spec),
                PathBuf::from(&want),
                "{spec}"
            );
        }
        assert_eq!(
            aws_ebs_staging_path(Path::new("/tmp/k/"), "vol-1"),
            PathBuf::from("/tmp/k/plugins/kubernetes.io/aws-ebs/mounts/vol-1")
        );
    }
}
