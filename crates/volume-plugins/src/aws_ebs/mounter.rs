//! The kubelet's side of the in-tree plugin (its `WaitForAttach`, `MountDevice` and
//! `UnmountDevice`), with `mount-utils`. The mount table is the source of truth for "already
//! done", so every call can be repeated.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use mount_utils::findmnt;
use mount_utils::stage::{self, Stage};
use mount_utils::{FsType, mount};
use tokio::time::Instant;

use super::volume_id_from_spec;
use crate::{Error, Result};

/// How often a missing device is looked for again.
const POLL: Duration = Duration::from_millis(100);

/// The udev link under which Nitro instances show an EBS volume, followed by the volume ID
/// without its dash.
const NVME_BY_ID_PREFIX: &str = "disk/by-id/nvme-Amazon_Elastic_Block_Store_";

/// The filesystem a blank device gets when the spec names none (Kubernetes' default).
const DEFAULT_FS: FsType = FsType::Ext4;

/// The kubelet's `WaitForAttach`: waits up to `timeout` for the device of an attached volume
/// and returns its real path (symlinks resolved). `device_path` is what the attach/detach
/// controller wrote into `node.status.volumesAttached`; where the volume really shows up
/// depends on the instance, so these are looked at, in order: that path, its Xen rename
/// (`/dev/sdf` shows up as `/dev/xvdf`) and the NVMe link of Nitro instances
/// (`/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_vol<id without dash>`).
pub async fn wait_for_attach(
    device_path: &str,
    spec_volume_id: &str,
    timeout: Duration,
) -> Result<PathBuf> {
    wait_for_attach_under(Path::new("/dev"), device_path, spec_volume_id, timeout).await
}

/// [`wait_for_attach`] with the device directory at `dev_root` instead of `/dev` (a node
/// agent whose devices are elsewhere: ec2-sim's per-instance device dirs). `/dev/xvdba` in
/// `device_path` is looked for as `<dev_root>/xvdba`.
pub async fn wait_for_attach_under(
    dev_root: &Path,
    device_path: &str,
    spec_volume_id: &str,
    timeout: Duration,
) -> Result<PathBuf> {
    let volume_id = volume_id_from_spec(spec_volume_id)?;
    if device_path.is_empty() {
        return Err(Error::InvalidSpec(format!(
            "volume {volume_id}: the attach/detach controller reported no devicePath for it in node.status.volumesAttached"
        )));
    }
    let candidates = device_candidates(dev_root, device_path, &volume_id);
    let deadline = Instant::now() + timeout;
    loop {
        for candidate in &candidates {
            if let Some(device) = block_device(candidate, candidate).await? {
                return Ok(device.path);
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            let names: Vec<String> = candidates.iter().map(|c| c.display().to_string()).collect();
            return Err(Error::Timeout {
                what: format!(
                    "the device of volume {volume_id} to appear at {} (is it attached to this node?)",
                    names.join(" or ")
                ),
                waited: timeout,
            });
        }
        tokio::time::sleep(POLL.min(left)).await;
    }
}

/// Where a volume attached as `device_path` may show up under `dev_root` (`/dev`).
fn device_candidates(dev_root: &Path, device_path: &str, volume_id: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let path = Path::new(device_path);
    match path.strip_prefix("/dev") {
        Ok(rel) if rel.components().all(|c| matches!(c, Component::Normal(_))) => {
            out.push(dev_root.join(rel));
            let xen = rel
                .to_str()
                .and_then(|s| s.strip_prefix("sd"))
                .filter(|rest| !rest.is_empty() && !rest.contains('/'));
            if let Some(rest) = xen {
                out.push(dev_root.join(format!("xvd{rest}")));
            }
        }
        _ => out.push(path.to_path_buf()),
    }
    out.push(dev_root.join(format!("{NVME_BY_ID_PREFIX}{}", volume_id.replace('-', ""))));
    out
}

/// A block device, resolved.
#[derive(Debug)]
struct Device {
    path: PathBuf,
    dev: (u32, u32),
}

/// `path` resolved to a block device; `None` while it does not exist.
async fn block_device(path: &Path, staging_dir: &Path) -> Result<Option<Device>> {
    let real = match tokio::fs::canonicalize(path).await {
        Ok(real) => real,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(mount_utils::Error::Io {
                op: "resolve device path",
                path: path.to_path_buf(),
                source,
            }
            .into());
        }
    };
    let meta = tokio::fs::metadata(&real)
        .await
        .map_err(|source| mount_utils::Error::Io {
            op: "stat device",
            path: real.clone(),
            source,
        })?;
    if !meta.file_type().is_block_device() {
        return Err(Error::MountDevice {
            device: path.to_path_buf(),
            staging_dir: staging_dir.to_path_buf(),
            reason: format!("{} is not a block device", real.display()),
        });
    }
    let rdev = meta.rdev();
    Ok(Some(Device {
        path: real,
        dev: (rustix::fs::major(rdev), rustix::fs::minor(rdev)),
    }))
}

/// The kubelet's `MountDevice` for an aws-ebs volume: waits up to `timeout` for `device_path`
/// to appear, then mounts it at `staging_dir` (created if missing):
///
/// - a device blkid finds blank (and whose first MiB reads as zeros) is formatted with
///   `fs_type` (ext4 when empty); one that is to be mounted read-only is never formatted;
/// - a device with a filesystem is never formatted: it is checked (e2fsck -p for ext*; not
///   when read-only, nor while it is mounted elsewhere) and mounted as it is. `fs_type`, when
///   given, must be what it holds;
/// - anything else on the device (partition table, damaged filesystem) is refused;
/// - `mount_options` are passed on, plus `ro` when `read_only` (and `nouuid` for xfs, so a
///   volume restored from a snapshot of one mounted here can be mounted too).
///
/// Already mounted at `staging_dir` from this device: success (done before). From another
/// device: [`Error::MountDevice`] naming both. A failed mount leaves no directory it created.
pub async fn mount_device(
    device_path: &Path,
    staging_dir: &Path,
    fs_type: &str,
    mount_options: &[String],
    read_only: bool,
    timeout: Duration,
) -> Result<()> {
    let requested = if fs_type.trim().is_empty() {
        None
    } else {
        Some(fs_type.trim().parse::<FsType>()?)
    };
    let device = wait_for_device(device_path, staging_dir, timeout).await?;
    let table = findmnt::read().await?;
    if let Some(m) = findmnt::mount_at(&table, staging_dir) {
        if m.dev() != device.dev {
            return Err(Error::MountDevice {
                device: device_path.to_path_buf(),
                staging_dir: staging_dir.to_path_buf(),
                reason: format!(
                    "{} ({}:{}) is mounted there, not {} ({}:{})",
                    m.source,
                    m.major,
                    m.minor,
                    device.path.display(),
                    device.dev.0,
                    device.dev.1
                ),
            });
        }
        if m.read_only() != read_only {
            tracing::warn!(device = %device.path.display(), staging = %staging_dir.display(), mounted_ro = m.read_only(), read_only, "already mounted, with another read-only setting; left as it is");
        }
        tracing::debug!(device = %device.path.display(), staging = %staging_dir.display(), "already mounted");
        return Ok(());
    }
    let created = match tokio::fs::metadata(staging_dir).await {
        Ok(_) => false,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            tokio::fs::create_dir_all(staging_dir)
                .await
                .map_err(|source| mount_utils::Error::Io {
                    op: "create staging directory",
                    path: staging_dir.to_path_buf(),
                    source,
                })?;
            true
        }
        Err(source) => {
            return Err(mount_utils::Error::Io {
                op: "stat staging directory",
                path: staging_dir.to_path_buf(),
                source,
            }
            .into());
        }
    };
    let result = stage::format_and_mount(&Stage {
        device: &device.path,
        dev: device.dev,
        target: staging_dir,
        requested,
        default_fs: DEFAULT_FS,
        read_only,
        options: mount_options,
        table: &table,
    })
    .await
    .map_err(|e| stage_error(e, device_path, staging_dir));
    if result.is_err() && created {
        if let Err(e) = tokio::fs::remove_dir(staging_dir).await {
            tracing::warn!(staging = %staging_dir.display(), error = %e, "could not remove the staging directory after a failed mount");
        }
    }
    let fs = result?;
    tracing::info!(device = %device.path.display(), staging = %staging_dir.display(), %fs, read_only, "mounted");
    Ok(())
}

async fn wait_for_device(
    device_path: &Path,
    staging_dir: &Path,
    timeout: Duration,
) -> Result<Device> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(device) = block_device(device_path, staging_dir).await? {
            return Ok(device);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::Timeout {
                what: format!(
                    "device {} to appear (is the volume attached to this node?)",
                    device_path.display()
                ),
                waited: timeout,
            });
        }
        tokio::time::sleep(POLL.min(left)).await;
    }
}

/// The plugin's wording for the shared stage step's refusals: [`Error::MountDevice`] naming
/// the device path it was given and the staging directory, as the kubelet's event shows it.
fn stage_error(e: mount_utils::Error, device_path: &Path, staging_dir: &Path) -> Error {
    let reason = match e {
        mount_utils::Error::ReadOnlyBlank { device } => format!(
            "{} holds no filesystem and the volume is read-only: a read-only volume is never formatted",
            device.display()
        ),
        mount_utils::Error::UnsupportedFilesystem { device, found } => format!(
            "{} holds {found:?}, which this plugin does not mount (supported: {})",
            device.display(),
            mount_utils::fstype::supported_names()
        ),
        mount_utils::Error::FsTypeMismatch {
            device,
            found,
            requested,
        } => format!(
            "{} holds {found}, the volume spec asks for {requested} (it is never reformatted)",
            device.display()
        ),
        other => return other.into(),
    };
    Error::MountDevice {
        device: device_path.to_path_buf(),
        staging_dir: staging_dir.to_path_buf(),
        reason,
    }
}

/// The kubelet's `UnmountDevice`: unmounts everything stacked at `staging_dir` and removes the
/// directory. Not mounted, or missing: success (done before). A directory that is not empty
/// after the unmount holds files written beside the volume and is left, as an error.
pub async fn unmount_device(staging_dir: &Path) -> Result<()> {
    let removed = mount::unmount(staging_dir).await?;
    match tokio::fs::remove_dir(staging_dir).await {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(mount_utils::Error::Io {
                op: "remove staging directory",
                path: staging_dir.to_path_buf(),
                source,
            }
            .into());
        }
    }
    tracing::info!(staging = %staging_dir.display(), unmounted = removed, "unmounted device");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_candidates_cover_the_path_the_xen_rename_and_the_nvme_link() {
        let dev = Path::new("/fake/dev");
        assert_eq!(
            device_candidates(dev, "/dev/sdf", "vol-0123456789abcdef0"),
            [
                PathBuf::from("/fake/dev/sdf"),
                PathBuf::from("/fake/dev/xvdf"),
                PathBuf::from(
                    "/fake/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_vol0123456789abcdef0"
                ),
            ]
        );
        assert_eq!(
            device_candidates(dev, "/dev/xvdba", "vol-1"),
            [
                PathBuf::from("/fake/dev/xvdba"),
                PathBuf::from("/fake/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_vol1"),
            ]
        );
        // Not under /dev (or not plainly): used as it is, never rewritten.
        assert_eq!(
            device_candidates(dev, "/dev/../etc/x", "vol-1")[0],
            PathBuf::from("/dev/../etc/x")
        );
    }

    #[test]
    fn shared_stage_refusals_are_mount_device_errors_in_the_plugins_words() {
        let dev = PathBuf::from("/dev/loop7");
        let reason = |e| match stage_error(e, Path::new("/dev/xvdba"), Path::new("/s")) {
            Error::MountDevice {
                device,
                staging_dir,
                reason,
            } => {
                assert_eq!(
                    (device.as_path(), staging_dir.as_path()),
                    (Path::new("/dev/xvdba"), Path::new("/s"))
                );
                reason
            }
            other => panic!("{other:?}"),
        };
        assert_eq!(
            reason(mount_utils::Error::ReadOnlyBlank {
                device: dev.clone()
            }),
            "/dev/loop7 holds no filesystem and the volume is read-only: a read-only volume is never formatted"
        );
        assert_eq!(
            reason(mount_utils::Error::UnsupportedFilesystem {
                device: dev.clone(),
                found: "swap".into()
            }),
            "/dev/loop7 holds \"swap\", which this plugin does not mount (supported: ext2, ext3, ext4, xfs)"
        );
        assert_eq!(
            reason(mount_utils::Error::FsTypeMismatch {
                device: dev,
                found: FsType::Ext4,
                requested: FsType::Xfs
            }),
            "/dev/loop7 holds ext4, the volume spec asks for xfs (it is never reformatted)"
        );
        let other = stage_error(
            mount_utils::Error::MountInfo("x".into()),
            Path::new("/dev/xvdba"),
            Path::new("/s"),
        );
        assert!(
            matches!(other, Error::Mount(mount_utils::Error::MountInfo(_))),
            "{other:?}"
        );
    }

    #[tokio::test]
    async fn an_empty_device_path_or_a_bad_volume_is_refused_at_once() {
        let err = wait_for_attach("", "vol-1", Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::InvalidSpec(_)), "{err}");
        assert!(err.to_string().contains("devicePath"), "{err}");
        let err = wait_for_attach("/dev/xvdba", "disk-1", Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("volumeID"), "{err}");
    }

    #[tokio::test]
    async fn a_device_that_never_appears_is_a_timeout_naming_every_candidate() {
        let err = wait_for_attach(
            "/dev/sdzz-csi-rs-test",
            "vol-0123456789abcdef0",
            Duration::from_millis(50),
        )
        .await
        .unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, Error::Timeout { .. }), "{msg}");
        assert!(
            msg.contains("/dev/sdzz-csi-rs-test")
                && msg.contains("/dev/xvdzz-csi-rs-test")
                && msg.contains("nvme-Amazon_Elastic_Block_Store_vol0123456789abcdef0"),
            "{msg}"
        );
        let dir = tempfile::tempdir().unwrap();
        let err = mount_device(
            &dir.path().join("no-device"),
            &dir.path().join("staging"),
            "ext4",
            &[],
            false,
            Duration::from_millis(50),
        )
        .await
        .unwrap_err();
        assert!(matches!(err, Error::Timeout { .. }), "{err}");
        assert!(!dir.path().join("staging").exists());
    }

    #[tokio::test]
    async fn a_regular_file_is_not_a_device_and_unknown_fs_types_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("img");
        std::fs::write(&file, b"").unwrap();
        let staging = dir.path().join("staging");
        let err = mount_device(&file, &staging, "", &[], false, Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::MountDevice { .. }), "{err}");
        assert!(err.to_string().contains("not a block device"), "{err}");
        let err = mount_device(&file, &staging, "btrfs", &[], false, Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(
            matches!(err, Error::Mount(mount_utils::Error::UnsupportedFsType(_))),
            "{err}"
        );
        assert!(!staging.exists());
    }

    #[tokio::test]
    async fn unmounting_what_is_not_there_is_success() {
        let dir = tempfile::tempdir().unwrap();
        let staging = dir.path().join("staging");
        unmount_device(&staging).await.unwrap();
        std::fs::create_dir(&staging).unwrap();
        unmount_device(&staging).await.unwrap();
        assert!(!staging.exists());
        // Files beside the volume are not ours to delete.
        std::fs::create_dir(&staging).unwrap();
        std::fs::write(staging.join("keep"), b"x").unwrap();
        let err = unmount_device(&staging).await.unwrap_err();
        assert!(
            err.to_string().contains("remove staging directory"),
            "{err}"
        );
        assert!(staging.join("keep").exists());
    }
}
