//! Request checks shared by the controller and node services. Every error names the field as
//! the CSI message spells it (`volume_capabilities[1].access_mode`) and says what was expected.

use csi_spec::v1::volume_capability::AccessType;
use csi_spec::v1::volume_capability::access_mode::Mode;
use csi_spec::v1::{CapacityRange, TopologyRequirement, VolumeCapability};

use crate::config::TOPOLOGY_KEY;
use crate::state::{Kind, Volume};
use crate::{Error, Result};

/// A loop device's size must be a whole number of 512-byte sectors.
pub(crate) const SECTOR: u64 = 512;

/// What one volume capability asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Access {
    pub kind: Kind,
    pub mode: Mode,
}

impl Access {
    /// The mode itself says nobody writes.
    pub(crate) fn read_only_mode(&self) -> bool {
        matches!(
            self.mode,
            Mode::SingleNodeReaderOnly | Mode::MultiNodeReaderOnly
        )
    }
}

pub(crate) fn non_empty(field: &str, value: &str) -> Result<()> {
    if value.is_empty() {
        return Err(Error::required(field));
    }
    Ok(())
}

/// The access type and mode a capability names; only a missing or unknown part is an error
/// here (whether the driver supports it is [`supported`]).
pub(crate) fn shape(field: &str, cap: Option<&VolumeCapability>) -> Result<Access> {
    let cap = cap.ok_or_else(|| Error::required(field))?;
    let kind = match &cap.access_type {
        Some(AccessType::Mount(_)) => Kind::Mount,
        Some(AccessType::Block(_)) => Kind::Block,
        None => {
            return Err(Error::invalid(
                format!("{field}.access_type"),
                "is required (mount or block)",
            ));
        }
    };
    let raw = cap
        .access_mode
        .as_ref()
        .ok_or_else(|| Error::required(&format!("{field}.access_mode")))?
        .mode;
    match Mode::try_from(raw) {
        Ok(mode) if mode != Mode::Unknown => Ok(Access { kind, mode }),
        _ => Err(Error::invalid(
            format!("{field}.access_mode.mode"),
            format!("{raw} is not a known access mode"),
        )),
    }
}

/// Why the driver cannot serve `access`, if it cannot: a hostpath volume lives on one node,
/// so the MULTI_NODE modes are refused.
pub(crate) fn unsupported(access: Access) -> Option<String> {
    match access.mode {
        Mode::SingleNodeWriter
        | Mode::SingleNodeReaderOnly
        | Mode::SingleNodeSingleWriter
        | Mode::SingleNodeMultiWriter
        | Mode::Unknown => None,
        Mode::MultiNodeReaderOnly | Mode::MultiNodeSingleWriter | Mode::MultiNodeMultiWriter => {
            Some(format!(
                "{} is not supported: a hostpath volume is on one node (supported: SINGLE_NODE_WRITER, SINGLE_NODE_READER_ONLY, SINGLE_NODE_SINGLE_WRITER, SINGLE_NODE_MULTI_WRITER)",
                access.mode.as_str_name()
            ))
        }
    }
}

/// One capability the driver supports.
pub(crate) fn capability(field: &str, cap: Option<&VolumeCapability>) -> Result<Access> {
    let access = shape(field, cap)?;
    match unsupported(access) {
        None => Ok(access),
        Some(reason) => Err(Error::invalid(format!("{field}.access_mode"), reason)),
    }
}

/// A non-empty list of capabilities that all ask for the same access type.
pub(crate) fn capabilities(field: &str, caps: &[VolumeCapability]) -> Result<Kind> {
    if caps.is_empty() {
        return Err(Error::required(field));
    }
    let mut kind = None;
    for (i, cap) in caps.iter().enumerate() {
        let access = capability(&format!("{field}[{i}]"), Some(cap))?;
        match kind {
            None => kind = Some(access.kind),
            Some(k) if k != access.kind => {
                return Err(Error::invalid(
                    field,
                    "mixes mount and block access types: a volume is one or the other",
                ));
            }
            Some(_) => {}
        }
    }
    Ok(kind.unwrap_or(Kind::Mount))
}

/// The size to create: `required_bytes`, else the default capped by `limit_bytes`. A block
/// image is rounded up to whole sectors.
pub(crate) fn size(range: Option<&CapacityRange>, kind: Kind, default: u64) -> Result<u64> {
    let (required, limit) = range.map_or((0, 0), |r| (r.required_bytes, r.limit_bytes));
    if required < 0 {
        return Err(Error::invalid(
            "capacity_range.required_bytes",
            format!("must not be negative (got {required})"),
        ));
    }
    if limit < 0 {
        return Err(Error::invalid(
            "capacity_range.limit_bytes",
            format!("must not be negative (got {limit})"),
        ));
    }
    let (required, limit) = (required.unsigned_abs(), limit.unsigned_abs());
    if limit > 0 && limit < required {
        return Err(Error::OutOfRange(format!(
            "limit_bytes {limit} is less than required_bytes {required}"
        )));
    }
    let mut size = if required > 0 {
        required
    } else if limit > 0 {
        default.min(limit)
    } else {
        default
    };
    if kind == Kind::Block {
        size = size.div_ceil(SECTOR).saturating_mul(SECTOR);
        if limit > 0 && size > limit {
            return Err(Error::OutOfRange(format!(
                "a block volume is a whole number of {SECTOR}-byte sectors; {size} bytes exceeds limit_bytes {limit}"
            )));
        }
    }
    Ok(size)
}

/// Whether a volume on `node_id` satisfies the requirement: with `requisite` segments, one of
/// them must name this node under [`TOPOLOGY_KEY`]; `preferred` alone is only a preference
/// (CSI: any topology satisfies an empty requisite list).
pub(crate) fn topology_allows(req: Option<&TopologyRequirement>, node_id: &str) -> bool {
    let Some(req) = req else { return true };
    if req.requisite.is_empty() {
        return true;
    }
    req.requisite
        .iter()
        .any(|t| t.segments.get(TOPOLOGY_KEY).is_some_and(|v| v == node_id))
}

/// The access a request (NodeStage, NodePublish) asks for, which must match the volume's type.
pub(crate) fn access_for(v: &Volume, cap: Option<&VolumeCapability>) -> Result<Access> {
    let access = capability("volume_capability", cap)?;
    fits_volume(v, access)?;
    Ok(access)
}

/// `access` (already checked) matches the volume's type (ControllerPublish checks the
/// capability before it knows whether the volume is this node's).
pub(crate) fn fits_volume(v: &Volume, access: Access) -> Result<()> {
    if access.kind != v.kind {
        return Err(Error::invalid(
            "volume_capability.access_type",
            format!(
                "asks for {} access, but volume {} is a {} volume",
                access.kind.as_str(),
                v.id,
                v.kind.as_str()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use csi_spec::v1::Topology;
    use tonic::Code;

    fn mount(mode: Mode) -> VolumeCapability {
        VolumeCapability::mount("", vec![], mode)
    }

    #[test]
    fn capability_errors_name_the_field() {
        let e = capability("volume_capability", None).unwrap_err();
        assert_eq!(e.to_string(), "volume_capability is required");
        let mut c = mount(Mode::SingleNodeWriter);
        c.access_type = None;
        let e = capability("volume_capability", Some(&c)).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("volume_capability.access_type is required"),
            "{e}"
        );
        c = mount(Mode::SingleNodeWriter);
        c.access_mode = None;
        let e = capability("volume_capability", Some(&c)).unwrap_err();
        assert_eq!(e.to_string(), "volume_capability.access_mode is required");
        let e = capability("c", Some(&mount(Mode::MultiNodeMultiWriter))).unwrap_err();
        assert!(e.to_string().contains("MULTI_NODE_MULTI_WRITER"), "{e}");
        let e = capability("c", Some(&mount(Mode::Unknown))).unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        let a = capability(
            "c",
            Some(&VolumeCapability::block(Mode::SingleNodeReaderOnly)),
        )
        .unwrap();
        assert_eq!(a.kind, Kind::Block);
        assert!(a.read_only_mode());
    }

    #[test]
    fn capability_lists() {
        let e = capabilities("volume_capabilities", &[]).unwrap_err();
        assert_eq!(e.to_string(), "volume_capabilities is required");
        let mixed = [
            mount(Mode::SingleNodeWriter),
            VolumeCapability::block(Mode::SingleNodeWriter),
        ];
        let e = capabilities("volume_capabilities", &mixed).unwrap_err();
        assert!(e.to_string().contains("mixes mount and block"), "{e}");
        let bad = [
            mount(Mode::SingleNodeWriter),
            mount(Mode::MultiNodeReaderOnly),
        ];
        let e = capabilities("volume_capabilities", &bad).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("volume_capabilities[1].access_mode"),
            "{e}"
        );
        assert_eq!(
            capabilities("v", &[mount(Mode::SingleNodeMultiWriter)]).unwrap(),
            Kind::Mount
        );
    }

    #[test]
    fn sizes() {
        let r = |required, limit| CapacityRange {
            required_bytes: required,
            limit_bytes: limit,
        };
        assert_eq!(size(None, Kind::Mount, 100).unwrap(), 100);
        assert_eq!(size(Some(&r(10, 0)), Kind::Mount, 100).unwrap(), 10);
        assert_eq!(size(Some(&r(0, 50)), Kind::Mount, 100).unwrap(), 50);
        assert_eq!(size(Some(&r(1000, 0)), Kind::Block, 100).unwrap(), 1024);
        assert_eq!(
            size(Some(&r(20, 10)), Kind::Mount, 100).unwrap_err().code(),
            Code::OutOfRange
        );
        assert_eq!(
            size(Some(&r(1000, 1000)), Kind::Block, 100)
                .unwrap_err()
                .code(),
            Code::OutOfRange
        );
        let e = size(Some(&r(-1, 0)), Kind::Mount, 100).unwrap_err();
        assert!(
            e.to_string().starts_with("capacity_range.required_bytes"),
            "{e}"
        );
    }

    #[test]
    fn topology() {
        let seg = |v: &str| Topology {
            segments: [(TOPOLOGY_KEY.to_string(), v.to_string())].into(),
        };
        assert!(topology_allows(None, "n1"));
        let only_other = TopologyRequirement {
            requisite: vec![seg("n2")],
            preferred: vec![seg("n2")],
        };
        assert!(!topology_allows(Some(&only_other), "n1"));
        let either = TopologyRequirement {
            requisite: vec![seg("n2"), seg("n1")],
            preferred: vec![],
        };
        assert!(topology_allows(Some(&either), "n1"));
        let preferred_only = TopologyRequirement {
            requisite: vec![],
            preferred: vec![seg("n2")],
        };
        assert!(topology_allows(Some(&preferred_only), "n1"));
        let other_key = TopologyRequirement {
            requisite: vec![Topology {
                segments: [("zone".to_string(), "n1".to_string())].into(),
            }],
            preferred: vec![],
        };
        assert!(!topology_allows(Some(&other_key), "n1"));
    }
}
