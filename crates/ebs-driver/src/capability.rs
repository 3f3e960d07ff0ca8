//! What this driver supports, written once. The controller adapter (CreateVolume,
//! ControllerPublishVolume, ValidateVolumeCapabilities) and the node adapter (NodeStage,
//! NodePublish, NodeExpand) both check requests here, so that a capability the controller
//! confirms is one the node stages and publishes, and what NodeGetCapabilities advertises is
//! what the checks accept.

use csi_spec::v1::Topology;
use csi_spec::v1::VolumeCapability;
use csi_spec::v1::volume_capability::AccessType as CsiAccessType;
use csi_spec::v1::volume_capability::access_mode::Mode;
use mount_utils::FsType;

use crate::{Error, Result};

/// The driver's own zone topology key (the one PVs carry in their node affinity)...
pub const TOPOLOGY_ZONE_KEY: &str = "topology.ebs.csi.aws.com/zone";
/// ...and the well-known Kubernetes one, so schedulers that only know that one work too.
pub const WELL_KNOWN_ZONE_KEY: &str = "topology.kubernetes.io/zone";

/// Access modes of a filesystem volume. An EBS volume with a filesystem is used by one node at a
/// time. SINGLE_NODE_SINGLE_WRITER and SINGLE_NODE_MULTI_WRITER refine SINGLE_NODE_WRITER (CSI
/// 1.5); on the node both are a read-write mount, since keeping a ReadWriteOncePod volume to one
/// pod is the CO's job. Advertised by the SINGLE_NODE_MULTI_WRITER capability of both services,
/// as the spec asks before a CO may use them.
pub(crate) const MOUNT_MODES: [Mode; 4] = [
    Mode::SingleNodeWriter,
    Mode::SingleNodeReaderOnly,
    Mode::SingleNodeSingleWriter,
    Mode::SingleNodeMultiWriter,
];

/// Access modes of a raw block volume: the filesystem ones, and MULTI_NODE_MULTI_WRITER for io2
/// Multi-Attach, where the application coordinates its writers (no filesystem could).
pub(crate) const BLOCK_MODES: [Mode; 5] = [
    Mode::SingleNodeWriter,
    Mode::SingleNodeReaderOnly,
    Mode::SingleNodeSingleWriter,
    Mode::SingleNodeMultiWriter,
    Mode::MultiNodeMultiWriter,
];

/// How the workload uses the volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessType {
    /// A filesystem. An empty `fs_type` means "whatever is on the volume, or the default for a
    /// blank one". `mount_flags` are passed to mount at stage time.
    Mount {
        fs_type: String,
        mount_flags: Vec<String>,
    },
    /// The raw block device, bind-mounted onto a file.
    Block,
}

/// A volume capability this driver supports, as the node uses it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Capability {
    pub(crate) access: AccessType,
    /// The access mode allows no writer (SINGLE_NODE_READER_ONLY).
    pub(crate) read_only: bool,
}

/// A required string field: empty is InvalidArgument naming the field (CSI "missing required
/// field").
pub(crate) fn required(field: &'static str, value: &str) -> Result<()> {
    if value.is_empty() {
        Err(Error::invalid(field, "is required"))
    } else {
        Ok(())
    }
}

/// The names of a capability's parts under `field` ("volume_capability" in the node and
/// publish calls, "volume_capabilities" in CreateVolume and ValidateVolumeCapabilities), so
/// that an error names exactly what to fix.
fn parts(field: &'static str) -> [&'static str; 3] {
    if field == "volume_capabilities" {
        [
            "volume_capabilities.access_type",
            "volume_capabilities.access_mode",
            "volume_capabilities.mount.fs_type",
        ]
    } else {
        [
            "volume_capability.access_type",
            "volume_capability.access_mode",
            "volume_capability.mount.fs_type",
        ]
    }
}

/// Checks one volume capability; the error is InvalidArgument naming the part that is missing
/// or not supported (and serves as ValidateVolumeCapabilities' message).
pub(crate) fn check_capability(field: &'static str, cap: &VolumeCapability) -> Result<Capability> {
    let [type_field, mode_field, fs_field] = parts(field);
    let access = match &cap.access_type {
        Some(CsiAccessType::Block(_)) => AccessType::Block,
        Some(CsiAccessType::Mount(m)) => {
            if !m.fs_type.is_empty() && fs_type(&m.fs_type).is_none() {
                return Err(Error::invalid(
                    fs_field,
                    format!(
                        "{:?} is not supported (supported: {})",
                        m.fs_type,
                        supported_fs_types()
                    ),
                ));
            }
            AccessType::Mount {
                fs_type: m.fs_type.clone(),
                mount_flags: m.mount_flags.clone(),
            }
        }
        None => return Err(Error::invalid(type_field, "is required (mount or block)")),
    };
    let mode = cap
        .mode()
        .ok_or_else(|| Error::invalid(mode_field, "is required and must be a known mode"))?;
    let block = access == AccessType::Block;
    let supported: &[Mode] = if block { &BLOCK_MODES } else { &MOUNT_MODES };
    if !supported.contains(&mode) {
        let names: Vec<&str> = supported.iter().map(|m| m.as_str_name()).collect();
        return Err(Error::invalid(
            mode_field,
            format!(
                "{} is not supported for {} volumes: an EBS volume attaches to one node, except raw block io2 Multi-Attach (supported: {})",
                mode.as_str_name(),
                if block { "block" } else { "mount" },
                names.join(", ")
            ),
        ));
    }
    Ok(Capability {
        access,
        read_only: mode == Mode::SingleNodeReaderOnly,
    })
}

/// A required list of capabilities (CreateVolume), every one of them supported.
pub(crate) fn check_capabilities(caps: &[VolumeCapability]) -> Result<()> {
    if caps.is_empty() {
        return Err(Error::invalid("volume_capabilities", "is required"));
    }
    caps.iter()
        .try_for_each(|c| check_capability("volume_capabilities", c).map(drop))
}

/// The required `volume_capability` of a node call.
pub(crate) fn node_capability(cap: Option<&VolumeCapability>) -> Result<Capability> {
    let cap = cap.ok_or_else(|| Error::invalid("volume_capability", "is required"))?;
    check_capability("volume_capability", cap)
}

/// A filesystem type the driver formats and mounts (any case), or `None`.
pub(crate) fn fs_type(name: &str) -> Option<FsType> {
    name.parse().ok()
}

/// The supported filesystem types, for messages.
pub(crate) fn supported_fs_types() -> String {
    mount_utils::fstype::supported_names()
}

/// The topology of a volume or node in `zone`, under both zone keys.
pub(crate) fn topology(zone: &str) -> Topology {
    Topology::from_segments([(TOPOLOGY_ZONE_KEY, zone), (WELL_KNOWN_ZONE_KEY, zone)])
}

/// The zone a topology segment names, under either key.
pub(crate) fn zone_of(t: &Topology) -> Option<String> {
    t.segments
        .get(TOPOLOGY_ZONE_KEY)
        .or_else(|| t.segments.get(WELL_KNOWN_ZONE_KEY))
        .cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_modes() -> Vec<Mode> {
        (0..=10).filter_map(|n| Mode::try_from(n).ok()).collect()
    }

    #[test]
    fn mount_and_block_modes_are_as_documented() {
        for mode in all_modes() {
            let mount = check_capability(
                "volume_capability",
                &VolumeCapability::mount("", vec![], mode),
            );
            assert_eq!(mount.is_ok(), MOUNT_MODES.contains(&mode), "mount {mode:?}");
            let block = check_capability("volume_capability", &VolumeCapability::block(mode));
            assert_eq!(block.is_ok(), BLOCK_MODES.contains(&mode), "block {mode:?}");
        }
        let c = check_capability(
            "volume_capability",
            &VolumeCapability::mount("xfs", vec![], Mode::SingleNodeReaderOnly),
        )
        .unwrap();
        assert!(c.read_only);
        assert_eq!(
            c.access,
            AccessType::Mount {
                fs_type: "xfs".into(),
                mount_flags: vec![]
            }
        );
        for writer in [Mode::SingleNodeSingleWriter, Mode::SingleNodeMultiWriter] {
            let c =
                check_capability("volume_capability", &VolumeCapability::block(writer)).unwrap();
            assert!(!c.read_only && c.access == AccessType::Block);
        }
    }

    #[test]
    fn errors_name_the_part_to_fix() {
        let err = check_capability(
            "volume_capability",
            &VolumeCapability::mount("", vec![], Mode::MultiNodeMultiWriter),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("volume_capability.access_mode"), "{err}");
        assert!(err.contains("MULTI_NODE_MULTI_WRITER"), "{err}");
        let err = check_capability(
            "volume_capabilities",
            &VolumeCapability::mount("ntfs", vec![], Mode::SingleNodeWriter),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("volume_capabilities.mount.fs_type") && err.contains("ntfs"),
            "{err}"
        );
        let no_type = VolumeCapability {
            access_type: None,
            ..VolumeCapability::block(Mode::SingleNodeWriter)
        };
        let err = node_capability(Some(&no_type)).unwrap_err().to_string();
        assert!(err.contains("volume_capability.access_type"), "{err}");
        let no_mode = VolumeCapability {
            access_mode: None,
            ..VolumeCapability::block(Mode::SingleNodeWriter)
        };
        let err = node_capability(Some(&no_mode)).unwrap_err().to_string();
        assert!(err.contains("volume_capability.access_mode"), "{err}");
        let err = node_capability(None).unwrap_err().to_string();
        assert!(err.contains("volume_capability"), "{err}");
        assert!(check_capabilities(&[]).is_err());
        assert!(
            required("name", "")
                .unwrap_err()
                .to_string()
                .contains("name")
        );
    }

    #[test]
    fn topology_round_trips_through_either_key() {
        let t = topology("us-east-1a");
        assert_eq!(zone_of(&t).as_deref(), Some("us-east-1a"));
        let only_well_known = Topology::from_segments([(WELL_KNOWN_ZONE_KEY, "us-east-1b")]);
        assert_eq!(zone_of(&only_well_known).as_deref(), Some("us-east-1b"));
        assert_eq!(zone_of(&Topology::default()), None);
    }
}
