//! Plain data the [`crate::Cloud`] trait speaks: no SDK types leak out of `ebs-cloud-aws`.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

/// What to create. Sizes are GiB, as EC2 counts them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DiskOptions {
    pub size_gib: i64,
    /// gp2, gp3, io1, io2, st1, sc1, standard.
    pub volume_type: String,
    pub iops: Option<i64>,
    pub throughput: Option<i64>,
    pub encrypted: bool,
    pub kms_key_id: Option<String>,
    pub zone: String,
    pub snapshot_id: Option<String>,
    pub multi_attach: bool,
    /// Extra tags; the name tag is always added.
    pub tags: BTreeMap<String, String>,
}

/// What ControllerModifyVolume asks EC2's ModifyVolume to change; `None` leaves a field as it
/// is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DiskModification {
    /// gp2, gp3, io1, io2, st1, sc1, standard.
    pub volume_type: Option<String>,
    pub iops: Option<i64>,
    pub throughput: Option<i64>,
}

impl DiskModification {
    /// Nothing to change.
    pub fn is_empty(&self) -> bool {
        self.volume_type.is_none() && self.iops.is_none() && self.throughput.is_none()
    }

    /// Whether a volume (or a modification's target) with these attributes already has
    /// everything this asks for.
    pub fn satisfied_by(
        &self,
        volume_type: &str,
        iops: Option<i64>,
        throughput: Option<i64>,
    ) -> bool {
        self.volume_type.as_deref().is_none_or(|t| t == volume_type)
            && self.iops.is_none_or(|i| Some(i) == iops)
            && self.throughput.is_none_or(|t| Some(t) == throughput)
    }
}

/// An EBS volume as DescribeVolumes shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Disk {
    pub volume_id: String,
    pub size_gib: i64,
    pub zone: String,
    /// creating, available, in-use, deleting, deleted, error.
    pub state: String,
    pub volume_type: String,
    pub iops: Option<i64>,
    pub throughput: Option<i64>,
    pub encrypted: bool,
    pub kms_key_id: Option<String>,
    pub snapshot_id: Option<String>,
    pub multi_attach: bool,
    pub tags: BTreeMap<String, String>,
    pub attachments: Vec<VolumeAttachment>,
}

impl Disk {
    /// The attachment to one instance, if any.
    pub fn attachment_to(&self, instance_id: &str) -> Option<&VolumeAttachment> {
        self.attachments
            .iter()
            .find(|a| a.instance_id == instance_id)
    }
}

/// One attachment of a volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeAttachment {
    pub instance_id: String,
    pub device: String,
    pub state: AttachmentState,
}

/// EC2's attachment states; `Detached` also stands for "no attachment".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AttachmentState {
    Attaching,
    Attached,
    Detaching,
    Detached,
    Busy,
}

impl AttachmentState {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "attaching" => Self::Attaching,
            "attached" => Self::Attached,
            "detaching" => Self::Detaching,
            "detached" => Self::Detached,
            "busy" => Self::Busy,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Attaching => "attaching",
            Self::Attached => "attached",
            Self::Detaching => "detaching",
            Self::Detached => "detached",
            Self::Busy => "busy",
        }
    }
}

/// An instance and the devices in its block device mapping (the source of truth for which
/// device names are taken).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Instance {
    pub instance_id: String,
    pub zone: String,
    /// pending, running, stopping, stopped, shutting-down, terminated.
    pub state: String,
    pub root_device: Option<String>,
    pub devices: Vec<BlockDevice>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockDevice {
    pub device: String,
    pub volume_id: String,
}

/// An EBS snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub snapshot_id: String,
    pub source_volume_id: String,
    pub size_gib: i64,
    /// pending, completed, error.
    pub state: String,
    /// Seconds and nanoseconds since the epoch.
    pub created: (i64, u32),
    pub tags: BTreeMap<String, String>,
}

impl Snapshot {
    pub fn ready(&self) -> bool {
        self.state == "completed"
    }
}

/// One page of [`crate::Cloud::list_snapshots`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SnapshotPage {
    pub snapshots: Vec<Snapshot>,
    pub next_token: Option<String>,
}

/// The EC2 client token for a CSI name: the hex SHA-256 of the name, exactly 64 characters (the
/// most EC2 accepts). A name is up to 128 bytes in Kubernetes, so it cannot be used as is, and
/// a hash keeps two names from sharing a token by truncation.
pub fn client_token(name: &str) -> String {
    hex::encode(Sha256::digest(name.as_bytes()))
}

/// The EC2 client token of generation `generation` of a CSI volume name. EC2 remembers a
/// token after its volume is deleted (the same call returns the deleted volume, or
/// IdempotentParameterMismatch), so a name whose volume was deleted needs a token no earlier
/// volume used: generation 0 is [`client_token`] of the name (what every earlier version of
/// the driver used, so a create begun by one is found again), generation N > 0 hashes the name,
/// a NUL and N. A NUL cannot be in a Kubernetes object name, so no other name's generation 0
/// shares the token. Which generation a name is at is found by walking them in order (see
/// `ebs-cloud-aws`'s CreateVolume), never stored.
pub fn volume_client_token(name: &str, generation: u32) -> String {
    if generation == 0 {
        client_token(name)
    } else {
        client_token(&format!("{name}\u{0}{generation}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_token_is_64_hex_chars_and_stable() {
        let t = client_token("pvc-0a6c8f6e-aaaa-bbbb-cccc-1234567890ab");
        assert_eq!(t.len(), 64);
        assert!(t.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(t, client_token("pvc-0a6c8f6e-aaaa-bbbb-cccc-1234567890ab"));
        assert_ne!(t, client_token("pvc-other"));
        assert_eq!(client_token(&"x".repeat(500)).len(), 64);
    }

    #[test]
    fn generation_zero_is_the_names_token_and_later_ones_differ() {
        let name = "pvc-0a6c8f6e-aaaa-bbbb-cccc-1234567890ab";
        assert_eq!(volume_client_token(name, 0), client_token(name));
        let tokens: std::collections::HashSet<String> =
            (0..50).map(|g| volume_client_token(name, g)).collect();
        assert_eq!(tokens.len(), 50, "every generation has its own token");
        assert!(tokens.iter().all(|t| t.len() == 64));
        assert_eq!(volume_client_token(name, 7), volume_client_token(name, 7));
        // Generation 1 of "a" is not generation 0 of "a1", nor of "a" followed by "1".
        assert_ne!(volume_client_token("a", 1), client_token("a1"));
        assert_ne!(volume_client_token("a", 11), volume_client_token("a1", 1));
    }

    #[test]
    fn a_modification_is_satisfied_only_by_every_field_it_names() {
        let m = DiskModification {
            volume_type: Some("io2".into()),
            iops: Some(4000),
            throughput: None,
        };
        assert!(!m.is_empty());
        assert!(DiskModification::default().is_empty());
        assert!(m.satisfied_by("io2", Some(4000), None));
        assert!(m.satisfied_by("io2", Some(4000), Some(125)));
        assert!(!m.satisfied_by("gp3", Some(4000), None));
        assert!(!m.satisfied_by("io2", Some(3000), None));
        assert!(DiskModification::default().satisfied_by("gp3", None, None));
    }

    #[test]
    fn attachment_states_round_trip() {
        for s in ["attaching", "attached", "detaching", "detached", "busy"] {
            assert_eq!(AttachmentState::parse(s).map(|a| a.as_str()), Some(s));
        }
        assert_eq!(AttachmentState::parse("bogus"), None);
    }
}
