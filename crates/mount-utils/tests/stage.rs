//! `stage::format_and_mount` against real block devices: loop devices over sparse files,
//! formatted, checked and mounted by the real tools. Needs root and /dev/loop-control
//! (`scripts/test` runs as root); loop devices and mounts are cleaned up by drop guards, also
//! when an assertion fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use mount_utils::stage::{self, Stage};
use mount_utils::{Error, FsType, blkid, cmd, findmnt};

/// mount(2) and the loop ioctls need it.
const CAP_SYS_ADMIN: u32 = 21;

const TOOLS: [&str; 7] = [
    "losetup",
    "blkid",
    "mkfs.ext4",
    "e2fsck",
    "mkswap",
    "mount",
    "umount",
];

/// Why these tests cannot run here, if they cannot.
fn missing_part() -> Option<String> {
    if !test_support::has_capability(CAP_SYS_ADMIN) {
        return Some("loop devices and mounts need CAP_SYS_ADMIN (root)".into());
    }
    if !Path::new("/dev/loop-control").exists() {
        return Some("no /dev/loop-control".into());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
    TOOLS
        .iter()
        .find(|tool| !dirs.iter().any(|d| d.join(tool).is_file()))
        .map(|tool| format!("{tool} is not on PATH"))
}

/// A loop device over a sparse file, and the directories it gets mounted at. On drop
/// (also when an assertion fails) everything mounted at those is taken down, lazily if busy,
/// then the loop device is detached.
struct Fixture {
    /// Holds the image and the targets; removed after `drop` has detached and unmounted.
    _dir: tempfile::TempDir,
    device: PathBuf,
    dev: (u32, u32),
    targets: Vec<PathBuf>,
}

impl Fixture {
    /// `None` (after [`test_support::skip_or_fail`]) when the machine lacks a part.
    fn new(targets: &[&str]) -> Option<Self> {
        if let Some(reason) = missing_part() {
            test_support::skip_or_fail(&reason);
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("volume.img");
        std::fs::File::create(&image)
            .and_then(|f| f.set_len(64 << 20))
            .unwrap();
        let out = Command::new("losetup")
            .arg("--find")
            .arg("--show")
            .arg(&image)
            .output()
            .unwrap();
        assert!(out.status.success(), "losetup: {out:?}");
        let device = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        let rdev = std::fs::metadata(&device).unwrap().rdev();
        let targets: Vec<PathBuf> = targets.iter().map(|t| dir.path().join(t)).collect();
        for t in &targets {
            std::fs::create_dir(t).unwrap();
        }
        Some(Self {
            _dir: dir,
            device,
            dev: (rustix::fs::major(rdev), rustix::fs::minor(rdev)),
            targets,
        })
    }

    fn target(&self, i: usize) -> &Path {
        &self.targets[i]
    }

    /// Stages the device at target `i` as the callers do: with the mount table as it is now.
    async fn stage(
        &self,
        i: usize,
        requested: Option<FsType>,
        read_only: bool,
        options: &[String],
    ) -> mount_utils::Result<FsType> {
        let table = findmnt::read().await.unwrap();
        stage::format_and_mount(&Stage {
            device: &self.device,
            dev: self.dev,
            target: self.target(i),
            requested,
            default_fs: FsType::Ext4,
            read_only,
            options,
            table: &table,
        })
        .await
    }

    /// A field of `blkid -p -o export` for the device; `None` when blank.
    async fn probe(&self, key: &str) -> Option<String> {
        let out = cmd::run(
            "blkid",
            [
                "-p".as_ref(),
                "-o".as_ref(),
                "export".as_ref(),
                self.device.as_os_str(),
            ],
        )
        .await
        .unwrap();
        blkid::parse_export(&out.stdout).remove(key)
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        for t in &self.targets {
            // A umount of something not mounted fails, which ends the loop.
            for _ in 0..8 {
                let unmounted = Command::new("umount")
                    .arg("-l")
                    .arg(t)
                    .stderr(Stdio::null())
                    .status();
                if !unmounted.is_ok_and(|s| s.success()) {
                    break;
                }
            }
        }
        let _ = Command::new("losetup").arg("-d").arg(&self.device).status();
    }
}

async fn mount_at(path: &Path) -> Option<findmnt::MountEntry> {
    let table = findmnt::read().await.unwrap();
    findmnt::mount_at(&table, path).cloned()
}

async fn unmount(path: &Path) {
    assert_eq!(mount_utils::mount::unmount(path).await.unwrap(), 1);
}

#[tokio::test]
async fn blank_is_formatted_once_then_checked_and_mounted_as_it_is() {
    let Some(fx) = Fixture::new(&["staging"]) else {
        return;
    };
    let target = fx.target(0);
    let device = fx.device.display().to_string();

    // Blank and read-only: refused, and nothing is written.
    let err = fx.stage(0, None, true, &[]).await.unwrap_err();
    assert!(
        matches!(&err, Error::ReadOnlyBlank { device } if device == &fx.device),
        "{err:?}"
    );
    assert!(err.to_string().contains(&device), "{err}");
    assert_eq!(fx.probe("TYPE").await, None, "still blank");
    assert!(mount_at(target).await.is_none());

    // Blank, no type requested: the default, mounted read-write.
    assert_eq!(fx.stage(0, None, false, &[]).await.unwrap(), FsType::Ext4);
    assert_eq!(fx.probe("TYPE").await.as_deref(), Some("ext4"));
    let uuid = fx.probe("UUID").await;
    assert!(uuid.is_some());
    let m = mount_at(target).await.expect("mounted");
    assert_eq!((m.fs_type.as_str(), m.read_only()), ("ext4", false));
    std::fs::write(target.join("data"), b"precious").unwrap();
    unmount(target).await;

    // Another type requested: refused naming the device and both types, never reformatted.
    let err = fx
        .stage(0, Some(FsType::Xfs), false, &[])
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::FsTypeMismatch {
                found: FsType::Ext4,
                requested: FsType::Xfs,
                ..
            }
        ),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains(&device) && msg.contains("ext4") && msg.contains("xfs"),
        "{msg}"
    );
    assert_eq!(fx.probe("UUID").await, uuid, "not reformatted");
    assert!(mount_at(target).await.is_none());

    // Read-only, with the caller's options: `ro` is added, the data is there.
    let fs = fx
        .stage(0, Some(FsType::Ext4), true, &["noatime".into()])
        .await;
    assert_eq!(fs.unwrap(), FsType::Ext4);
    let m = mount_at(target).await.unwrap();
    assert!(m.read_only(), "{:?}", m.options);
    assert!(m.options.iter().any(|o| o == "noatime"), "{:?}", m.options);
    assert_eq!(std::fs::read(target.join("data")).unwrap(), b"precious");
    assert_eq!(fx.probe("UUID").await, uuid);
}

/// Already mounted elsewhere: fsck would be unsafe, so it is skipped and the second mount
/// shares the filesystem.
#[tokio::test]
async fn a_device_mounted_elsewhere_is_mounted_again_without_a_check() {
    let Some(fx) = Fixture::new(&["first", "second"]) else {
        return;
    };
    fx.stage(0, Some(FsType::Ext4), false, &[]).await.unwrap();
    std::fs::write(fx.target(0).join("seen"), b"both").unwrap();
    assert_eq!(fx.stage(1, None, false, &[]).await.unwrap(), FsType::Ext4);
    assert_eq!(std::fs::read(fx.target(1).join("seen")).unwrap(), b"both");
    assert_eq!(mount_at(fx.target(1)).await.unwrap().dev(), fx.dev);
}

/// A filesystem blkid names but this crate does not mount (swap here): refused by name, the
/// device untouched.
#[tokio::test]
async fn an_unsupported_filesystem_is_refused_and_left_alone() {
    let Some(fx) = Fixture::new(&["staging"]) else {
        return;
    };
    let out = Command::new("mkswap").arg(&fx.device).output().unwrap();
    assert!(out.status.success(), "mkswap: {out:?}");
    let uuid = fx.probe("UUID").await;
    let err = fx.stage(0, None, false, &[]).await.unwrap_err();
    assert!(
        matches!(&err, Error::UnsupportedFilesystem { device, found } if device == &fx.device && found == "swap"),
        "{err:?}"
    );
    assert!(err.to_string().contains("\"swap\""), "{err}");
    assert_eq!(fx.probe("TYPE").await.as_deref(), Some("swap"));
    assert_eq!(fx.probe("UUID").await, uuid);
    assert!(mount_at(fx.target(0)).await.is_none());
}

/// `mounted_at` skips the mount table for a path that is no mount point, and agrees with it
/// for one that is: directories and single files, bound and unbound, and a directory inside a
/// mount.
#[tokio::test]
async fn mounted_at_asks_the_kernel_about_one_path_and_agrees_with_the_table() {
    let Some(fx) = Fixture::new(&["source", "target", "file-target"]) else {
        return;
    };
    let (source, target) = (fx.target(0), fx.target(1));
    std::fs::create_dir(source.join("inner")).unwrap();
    let file = source.join("file");
    std::fs::write(&file, b"x").unwrap();
    let file_target = fx.target(2).join("bound-file");
    std::fs::write(&file_target, b"").unwrap();
    // The fixture unmounts its directories; this one is a file inside one of them.
    struct Unbind(PathBuf);
    impl Drop for Unbind {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let _unbind = Unbind(file_target.clone());

    assert_eq!(findmnt::is_mount_point(target), Some(false));
    assert_eq!(
        findmnt::is_mount_point(&target.join("missing")),
        Some(false)
    );
    assert_eq!(findmnt::mounted_at(target).await.unwrap(), None);

    mount_utils::mount::bind(source, target, true)
        .await
        .unwrap();
    mount_utils::mount::bind(&file, &file_target, false)
        .await
        .unwrap();
    assert_eq!(findmnt::is_mount_point(target), Some(true));
    assert_eq!(findmnt::is_mount_point(&file_target), Some(true));
    assert_eq!(findmnt::is_mount_point(&target.join("inner")), Some(false));
    let entry = findmnt::mounted_at(target).await.unwrap().unwrap();
    assert_eq!(Some(&entry), mount_at(target).await.as_ref());
    assert!(entry.read_only(), "the read-only bind: {entry:?}");
    assert_eq!(
        findmnt::mounted_at(&file_target).await.unwrap(),
        mount_at(&file_target).await
    );

    unmount(&file_target).await;
    // Two binds stacked at one target: unmount takes both down and says so.
    mount_utils::mount::bind(source, target, false)
        .await
        .unwrap();
    assert_eq!(mount_utils::mount::unmount(target).await.unwrap(), 2);
    assert_eq!(findmnt::is_mount_point(target), Some(false));
    assert_eq!(findmnt::mounted_at(target).await.unwrap(), None);
    assert_eq!(mount_utils::mount::unmount(target).await.unwrap(), 0);
}
