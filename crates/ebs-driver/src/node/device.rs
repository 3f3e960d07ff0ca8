//! Finding the block device of a volume, and making sure it really is that volume's device.
//!
//! Where an attached EBS volume shows up depends on the instance: Xen instances show the
//! requested name (`/dev/xvdba`, or `/dev/sdX` renamed by the kernel to `/dev/xvdX`), Nitro
//! instances show `/dev/nvmeXn1` plus the udev link
//! `/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_vol<id-without-dash>`, and ec2-sim shows loop
//! devices behind the same two kinds of links. Links can be stale (a device name reused after a
//! detach), so a resolved device is used only after its identity is checked against the kernel:
//! an NVMe controller's serial is the volume ID without its dash, a loop device's backing file
//! is `<volume-id>.img`. A plain Xen device carries no identity, and is accepted as AWS's own
//! driver does.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

use crate::{Error, Result};

const NVME_BY_ID_PREFIX: &str = "disk/by-id/nvme-Amazon_Elastic_Block_Store_";

/// A verified block device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FoundDevice {
    /// The candidate path that led to it (the publish context path, a by-id link...).
    pub(crate) via: PathBuf,
    /// The real device node, all symlinks resolved. Everything after finding uses this path, so
    /// a link that changes later cannot redirect a mkfs or mount.
    pub(crate) path: PathBuf,
    /// Its device number, to compare with mountinfo.
    pub(crate) dev: (u32, u32),
}

#[derive(Debug, Clone)]
pub(crate) struct DeviceFinder {
    /// Where device nodes and links live (`/dev`; a temp dir in tests).
    pub(crate) dev_root: PathBuf,
    /// Where the kernel's sysfs is (`/sys`).
    pub(crate) sys_root: PathBuf,
    /// How long to wait for the device to appear right after an attach.
    pub(crate) wait: Duration,
    pub(crate) poll: Duration,
}

/// EBS volume IDs: `vol-` and 8 (old) or 17 lowercase hex digits. Anything else names a volume
/// that cannot exist: CSI's "volume does not exist" (NOT_FOUND), not a malformed request, since
/// the ID is opaque to the CO.
pub(crate) fn validate_volume_id(volume_id: &str) -> Result<()> {
    let ok = volume_id.strip_prefix("vol-").is_some_and(|hex| {
        (hex.len() == 8 || hex.len() == 17)
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    });
    if ok {
        Ok(())
    } else {
        Err(Error::NoSuchVolumeId(volume_id.to_string()))
    }
}

enum Candidate {
    Missing,
    Verified(FoundDevice),
    Rejected(Error),
}

impl DeviceFinder {
    /// Where to look, in order: the path from the publish context, the NVMe by-id link, and the
    /// Xen rename of `/dev/sdX` to `/dev/xvdX`.
    pub(crate) fn candidates(
        &self,
        volume_id: &str,
        device_path: Option<&str>,
    ) -> Result<Vec<PathBuf>> {
        let mut out = Vec::new();
        if let Some(p) = device_path.filter(|p| !p.is_empty()) {
            let rel = relative_to_dev(p)?;
            out.push(self.dev_root.join(&rel));
            if let Some(xvd) = xen_rename(&rel) {
                out.push(self.dev_root.join(xvd));
            }
        }
        out.insert(
            out.len().min(1),
            self.dev_root
                .join(format!("{NVME_BY_ID_PREFIX}{}", volume_id.replace('-', ""))),
        );
        Ok(out)
    }

    /// Waits (up to `wait`) for a candidate that resolves to a device verified as `volume_id`'s.
    /// A candidate that belongs to another volume is never used; if nothing better turns up
    /// before the deadline, the error says which volume that device really belongs to.
    pub(crate) async fn find(
        &self,
        volume_id: &str,
        device_path: Option<&str>,
    ) -> Result<FoundDevice> {
        let candidates = self.candidates(volume_id, device_path)?;
        let started = Instant::now();
        loop {
            let mut rejected = None;
            for c in &candidates {
                match self.check(c, volume_id) {
                    Candidate::Verified(found) => {
                        if let Some(err) = &rejected {
                            tracing::warn!(volume_id, error = %err, used = %found.via.display(), "ignored a stale device link");
                        }
                        return Ok(found);
                    }
                    Candidate::Rejected(e) => {
                        rejected.get_or_insert(e);
                    }
                    Candidate::Missing => {}
                }
            }
            if started.elapsed() >= self.wait {
                return Err(rejected.unwrap_or_else(|| Error::DeviceNotFound {
                    volume_id: volume_id.to_string(),
                    candidates: candidates.iter().map(|c| c.display().to_string()).collect(),
                    waited_ms: started.elapsed().as_millis(),
                }));
            }
            tokio::time::sleep(self.poll).await;
        }
    }

    fn check(&self, candidate: &Path, volume_id: &str) -> Candidate {
        let Ok(path) = std::fs::canonicalize(candidate) else {
            return Candidate::Missing;
        };
        let bad = |reason: String| {
            Candidate::Rejected(Error::BadDevice {
                path: candidate.to_path_buf(),
                volume_id: volume_id.to_string(),
                reason,
            })
        };
        let meta = match std::fs::metadata(&path) {
            Ok(m) => m,
            Err(e) => return bad(format!("stat {}: {e}", path.display())),
        };
        if !meta.file_type().is_block_device() {
            return bad(format!("{} is not a block device", path.display()));
        }
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        match device_owner(&self.sys_root, &name) {
            Ok(Some(owner)) if owner != volume_id => Candidate::Rejected(Error::WrongVolume {
                path: candidate.to_path_buf(),
                device: path,
                expected: volume_id.to_string(),
                actual: owner,
            }),
            Ok(_) => {
                let rdev = meta.rdev();
                Candidate::Verified(FoundDevice {
                    via: candidate.to_path_buf(),
                    path,
                    dev: (rustix::fs::major(rdev), rustix::fs::minor(rdev)),
                })
            }
            Err(reason) => bad(reason),
        }
    }
}

/// Which volume the kernel says device `name` belongs to: `Some(id)` for NVMe (serial) and loop
/// (backing file) devices, `None` for devices that carry no identity (Xen `xvd*`). A device that
/// should carry one but does not is an error.
pub(crate) fn device_owner(sys_root: &Path, name: &str) -> Result<Option<String>, String> {
    let block = sys_root.join("block").join(name);
    if name.starts_with("nvme") {
        let file = block.join("device/serial");
        let serial = std::fs::read_to_string(&file)
            .map_err(|e| format!("cannot read NVMe serial {}: {e}", file.display()))?;
        let serial = serial.trim();
        // EBS serials are the volume ID without its dash; anything else (instance store...) is
        // reported as it is.
        let owner = match serial.strip_prefix("vol") {
            Some(hex) if !hex.is_empty() && !hex.starts_with('-') => format!("vol-{hex}"),
            _ => format!("(not an EBS volume: NVMe serial {serial:?})"),
        };
        return Ok(Some(owner));
    }
    if name.starts_with("loop") {
        let file = block.join("loop/backing_file");
        let backing = std::fs::read_to_string(&file)
            .map_err(|e| format!("loop device has no backing file ({}: {e})", file.display()))?;
        let backing = backing.trim().trim_end_matches(" (deleted)");
        let file_name = Path::new(backing)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned());
        let owner = match file_name.as_deref().and_then(|n| n.strip_suffix(".img")) {
            Some(id) => id.to_string(),
            None => format!("(not a volume image: {backing})"),
        };
        return Ok(Some(owner));
    }
    Ok(None)
}

/// Which volume the block device numbered `dev` belongs to, when the kernel can tell (NVMe serial,
/// loop backing file). `None` when it cannot: a Xen device, a device sysfs does not list, an
/// identity that cannot be read; callers then trust the path they were given.
pub(crate) fn owner_of(sys_root: &Path, dev: (u32, u32)) -> Option<String> {
    let link = sys_root.join(format!("dev/block/{}:{}", dev.0, dev.1));
    let target = std::fs::read_link(link).ok()?;
    let name = target.file_name()?.to_string_lossy().into_owned();
    device_owner(sys_root, &name).ok().flatten()
}

/// `/dev/xvdba` -> `xvdba`. The publish context comes from the controller; it must name a
/// device node under /dev and nothing else.
fn relative_to_dev(device_path: &str) -> Result<PathBuf> {
    let invalid = |why: &str| {
        Error::invalid(
            "publish_context.devicePath",
            format!("{device_path:?} {why}"),
        )
    };
    let rel = Path::new(device_path)
        .strip_prefix("/dev")
        .map_err(|_| invalid("is not under /dev"))?;
    if rel.as_os_str().is_empty() || rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return Err(invalid("is not a plain path under /dev"));
    }
    Ok(rel.to_path_buf())
}

/// Xen kernels rename `sdX` to `xvdX`.
fn xen_rename(rel: &Path) -> Option<PathBuf> {
    let s = rel.to_str()?;
    let rest = s.strip_prefix("sd")?;
    (!rest.is_empty() && !rest.contains('/')).then(|| PathBuf::from(format!("xvd{rest}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finder(dev_root: &Path) -> DeviceFinder {
        DeviceFinder {
            dev_root: dev_root.to_path_buf(),
            sys_root: PathBuf::from("/sys"),
            wait: Duration::from_millis(50),
            poll: Duration::from_millis(10),
        }
    }

    #[test]
    fn volume_ids_are_validated() {
        validate_volume_id("vol-0123456789abcdef0").unwrap();
        validate_volume_id("vol-01234567").unwrap();
        for bad in [
            "",
            "vol-",
            "vol-0123456789ABCDEF0",
            "vol-012345678",
            "snap-01234567",
            "vol-0123456g",
        ] {
            let err = validate_volume_id(bad).unwrap_err();
            assert!(matches!(err, Error::NoSuchVolumeId(_)), "{err}");
            assert!(err.to_string().contains("volume_id"), "{err}");
        }
    }

    #[test]
    fn candidates_cover_context_path_nvme_link_and_xen_rename() {
        let f = finder(Path::new("/fake/dev"));
        let c = f
            .candidates("vol-0123456789abcdef0", Some("/dev/sdf"))
            .unwrap();
        assert_eq!(
            c,
            vec![
                PathBuf::from("/fake/dev/sdf"),
                PathBuf::from(
                    "/fake/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_vol0123456789abcdef0"
                ),
                PathBuf::from("/fake/dev/xvdf"),
            ]
        );
        let only_nvme = f.candidates("vol-0123456789abcdef0", None).unwrap();
        assert_eq!(only_nvme.len(), 1);
    }

    #[test]
    fn device_paths_outside_dev_are_rejected() {
        let f = finder(Path::new("/dev"));
        for bad in [
            "/etc/passwd",
            "/dev/../etc/passwd",
            "dev/xvdba",
            "/dev",
            "/dev/",
        ] {
            let err = f.candidates("vol-01234567", Some(bad)).unwrap_err();
            assert!(
                err.to_string().contains("publish_context.devicePath"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn nvme_serial_names_the_owner() {
        let sys = tempfile::tempdir().unwrap();
        let dev = sys.path().join("block/nvme1n1/device");
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::write(dev.join("serial"), "vol0123456789abcdef0   \n").unwrap();
        assert_eq!(
            device_owner(sys.path(), "nvme1n1").unwrap().as_deref(),
            Some("vol-0123456789abcdef0")
        );
        std::fs::write(dev.join("serial"), "AWS1234567890\n").unwrap();
        let owner = device_owner(sys.path(), "nvme1n1").unwrap().unwrap();
        assert!(owner.contains("not an EBS volume"), "{owner}");
        assert!(
            device_owner(sys.path(), "nvme2n1")
                .unwrap_err()
                .contains("serial")
        );
    }

    #[test]
    fn loop_backing_file_names_the_owner() {
        let sys = tempfile::tempdir().unwrap();
        let lo = sys.path().join("block/loop7/loop");
        std::fs::create_dir_all(&lo).unwrap();
        std::fs::write(
            lo.join("backing_file"),
            "/var/sim/volumes/vol-0fedcba9876543210.img (deleted)\n",
        )
        .unwrap();
        assert_eq!(
            device_owner(sys.path(), "loop7").unwrap().as_deref(),
            Some("vol-0fedcba9876543210")
        );
        assert!(
            device_owner(sys.path(), "loop8")
                .unwrap_err()
                .contains("backing file")
        );
    }

    #[test]
    fn xen_devices_carry_no_identity() {
        let sys = tempfile::tempdir().unwrap();
        assert_eq!(device_owner(sys.path(), "xvdba").unwrap(), None);
    }

    #[tokio::test]
    async fn missing_device_times_out_naming_candidates() {
        let root = tempfile::tempdir().unwrap();
        let err = finder(root.path())
            .find("vol-0123456789abcdef0", Some("/dev/xvdba"))
            .await
            .unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, Error::DeviceNotFound { .. }), "{msg}");
        assert!(
            msg.contains("xvdba") && msg.contains("nvme-Amazon"),
            "{msg}"
        );
    }

    #[tokio::test]
    async fn a_regular_file_is_not_a_device() {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("xvdba"), b"").unwrap();
        let err = finder(root.path())
            .find("vol-0123456789abcdef0", Some("/dev/xvdba"))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("not a block device"), "{err}");
    }
}
