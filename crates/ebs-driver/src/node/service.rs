//! The node service (the EBS driver design, docs/design/ebs-driver.md, "Node Service RPC"): stage,
//! publish, unpublish, unstage, stats and expand, each idempotent: it looks at the world first
//! (mountinfo, blkid, the device) and succeeds without doing anything when the work is already
//! done.
//!
//! Every mutating operation holds its volume's lock and runs in its own task: when a CO gives up
//! waiting (its gRPC deadline), the mkfs or mount it started still finishes under the lock, a
//! retry meanwhile gets "operation in flight", and the retry after that finds the work done.

use std::future::Future;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tracing::Instrument;

use mount_utils::findmnt::{self, MountEntry};
use mount_utils::stage::{self, Stage};
use mount_utils::stats::{self, VolumeStats};
use mount_utils::{FsType, mount, resize};

use super::device::{self, DeviceFinder, FoundDevice};
use super::locks::VolumeLocks;
use super::requests::{
    AccessType, ExpandRequest, NodeConfig, PublishRequest, StageRequest, UnpublishRequest,
    UnstageRequest,
};
use crate::{Error, Result};

/// The node service. Cheap to clone; clones share the volume locks.
#[derive(Debug, Clone)]
pub struct NodeService {
    inner: Arc<Inner>,
    locks: VolumeLocks,
}

#[derive(Debug)]
struct Inner {
    finder: DeviceFinder,
    sys_root: PathBuf,
    default_fs: FsType,
}

impl NodeService {
    /// Fails only on an unsupported `default_fs_type`.
    pub fn new(config: NodeConfig) -> Result<Self> {
        let default_fs: FsType = config.default_fs_type.parse()?;
        Ok(Self {
            inner: Arc::new(Inner {
                finder: DeviceFinder {
                    dev_root: config.dev_root,
                    sys_root: config.sys_root.clone(),
                    wait: config.device_wait,
                    poll: config.device_poll,
                },
                sys_root: config.sys_root,
                default_fs,
            }),
            locks: VolumeLocks::default(),
        })
    }

    /// Finds and verifies the device, formats it if (and only if) it is blank, checks it if it
    /// was formatted before, and mounts it at the staging path. Raw block volumes are only
    /// found and verified: they are bound straight to their target at publish.
    pub async fn stage(&self, req: StageRequest) -> Result<()> {
        device::validate_volume_id(&req.volume_id)?;
        require_absolute("staging_target_path", &req.staging_path)?;
        let requested = match &req.access {
            AccessType::Mount { fs_type, .. } if !fs_type.is_empty() => Some(fs_type.parse()?),
            _ => None,
        };
        let volume_id = req.volume_id.clone();
        self.locked(&volume_id, "stage", move |inner| async move {
            inner.stage(req, requested).await
        })
        .await
    }

    /// Unmounts the staging path; success if nothing is mounted there. The staging directory
    /// itself belongs to the CO and stays.
    pub async fn unstage(&self, req: UnstageRequest) -> Result<()> {
        device::validate_volume_id(&req.volume_id)?;
        require_absolute("staging_target_path", &req.staging_path)?;
        let volume_id = req.volume_id.clone();
        self.locked(&volume_id, "unstage", move |_| async move {
            let n = mount::unmount(&req.staging_path).await?;
            tracing::info!(staging = %req.staging_path.display(), unmounted = n, "unstaged");
            Ok(())
        })
        .await
    }

    /// Bind-mounts the staged filesystem (or, for raw block, the device) at the target.
    pub async fn publish(&self, req: PublishRequest) -> Result<()> {
        device::validate_volume_id(&req.volume_id)?;
        require_absolute("staging_target_path", &req.staging_path)?;
        require_absolute("target_path", &req.target_path)?;
        let volume_id = req.volume_id.clone();
        self.locked(&volume_id, "publish", move |inner| async move {
            match req.access {
                AccessType::Mount { .. } => inner.publish_mount(&req).await,
                AccessType::Block => inner.publish_block(&req).await,
            }
        })
        .await
    }

    /// Unmounts the target and removes it (the directory or file publish created); success if it
    /// is already gone.
    pub async fn unpublish(&self, req: UnpublishRequest) -> Result<()> {
        device::validate_volume_id(&req.volume_id)?;
        require_absolute("target_path", &req.target_path)?;
        let volume_id = req.volume_id.clone();
        self.locked(&volume_id, "unpublish", move |_| async move {
            let target = &req.target_path;
            let n = mount::unmount(target).await?;
            remove_target(target).await?;
            tracing::info!(target = %target.display(), unmounted = n, "unpublished");
            Ok(())
        })
        .await
    }

    /// Capacity and usage of the volume mounted (or block-published) at `volume_path`. Read-only,
    /// so it takes no lock.
    pub async fn volume_stats(&self, volume_id: &str, volume_path: &Path) -> Result<VolumeStats> {
        device::validate_volume_id(volume_id)?;
        require_volume_path(volume_path)?;
        let meta = match tokio::fs::metadata(volume_path).await {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::PathNotFound {
                    what: "volume path",
                    path: volume_path.into(),
                });
            }
            Err(e) => return Err(Error::io("stat", volume_path, e)),
        };
        let m = findmnt::mounted_at(volume_path)
            .await?
            .ok_or_else(|| Error::NotMounted(volume_path.to_path_buf()))?;
        let block = meta.file_type().is_block_device();
        let dev = if block {
            split_dev(meta.rdev())
        } else {
            m.dev()
        };
        check_owner(&self.inner.sys_root, dev, volume_id, volume_path)?;
        if block {
            let size = stats::block_device_size(&self.inner.sys_root, dev)?;
            return Ok(VolumeStats::Block { size_bytes: size });
        }
        let path = volume_path.to_path_buf();
        let stats = tokio::task::spawn_blocking(move || stats::filesystem(&path))
            .await
            .map_err(|e| Error::Internal(format!("statvfs task: {e}")))??;
        Ok(stats)
    }

    /// Grows the filesystem mounted at `volume_path` to its device's size (the controller has
    /// already grown the device). Returns the device size in bytes. Raw block volumes need no
    /// work: their size is the device's.
    pub async fn expand(&self, req: ExpandRequest) -> Result<u64> {
        device::validate_volume_id(&req.volume_id)?;
        require_volume_path(&req.volume_path)?;
        let volume_id = req.volume_id.clone();
        self.locked(&volume_id, "expand", move |inner| async move {
            inner.expand(req).await
        })
        .await
    }

    /// Runs `op` for `volume_id` under its lock, in a task of its own so that it completes even
    /// if the caller stops waiting.
    async fn locked<F, Fut, T>(&self, volume_id: &str, op: &'static str, f: F) -> Result<T>
    where
        F: FnOnce(Arc<Inner>) -> Fut,
        Fut: Future<Output = Result<T>> + Send + 'static,
        T: Send + 'static,
    {
        let guard = self.locks.try_lock(volume_id)?;
        let span = tracing::info_span!("node", op, volume_id);
        let fut = f(Arc::clone(&self.inner));
        let task = tokio::spawn(
            async move {
                let result = fut.await;
                drop(guard);
                if let Err(e) = &result {
                    tracing::warn!(error = %e, "failed");
                }
                result
            }
            .instrument(span),
        );
        task.await
            .map_err(|e| Error::Internal(format!("{op} task for {volume_id}: {e}")))?
    }
}

impl Inner {
    async fn stage(&self, req: StageRequest, requested: Option<FsType>) -> Result<()> {
        let device = self
            .finder
            .find(&req.volume_id, req.device_path.as_deref())
            .await?;
        let AccessType::Mount { mount_flags, .. } = &req.access else {
            tracing::info!(device = %device.path.display(), "raw block volume: device verified, nothing to mount");
            return Ok(());
        };
        let staging = &req.staging_path;
        let table = findmnt::read().await?;
        if let Some(m) = findmnt::mount_at(&table, staging) {
            return already_staged(m, &device, requested, &req);
        }
        tokio::fs::create_dir_all(staging)
            .await
            .map_err(|e| Error::io("create staging directory", staging, e))?;

        let fs = stage::format_and_mount(&Stage {
            device: &device.path,
            dev: device.dev,
            target: staging,
            requested,
            default_fs: self.default_fs,
            // CSI stages read-write; read-only is per publish (a read-only bind).
            read_only: false,
            options: mount_flags,
            table: &table,
        })
        .await
        .map_err(stage_error)?;
        tracing::info!(device = %device.path.display(), via = %device.via.display(), staging = %staging.display(), %fs, "staged");
        Ok(())
    }

    async fn publish_mount(&self, req: &PublishRequest) -> Result<()> {
        let table = findmnt::read().await?;
        let staged = findmnt::mount_at(&table, &req.staging_path)
            .ok_or_else(|| Error::NotStaged(req.staging_path.clone()))?;
        let target = &req.target_path;
        if let Some(m) = findmnt::mount_at(&table, target) {
            if m.dev() != staged.dev() || m.root != staged.root {
                return Err(Error::PublishedIncompatible {
                    path: target.clone(),
                    reason: format!(
                        "{} ({}) is mounted there, not the staged volume",
                        m.source, m.fs_type
                    ),
                });
            }
            return same_mode(target, m.read_only(), req.read_only);
        }
        tokio::fs::create_dir_all(target)
            .await
            .map_err(|e| Error::io("create target directory", target, e))?;
        mount::bind(&req.staging_path, target, req.read_only).await?;
        tracing::info!(target = %target.display(), read_only = req.read_only, "published");
        Ok(())
    }

    async fn publish_block(&self, req: &PublishRequest) -> Result<()> {
        let device = self
            .finder
            .find(&req.volume_id, req.device_path.as_deref())
            .await?;
        let target = &req.target_path;
        if let Some(m) = findmnt::mounted_at(target).await? {
            let rdev = tokio::fs::metadata(target)
                .await
                .map_err(|e| Error::io("stat", target, e))?
                .rdev();
            if split_dev(rdev) != device.dev {
                return Err(Error::PublishedIncompatible {
                    path: target.clone(),
                    reason: format!(
                        "another device ({}) is bound there, not {}",
                        m.source,
                        device.path.display()
                    ),
                });
            }
            return same_mode(target, m.read_only(), req.read_only);
        }
        if let Some(parent) = target.parent() {
            tokio::fs::create_dir_all(parent)
                .await
                .map_err(|e| Error::io("create target parent directory", parent, e))?;
        }
        match tokio::fs::symlink_metadata(target).await {
            Ok(m) if m.is_file() => {}
            Ok(_) => {
                return Err(Error::invalid(
                    "target_path",
                    format!(
                        "{} exists and is not a regular file; a block volume is published onto a file",
                        target.display()
                    ),
                ));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                tokio::fs::File::create(target)
                    .await
                    .map_err(|e| Error::io("create target file", target, e))?;
            }
            Err(e) => return Err(Error::io("stat", target, e)),
        }
        mount::bind(&device.path, target, req.read_only).await?;
        tracing::info!(device = %device.path.display(), target = %target.display(), read_only = req.read_only, "published raw block");
        Ok(())
    }

    async fn expand(&self, req: ExpandRequest) -> Result<u64> {
        let path = &req.volume_path;
        let meta = match tokio::fs::metadata(path).await {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::PathNotFound {
                    what: "volume path",
                    path: path.clone(),
                });
            }
            Err(e) => return Err(Error::io("stat", path, e)),
        };
        let m = findmnt::mounted_at(path)
            .await?
            .ok_or_else(|| Error::NotMounted(path.clone()))?;
        if meta.file_type().is_block_device() {
            let dev = split_dev(meta.rdev());
            check_owner(&self.sys_root, dev, &req.volume_id, path)?;
            let size = stats::block_device_size(&self.sys_root, dev)?;
            return check_size(Path::new(&m.source), size, req.required_bytes);
        }
        check_owner(&self.sys_root, m.dev(), &req.volume_id, path)?;
        let fs: FsType = m.fs_type.parse()?;
        let device = PathBuf::from(&m.source);
        let size = stats::block_device_size(&self.sys_root, m.dev())?;
        check_size(&device, size, req.required_bytes)?;
        // The mount source must be the very device mountinfo names by number, or resize2fs
        // could be pointed at something else.
        let dev_meta = tokio::fs::metadata(&device)
            .await
            .map_err(|e| Error::io("stat mounted device", &device, e))?;
        if !dev_meta.file_type().is_block_device() || split_dev(dev_meta.rdev()) != m.dev() {
            return Err(Error::BadDevice {
                path: device,
                volume_id: req.volume_id.clone(),
                reason: format!(
                    "it is not the device {}:{} mounted at {}",
                    m.major,
                    m.minor,
                    path.display()
                ),
            });
        }
        resize::grow(&device, path, fs).await?;
        Ok(size)
    }
}

/// The driver's wording (and, through it, CSI code) for the shared stage step's refusals, as
/// they were before that step moved into mount-utils.
fn stage_error(e: mount_utils::Error) -> Error {
    match e {
        mount_utils::Error::FsTypeMismatch {
            device,
            found,
            requested,
        } => Error::FsTypeMismatch {
            device,
            found: found.to_string(),
            requested: requested.to_string(),
        },
        mount_utils::Error::UnsupportedFilesystem { device, found } => {
            mount_utils::Error::UnsupportedContent {
                device,
                details: format!("it holds {found:?}, which this driver does not mount"),
            }
            .into()
        }
        other => other.into(),
    }
}

fn already_staged(
    m: &MountEntry,
    device: &FoundDevice,
    requested: Option<FsType>,
    req: &StageRequest,
) -> Result<()> {
    if m.dev() != device.dev {
        return Err(Error::StagedWithOtherDevice {
            path: req.staging_path.clone(),
            mounted: m.source.clone(),
            device: device.path.clone(),
            volume_id: req.volume_id.clone(),
        });
    }
    if let Some(r) = requested.filter(|r| r.as_str() != m.fs_type) {
        // CSI: staged already, but incompatibly with this request's capability.
        return Err(Error::PublishedIncompatible {
            path: req.staging_path.clone(),
            reason: format!(
                "{} is staged there with {}, the request asks for {r}",
                device.path.display(),
                m.fs_type
            ),
        });
    }
    tracing::info!(staging = %req.staging_path.display(), "already staged");
    Ok(())
}

fn same_mode(target: &Path, mounted_ro: bool, want_ro: bool) -> Result<()> {
    if mounted_ro == want_ro {
        tracing::info!(target = %target.display(), "already published");
        Ok(())
    } else {
        Err(Error::PublishedIncompatible {
            path: target.to_path_buf(),
            reason: format!(
                "it is published {}, the request asks for {}",
                if mounted_ro {
                    "read-only"
                } else {
                    "read-write"
                },
                if want_ro { "read-only" } else { "read-write" }
            ),
        })
    }
}

fn check_size(device: &Path, actual: u64, required: Option<u64>) -> Result<u64> {
    match required {
        Some(required) if actual < required => Err(Error::DeviceTooSmall {
            device: device.to_path_buf(),
            actual,
            required,
        }),
        _ => Ok(actual),
    }
}

/// Removes what publish created at `target`: an empty directory or a (now unbound) file.
async fn remove_target(target: &Path) -> Result<()> {
    let meta = match tokio::fs::symlink_metadata(target).await {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io("stat", target, e)),
    };
    // remove_dir, not remove_dir_all: a non-empty directory after the unmount holds data that
    // was written beside the volume, and is not ours to delete.
    let result = if meta.is_dir() {
        tokio::fs::remove_dir(target).await
    } else {
        tokio::fs::remove_file(target).await
    };
    match result {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io("remove target", target, e)),
    }
}

fn require_absolute(field: &'static str, path: &Path) -> Result<()> {
    if path.as_os_str().is_empty() {
        return Err(Error::invalid(field, "is required"));
    }
    if !path.is_absolute() {
        return Err(Error::invalid(
            field,
            format!("{} is not an absolute path", path.display()),
        ));
    }
    Ok(())
}

/// A path the RPC only reads (NodeGetVolumeStats, NodeExpandVolume): a relative one cannot be
/// where a volume was staged or published (those are absolute), so it names no volume: CSI's
/// NOT_FOUND, as for any other path that holds none.
fn require_volume_path(path: &Path) -> Result<()> {
    if path.as_os_str().is_empty() {
        return Err(Error::invalid("volume_path", "is required"));
    }
    if !path.is_absolute() {
        return Err(Error::PathNotFound {
            what: "volume_path (not an absolute path)",
            path: path.to_path_buf(),
        });
    }
    Ok(())
}

/// The device mounted at `path` must not belong to another volume than `volume_id` (when the
/// kernel can tell whose it is): stats or a resize of the wrong volume would be reported as
/// this one's.
fn check_owner(sys_root: &Path, dev: (u32, u32), volume_id: &str, path: &Path) -> Result<()> {
    match device::owner_of(sys_root, dev) {
        Some(actual) if actual != volume_id => Err(Error::OtherVolumeAtPath {
            volume_id: volume_id.to_string(),
            path: path.to_path_buf(),
            actual,
        }),
        _ => Ok(()),
    }
}

fn split_dev(rdev: u64) -> (u32, u32) {
    (rustix::fs::major(rdev), rustix::fs::minor(rdev))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service() -> NodeService {
        NodeService::new(NodeConfig::default()).unwrap()
    }

    #[test]
    fn unsupported_default_fs_is_refused() {
        let cfg = NodeConfig {
            default_fs_type: "zfs".into(),
            ..NodeConfig::default()
        };
        assert!(matches!(
            NodeService::new(cfg),
            Err(Error::Mount(mount_utils::Error::UnsupportedFsType(_)))
        ));
    }

    #[tokio::test]
    async fn bad_fields_are_named() {
        let s = service();
        let err = s
            .stage(StageRequest {
                volume_id: "vol-0123456789abcdef0".into(),
                device_path: None,
                staging_path: "relative/path".into(),
                access: AccessType::Block,
            })
            .await
            .unwrap_err();
        assert!(err.to_string().contains("staging_target_path"), "{err}");
        let err = s
            .unpublish(UnpublishRequest {
                volume_id: "bogus".into(),
                target_path: "/x".into(),
            })
            .await
            .unwrap_err();
        assert!(err.to_string().contains("volume_id"), "{err}");
        let err = s
            .stage(StageRequest {
                volume_id: "vol-0123456789abcdef0".into(),
                device_path: None,
                staging_path: "/s".into(),
                access: AccessType::Mount {
                    fs_type: "ntfs".into(),
                    mount_flags: vec![],
                },
            })
            .await
            .unwrap_err();
        assert!(
            matches!(err, Error::Mount(mount_utils::Error::UnsupportedFsType(_))),
            "{err}"
        );
    }

    #[tokio::test]
    async fn stats_of_missing_path_is_not_found() {
        let err = service()
            .volume_stats("vol-0123456789abcdef0", Path::new("/nonexistent/volume"))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::PathNotFound { .. }), "{err}");
    }

    #[tokio::test]
    async fn stats_of_unmounted_directory_is_not_mounted() {
        let dir = tempfile::tempdir().unwrap();
        let err = service()
            .volume_stats("vol-0123456789abcdef0", dir.path())
            .await
            .unwrap_err();
        assert!(matches!(err, Error::NotMounted(_)), "{err}");
    }

    #[tokio::test]
    async fn unpublish_of_missing_target_succeeds() {
        let dir = tempfile::tempdir().unwrap();
        let req = UnpublishRequest {
            volume_id: "vol-0123456789abcdef0".into(),
            target_path: dir.path().join("never-published"),
        };
        service().unpublish(req.clone()).await.unwrap();
        service().unpublish(req).await.unwrap();
    }

    #[test]
    fn shared_stage_refusals_keep_the_drivers_errors() {
        let err = stage_error(mount_utils::Error::FsTypeMismatch {
            device: "/dev/xvdba".into(),
            found: FsType::Ext4,
            requested: FsType::Xfs,
        });
        assert!(
            matches!(&err, Error::FsTypeMismatch { found, requested, .. } if found == "ext4" && requested == "xfs"),
            "{err:?}"
        );
        let err = stage_error(mount_utils::Error::UnsupportedFilesystem {
            device: "/dev/xvdba".into(),
            found: "swap".into(),
        });
        match err {
            Error::Mount(mount_utils::Error::UnsupportedContent { device, details }) => {
                assert_eq!(device, PathBuf::from("/dev/xvdba"));
                assert_eq!(
                    details,
                    "it holds \"swap\", which this driver does not mount"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn mode_mismatch_is_incompatible() {
        same_mode(Path::new("/t"), true, true).unwrap();
        let err = same_mode(Path::new("/t"), false, true).unwrap_err();
        assert!(err.to_string().contains("read-write"), "{err}");
    }
}
