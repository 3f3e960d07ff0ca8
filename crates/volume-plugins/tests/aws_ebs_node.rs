//! The in-tree aws-ebs plugin's node side against real block devices: loop devices over sparse
//! files, formatted, checked and mounted by the real tools. Needs root and /dev/loop-control
//! (`scripts/test` runs as root); loop devices and mounts are cleaned up by drop guards, also
//! when an assertion fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use mount_utils::findmnt;
use volume_plugins::Error;
use volume_plugins::aws_ebs::{
    aws_ebs_staging_path, mount_device, unmount_device, wait_for_attach,
};

const WAIT: Duration = Duration::from_secs(10);
const SIZE: u64 = 64 << 20;

/// Why these tests cannot run here, if they cannot.
fn skip_reason() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let euid = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(2))
        .unwrap_or("");
    if euid != "0" {
        return Some(format!("loop devices and mounts need root (euid {euid})"));
    }
    if !Path::new("/dev/loop-control").exists() {
        return Some("no /dev/loop-control".into());
    }
    ["losetup", "blkid", "mkfs.ext4", "e2fsck", "mount", "umount"]
        .into_iter()
        .find_map(skip_reason_for)
}

macro_rules! require_loop_devices {
    () => {
        if let Some(reason) = skip_reason() {
            test_support::skip_or_fail(&reason);
            return;
        }
    };
}

/// A loop device over a sparse file in `dir`; detached on drop.
struct LoopDevice {
    path: PathBuf,
}

impl LoopDevice {
    fn new(dir: &Path, name: &str) -> Self {
        Self::with_size(dir, name, SIZE)
    }

    fn with_size(dir: &Path, name: &str, size: u64) -> Self {
        let image = dir.join(format!("{name}.img"));
        std::fs::File::create(&image)
            .and_then(|f| f.set_len(size))
            .expect("sparse image");
        let out = Command::new("losetup")
            .args(["--find", "--show"])
            .arg(&image)
            .output()
            .expect("losetup");
        assert!(
            out.status.success(),
            "losetup --find --show: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        Self { path }
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.path).status();
    }
}

/// Unmounts whatever is stacked at a path on drop (lazily if busy).
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        for _ in 0..8 {
            if mounts_at(&self.0) == 0 {
                return;
            }
            let ok = Command::new("umount")
                .arg(&self.0)
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                let _ = Command::new("umount").arg("-l").arg(&self.0).status();
            }
        }
    }
}

fn mounts_at(path: &Path) -> usize {
    let bytes = std::fs::read("/proc/self/mountinfo").unwrap_or_default();
    findmnt::parse(&bytes).map_or(0, |t| findmnt::count_at(&t, path))
}

fn mount_at(path: &Path) -> Option<findmnt::MountEntry> {
    let bytes = std::fs::read("/proc/self/mountinfo").unwrap();
    let table = findmnt::parse(&bytes).unwrap();
    findmnt::mount_at(&table, path).cloned()
}

/// `blkid -p -s KEY -o value DEV`: "" when blank.
fn blkid(device: &Path, key: &str) -> String {
    let out = Command::new("blkid")
        .args(["-p", "-s", key, "-o", "value"])
        .arg(device)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn staging(root: &Path, volume: &str) -> PathBuf {
    aws_ebs_staging_path(root, &format!("aws://us-east-1a/{volume}"))
}

#[tokio::test]
async fn a_blank_device_is_formatted_once_and_never_again() {
    require_loop_devices!();
    let dir = tempfile::tempdir().unwrap();
    let dev = LoopDevice::new(dir.path(), "vol-0000000000000000a");
    let root = dir.path().join("kubelet");
    let staging = staging(&root, "vol-0000000000000000a");
    let _unmount = Unmount(staging.clone());
    assert_eq!(blkid(&dev.path, "TYPE"), "", "a new volume is blank");
    assert!(!staging.exists());

    mount_device(&dev.path, &staging, "ext4", &[], false, WAIT)
        .await
        .unwrap();
    assert_eq!(blkid(&dev.path, "TYPE"), "ext4");
    let uuid = blkid(&dev.path, "UUID");
    assert!(!uuid.is_empty());
    let m = mount_at(&staging).expect("mounted at the staging path");
    assert_eq!(m.fs_type, "ext4");
    assert!(!m.read_only());
    assert!(
        staging
            .ends_with("plugins/kubernetes.io/aws-ebs/mounts/aws/us-east-1a/vol-0000000000000000a")
    );

    // Repeated: a no-op (same filesystem, still one mount).
    mount_device(&dev.path, &staging, "ext4", &[], false, WAIT)
        .await
        .unwrap();
    assert_eq!(mounts_at(&staging), 1);
    assert_eq!(blkid(&dev.path, "UUID"), uuid);

    // Data survives unmount and mount: the filesystem is checked, never reformatted.
    std::fs::write(staging.join("data"), b"precious").unwrap();
    unmount_device(&staging).await.unwrap();
    assert_eq!(mounts_at(&staging), 0);
    assert!(!staging.exists(), "the staging directory is removed");
    unmount_device(&staging).await.unwrap();
    // No fs type in the spec: whatever the device holds.
    mount_device(&dev.path, &staging, "", &["noatime".into()], false, WAIT)
        .await
        .unwrap();
    assert_eq!(std::fs::read(staging.join("data")).unwrap(), b"precious");
    assert_eq!(blkid(&dev.path, "UUID"), uuid, "not reformatted");
    let m = mount_at(&staging).unwrap();
    assert!(m.options.iter().any(|o| o == "noatime"), "{:?}", m.options);
    // Asking for another filesystem than the device holds is refused, not a reformat.
    unmount_device(&staging).await.unwrap();
    let err = mount_device(&dev.path, &staging, "xfs", &[], false, WAIT)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::MountDevice { .. }), "{err}");
    assert!(
        err.to_string().contains("ext4") && err.to_string().contains("xfs"),
        "{err}"
    );
    assert_eq!(blkid(&dev.path, "UUID"), uuid);
    assert!(
        !staging.exists(),
        "a failed mount leaves no directory behind"
    );
}

#[tokio::test]
async fn read_only_mounts_and_a_blank_read_only_device_is_not_formatted() {
    require_loop_devices!();
    let dir = tempfile::tempdir().unwrap();
    let dev = LoopDevice::new(dir.path(), "vol-0000000000000000b");
    let root = dir.path().join("kubelet");
    let staging = staging(&root, "vol-0000000000000000b");
    let _unmount = Unmount(staging.clone());

    let err = mount_device(&dev.path, &staging, "ext4", &[], true, WAIT)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::MountDevice { .. }), "{err}");
    assert!(err.to_string().contains("read-only"), "{err}");
    assert_eq!(blkid(&dev.path, "TYPE"), "", "still blank");
    assert!(!staging.exists());

    // Format it read-write once, write, then mount it read-only.
    mount_device(&dev.path, &staging, "ext4", &[], false, WAIT)
        .await
        .unwrap();
    std::fs::write(staging.join("file"), b"x").unwrap();
    unmount_device(&staging).await.unwrap();
    mount_device(&dev.path, &staging, "ext4", &[], true, WAIT)
        .await
        .unwrap();
    let m = mount_at(&staging).unwrap();
    assert!(m.read_only(), "{:?}", m.options);
    assert_eq!(std::fs::read(staging.join("file")).unwrap(), b"x");
    let err = std::fs::write(staging.join("other"), b"y").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(30), "EROFS: {err}");
    unmount_device(&staging).await.unwrap();
    assert!(!staging.exists());
}

#[tokio::test]
async fn another_device_at_the_staging_path_is_an_error_naming_both() {
    require_loop_devices!();
    let dir = tempfile::tempdir().unwrap();
    let a = LoopDevice::new(dir.path(), "vol-0000000000000000c");
    let b = LoopDevice::new(dir.path(), "vol-0000000000000000d");
    let staging = dir.path().join("staging");
    let _unmount = Unmount(staging.clone());
    mount_device(&a.path, &staging, "ext4", &[], false, WAIT)
        .await
        .unwrap();
    let err = mount_device(&b.path, &staging, "ext4", &[], false, WAIT)
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::MountDevice { .. }), "{msg}");
    assert!(
        msg.contains(&a.path.display().to_string()) && msg.contains(&b.path.display().to_string()),
        "{msg}"
    );
    assert_eq!(
        blkid(&b.path, "TYPE"),
        "",
        "the other device is not touched"
    );
    assert_eq!(mounts_at(&staging), 1);
    unmount_device(&staging).await.unwrap();
}

/// xfs: formatted when blank, mounted again as it is (the kernel checks it, no fsck).
#[tokio::test]
async fn xfs_is_formatted_and_mounted_again_as_it_is() {
    require_loop_devices!();
    if skip_reason_for("mkfs.xfs").is_some() {
        test_support::skip_or_fail("mkfs.xfs is not on PATH");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Current xfsprogs refuse filesystems under 300 MiB.
    let dev = LoopDevice::with_size(dir.path(), "vol-00000000000000010", 320 << 20);
    let staging = dir.path().join("staging");
    let _unmount = Unmount(staging.clone());
    mount_device(&dev.path, &staging, "xfs", &[], false, WAIT)
        .await
        .unwrap();
    assert_eq!(blkid(&dev.path, "TYPE"), "xfs");
    let uuid = blkid(&dev.path, "UUID");
    std::fs::write(staging.join("data"), b"xfs data").unwrap();
    unmount_device(&staging).await.unwrap();
    mount_device(&dev.path, &staging, "XFS", &[], false, WAIT)
        .await
        .unwrap();
    assert_eq!(mount_at(&staging).unwrap().fs_type, "xfs");
    assert_eq!(std::fs::read(staging.join("data")).unwrap(), b"xfs data");
    assert_eq!(blkid(&dev.path, "UUID"), uuid, "not reformatted");
    unmount_device(&staging).await.unwrap();
}

fn skip_reason_for(tool: &str) -> Option<String> {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success());
    (!found).then(|| format!("{tool} is not on PATH"))
}

/// blkid sees nothing, but the device is not all zeros (a damaged filesystem, say): it is not
/// formatted, and the bytes stay.
#[tokio::test]
async fn a_device_with_data_blkid_cannot_name_is_never_formatted() {
    require_loop_devices!();
    let dir = tempfile::tempdir().unwrap();
    let dev = LoopDevice::new(dir.path(), "vol-0000000000000000e");
    {
        use std::io::{Seek, SeekFrom, Write};
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(&dev.path)
            .unwrap();
        f.seek(SeekFrom::Start(300_000)).unwrap();
        f.write_all(b"important bytes").unwrap();
        f.sync_all().unwrap();
    }
    assert_eq!(blkid(&dev.path, "TYPE"), "");
    let staging = dir.path().join("staging");
    let _unmount = Unmount(staging.clone());
    let err = mount_device(&dev.path, &staging, "ext4", &[], false, WAIT)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Mount(mount_utils::Error::UnsupportedContent { .. })
        ),
        "{err}"
    );
    assert_eq!(mounts_at(&staging), 0);
    let bytes = std::fs::read(&dev.path).unwrap();
    assert_eq!(&bytes[300_000..300_015], b"important bytes");
}

/// The device shows up a while after the attach: the mount waits for it; the kubelet's
/// WaitForAttach finds it by its path.
#[tokio::test]
async fn a_device_that_appears_late_is_waited_for() {
    require_loop_devices!();
    let dir = tempfile::tempdir().unwrap();
    let dev = LoopDevice::new(dir.path(), "vol-0000000000000000f");
    let link = dir.path().join("xvdba");
    let staging = dir.path().join("staging");
    let _unmount = Unmount(staging.clone());
    let target = dev.path.clone();
    let later = link.clone();
    let appear = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(400)).await;
        std::os::unix::fs::symlink(&target, &later).unwrap();
    });
    mount_device(&link, &staging, "ext4", &[], false, WAIT)
        .await
        .unwrap();
    appear.await.unwrap();
    assert_eq!(blkid(&dev.path, "TYPE"), "ext4");
    // Through the link or the device itself: the same device, so already done.
    mount_device(&dev.path, &staging, "ext4", &[], false, WAIT)
        .await
        .unwrap();
    assert_eq!(mounts_at(&staging), 1);
    let found = wait_for_attach(
        &dev.path.display().to_string(),
        "aws://us-east-1a/vol-0000000000000000f",
        WAIT,
    )
    .await
    .unwrap();
    assert_eq!(found, dev.path);
    unmount_device(&staging).await.unwrap();
    assert!(!staging.exists());
}
