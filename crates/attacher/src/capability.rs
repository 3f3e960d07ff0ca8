//! PV spec → CSI `VolumeCapability`, as Kubernetes maps it (csi-lib-utils `accessmodes`).

use csi_spec::v1::VolumeCapability;
use csi_spec::v1::volume_capability::access_mode::Mode;
use k8s_openapi::api::core::v1::{CSIPersistentVolumeSource, PersistentVolumeSpec};

use crate::Error;

const RWO: &str = "ReadWriteOnce";
const ROX: &str = "ReadOnlyMany";
const RWX: &str = "ReadWriteMany";
const RWOP: &str = "ReadWriteOncePod";

/// Maps PV access modes to one CSI access mode.
///
/// - ReadWriteOncePod must stand alone: SINGLE_NODE_SINGLE_WRITER when the driver has the
///   SINGLE_NODE_MULTI_WRITER capability, else SINGLE_NODE_WRITER (so older drivers still work);
/// - ReadWriteMany wins over anything else: MULTI_NODE_MULTI_WRITER;
/// - ReadOnlyMany together with ReadWriteOnce has no CSI equivalent: an error;
/// - ReadOnlyMany: MULTI_NODE_READER_ONLY;
/// - ReadWriteOnce: SINGLE_NODE_MULTI_WRITER with that capability (RWO allows several pods on
///   the node), else SINGLE_NODE_WRITER.
pub(crate) fn access_mode(
    what: &str,
    modes: &[String],
    single_node_multi_writer: bool,
) -> Result<Mode, Error> {
    let has = |m: &str| modes.iter().any(|x| x == m);
    let err = |reason: &str| Error::AccessModes {
        what: what.to_string(),
        modes: modes.to_vec(),
        reason: reason.to_string(),
    };
    if let Some(unknown) = modes
        .iter()
        .find(|m| ![RWO, ROX, RWX, RWOP].contains(&m.as_str()))
    {
        return Err(err(&format!("unknown access mode {unknown:?}")));
    }
    if has(RWOP) {
        if modes.iter().any(|m| m != RWOP) {
            return Err(err(
                "ReadWriteOncePod cannot be combined with other access modes",
            ));
        }
        return Ok(if single_node_multi_writer {
            Mode::SingleNodeSingleWriter
        } else {
            Mode::SingleNodeWriter
        });
    }
    if has(RWX) {
        return Ok(Mode::MultiNodeMultiWriter);
    }
    match (has(ROX), has(RWO)) {
        (true, true) => Err(err(
            "CSI has no access mode for ReadOnlyMany together with ReadWriteOnce",
        )),
        (true, false) => Ok(Mode::MultiNodeReaderOnly),
        (false, true) => Ok(if single_node_multi_writer {
            Mode::SingleNodeMultiWriter
        } else {
            Mode::SingleNodeWriter
        }),
        (false, false) => Err(err("at least one access mode is required")),
    }
}

/// The capability to publish `spec` with: block for `volumeMode: Block`, else mount with the
/// PV's `csi.fsType` (or `default_fstype`) and `mountOptions`.
pub(crate) fn volume_capability(
    what: &str,
    spec: &PersistentVolumeSpec,
    csi: &CSIPersistentVolumeSource,
    single_node_multi_writer: bool,
    default_fstype: &str,
) -> Result<VolumeCapability, Error> {
    let modes = spec.access_modes.clone().unwrap_or_default();
    let mode = access_mode(what, &modes, single_node_multi_writer)?;
    if spec.volume_mode.as_deref() == Some("Block") {
        return Ok(VolumeCapability::block(mode));
    }
    let fs_type = csi
        .fs_type
        .as_deref()
        .filter(|f| !f.is_empty())
        .unwrap_or(default_fstype);
    Ok(VolumeCapability::mount(
        fs_type,
        spec.mount_options.clone().unwrap_or_default(),
        mode,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_spec::v1::volume_capability::AccessType;

    fn modes(m: &[&str]) -> Vec<String> {
        m.iter().map(|s| (*s).to_string()).collect()
    }

    fn map(m: &[&str], snmw: bool) -> Result<Mode, Error> {
        access_mode("PersistentVolume pv", &modes(m), snmw)
    }

    #[test]
    fn access_modes_without_single_node_multi_writer() {
        assert_eq!(map(&[RWO], false).ok(), Some(Mode::SingleNodeWriter));
        assert_eq!(map(&[ROX], false).ok(), Some(Mode::MultiNodeReaderOnly));
        assert_eq!(map(&[RWX], false).ok(), Some(Mode::MultiNodeMultiWriter));
        assert_eq!(map(&[RWOP], false).ok(), Some(Mode::SingleNodeWriter));
        assert_eq!(
            map(&[RWO, RWX, ROX], false).ok(),
            Some(Mode::MultiNodeMultiWriter)
        );
        assert_eq!(map(&[RWO, RWO], false).ok(), Some(Mode::SingleNodeWriter));
    }

    #[test]
    fn access_modes_with_single_node_multi_writer() {
        assert_eq!(map(&[RWO], true).ok(), Some(Mode::SingleNodeMultiWriter));
        assert_eq!(map(&[RWOP], true).ok(), Some(Mode::SingleNodeSingleWriter));
        assert_eq!(map(&[ROX], true).ok(), Some(Mode::MultiNodeReaderOnly));
        assert_eq!(map(&[RWX], true).ok(), Some(Mode::MultiNodeMultiWriter));
    }

    #[test]
    fn impossible_combinations_are_errors_naming_the_modes() {
        let e = map(&[RWOP, RWO], true).expect_err("RWOP+RWO");
        assert!(
            e.to_string()
                .contains("ReadWriteOncePod cannot be combined"),
            "{e}"
        );
        let e = map(&[ROX, RWO], false).expect_err("ROX+RWO");
        assert!(e.to_string().contains("spec.accessModes"), "{e}");
        assert!(e.to_string().contains("PersistentVolume pv"), "{e}");
        assert!(map(&[], false).is_err());
        let e = map(&["ReadWriteSometimes"], false).expect_err("unknown");
        assert!(e.to_string().contains("ReadWriteSometimes"), "{e}");
    }

    fn spec(mode: Option<&str>, mount_options: &[&str]) -> PersistentVolumeSpec {
        PersistentVolumeSpec {
            access_modes: Some(modes(&[RWO])),
            volume_mode: mode.map(str::to_string),
            mount_options: (!mount_options.is_empty()).then(|| modes(mount_options)),
            ..Default::default()
        }
    }

    fn csi(fs_type: Option<&str>) -> CSIPersistentVolumeSource {
        CSIPersistentVolumeSource {
            driver: "d".into(),
            volume_handle: "v".into(),
            fs_type: fs_type.map(str::to_string),
            ..Default::default()
        }
    }

    #[test]
    fn block_volumes_get_a_block_capability() {
        let cap = volume_capability(
            "pv",
            &spec(Some("Block"), &["ro"]),
            &csi(Some("ext4")),
            false,
            "xfs",
        )
        .expect("cap");
        assert!(cap.is_block());
        assert_eq!(cap.mode(), Some(Mode::SingleNodeWriter));
    }

    #[test]
    fn mount_volumes_carry_fstype_and_mount_options() {
        let cap = volume_capability(
            "pv",
            &spec(Some("Filesystem"), &["noatime", "nodiratime"]),
            &csi(Some("ext4")),
            false,
            "xfs",
        )
        .expect("cap");
        let Some(AccessType::Mount(m)) = cap.access_type else {
            panic!("mount expected: {cap:?}");
        };
        assert_eq!(m.fs_type, "ext4");
        assert_eq!(m.mount_flags, ["noatime", "nodiratime"]);
    }

    #[test]
    fn default_fstype_fills_in_a_missing_or_empty_fstype() {
        for fs in [None, Some("")] {
            let cap =
                volume_capability("pv", &spec(None, &[]), &csi(fs), false, "xfs").expect("cap");
            let Some(AccessType::Mount(m)) = cap.access_type else {
                panic!("mount expected");
            };
            assert_eq!(m.fs_type, "xfs");
        }
        let cap = volume_capability("pv", &spec(None, &[]), &csi(None), false, "").expect("cap");
        let Some(AccessType::Mount(m)) = cap.access_type else {
            panic!("mount expected");
        };
        assert_eq!(m.fs_type, "", "no default: the driver picks");
    }
}
