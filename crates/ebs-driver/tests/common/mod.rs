//! Real parts for the node tests: sparse images named like ec2-sim's volumes, attached as loop
//! devices, a fake device root with the links an attach creates, and a guard that unmounts and
//! detaches everything on drop, also when a test fails.

// Test support: a failed setup step should fail the test loudly, so unwrap is the right tool.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::Command;
use std::task::{Context, Waker};
use std::time::Duration;

use ebs_driver::{
    AccessType, NodeConfig, NodeService, PublishRequest, StageRequest, UnpublishRequest,
    UnstageRequest,
};

pub const VOL_A: &str = "vol-0123456789abcdef0";
pub const VOL_B: &str = "vol-0fedcba9876543210";
pub const MIB: u64 = 1024 * 1024;

pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub dev_root: PathBuf,
    loops: Vec<PathBuf>,
}

/// Why the real-device tests cannot run here, if they cannot.
pub fn missing_parts() -> Option<String> {
    if !rustix::process::geteuid().is_root() {
        return Some("not running as root".into());
    }
    if !Path::new("/dev/loop-control").exists() {
        return Some("no /dev/loop-control".into());
    }
    for tool in [
        "losetup",
        "blkid",
        "mkfs.ext4",
        "mkfs.xfs",
        "e2fsck",
        "mount",
        "umount",
    ] {
        if !on_path(tool) {
            return Some(format!("{tool} is not on PATH"));
        }
    }
    None
}

/// `let Some(fx) = fixture!() else { return };` skips (with the reason printed) where loop
/// devices cannot be had.
#[macro_export]
macro_rules! fixture {
    () => {
        match common::missing_parts() {
            Some(why) => {
                test_support::skip_or_fail(&format!("{why}; this test needs real loop devices"));
                None
            }
            None => Some(common::Fixture::new()),
        }
    };
}

/// Online ext4 resize needs CAP_SYS_RESOURCE (bit 24 of the effective set).
pub fn has_cap_sys_resource() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << 24) != 0)
}

pub fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).exists()))
        .unwrap_or(false)
}

pub fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(program).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl Fixture {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let dev_root = dir.path().join("dev");
        std::fs::create_dir_all(dev_root.join("disk/by-id")).unwrap();
        std::fs::create_dir_all(dir.path().join("volumes")).unwrap();
        Self {
            dir,
            dev_root,
            loops: Vec::new(),
        }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    pub fn image(&self, volume_id: &str) -> PathBuf {
        self.path(&format!("volumes/{volume_id}.img"))
    }

    /// A sparse image `<volume_id>.img` attached as a loop device; no links yet.
    pub fn attach(&mut self, volume_id: &str, size: u64) -> PathBuf {
        let image = self.image(volume_id);
        let f = std::fs::File::create(&image).unwrap();
        f.set_len(size).unwrap();
        drop(f);
        let dev = run("losetup", &["--find", "--show", image.to_str().unwrap()]);
        let dev = PathBuf::from(dev.trim());
        self.loops.push(dev.clone());
        dev
    }

    /// The Nitro-style link ec2-sim creates: `disk/by-id/nvme-Amazon_Elastic_Block_Store_volXXX`.
    pub fn link_by_id(&self, volume_id: &str, device: &Path) {
        let name = format!(
            "disk/by-id/nvme-Amazon_Elastic_Block_Store_{}",
            volume_id.replace('-', "")
        );
        self.link(&name, device);
    }

    /// A link `DEVROOT/<name>` -> device (replacing an old one, as udev would).
    pub fn link(&self, name: &str, device: &Path) {
        let link = self.dev_root.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(device, &link).unwrap();
    }

    /// A volume attached and linked both ways (`/dev/xvdba` and by-id).
    pub fn attach_linked(&mut self, volume_id: &str, size: u64, name: &str) -> PathBuf {
        let dev = self.attach(volume_id, size);
        self.link_by_id(volume_id, &dev);
        self.link(name, &dev);
        dev
    }

    pub fn config(&self) -> NodeConfig {
        NodeConfig {
            dev_root: self.dev_root.clone(),
            device_wait: Duration::from_millis(600),
            device_poll: Duration::from_millis(50),
            ..NodeConfig::default()
        }
    }

    pub fn service(&self) -> NodeService {
        NodeService::new(self.config()).unwrap()
    }

    /// Grows the image and tells the loop driver (what a ModifyVolume does to a real disk).
    pub fn grow(&self, volume_id: &str, device: &Path, size: u64) {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(self.image(volume_id))
            .unwrap();
        f.set_len(size).unwrap();
        drop(f);
        run("losetup", &["-c", device.to_str().unwrap()]);
    }

    /// Mount points inside this fixture's directory, innermost last.
    pub fn mounts(&self) -> Vec<(PathBuf, String)> {
        let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let root = std::fs::canonicalize(self.dir.path()).unwrap();
        text.lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                let mp = PathBuf::from(f.get(4)?.replace("\\040", " "));
                mp.starts_with(&root)
                    .then(|| (mp, f.get(5).unwrap_or(&"").to_string()))
            })
            .collect()
    }

    pub fn mounted(&self, path: &Path) -> Option<String> {
        let path = std::fs::canonicalize(path).ok()?;
        self.mounts()
            .into_iter()
            .rev()
            .find(|(mp, _)| *mp == path)
            .map(|(_, opts)| opts)
    }
}

/// Starts a [`NodeService`] call and polls it exactly once. Everything the call does before its
/// first await point has then happened: the service takes the volume's lock there and hands the
/// work to a task of its own, which runs on whether or not the returned future is polled. So
/// once this returns, the call is observably in progress (another call for the volume is
/// refused as in flight), with no sleep to guess how long that takes.
pub fn started<F: Future>(call: F) -> Pin<Box<F>> {
    let mut call = Box::pin(call);
    let mut cx = Context::from_waker(Waker::noop());
    assert!(
        call.as_mut().poll(&mut cx).is_pending(),
        "the call finished before it could be observed in progress"
    );
    call
}

pub fn blkid_type(device: &Path) -> Option<String> {
    let out = Command::new("blkid")
        .args(["-p", "-o", "value", "-s", "TYPE"])
        .arg(device)
        .output()
        .unwrap();
    let s = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (!s.is_empty()).then_some(s)
}

pub fn rdev(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().rdev()
}

impl Drop for Fixture {
    fn drop(&mut self) {
        // Unmount innermost first; fall back to a lazy unmount so that one busy mount cannot
        // keep the loop devices attached.
        for _ in 0..8 {
            let mounts = self.mounts();
            if mounts.is_empty() {
                break;
            }
            for (mp, _) in mounts.iter().rev() {
                let ok = Command::new("umount")
                    .arg(mp)
                    .status()
                    .is_ok_and(|s| s.success());
                if !ok {
                    let _ = Command::new("umount").arg("-l").arg(mp).status();
                }
            }
        }
        for dev in self.loops.drain(..).rev() {
            let _ = Command::new("losetup").arg("-d").arg(&dev).status();
        }
        // Loop devices someone else (ec2-sim) made from images in this directory.
        let root = std::fs::canonicalize(self.dir.path()).unwrap_or_default();
        if let Ok(out) = Command::new("losetup")
            .args(["-l", "-n", "-O", "NAME,BACK-FILE"])
            .output()
        {
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                let Some((dev, back)) = line.trim().split_once(char::is_whitespace) else {
                    continue;
                };
                if Path::new(back.trim()).starts_with(&root) {
                    let _ = Command::new("losetup").arg("-d").arg(dev).status();
                }
            }
        }
    }
}

// Requests for VOL_A, as kubelet would send them for `/dev/xvdba`.

pub fn mount_access(fs: &str) -> AccessType {
    AccessType::Mount {
        fs_type: fs.into(),
        mount_flags: vec![],
    }
}

pub fn stage_req(
    volume_id: &str,
    device_path: &str,
    staging: &Path,
    access: AccessType,
) -> StageRequest {
    StageRequest {
        volume_id: volume_id.into(),
        device_path: Some(device_path.into()),
        staging_path: staging.to_path_buf(),
        access,
    }
}

pub fn publish_req(
    staging: &Path,
    target: &Path,
    access: AccessType,
    read_only: bool,
) -> PublishRequest {
    PublishRequest {
        volume_id: VOL_A.into(),
        device_path: Some("/dev/xvdba".into()),
        staging_path: staging.to_path_buf(),
        target_path: target.to_path_buf(),
        access,
        read_only,
    }
}

pub fn unstage_req(staging: &Path) -> UnstageRequest {
    UnstageRequest {
        volume_id: VOL_A.into(),
        staging_path: staging.to_path_buf(),
    }
}

pub fn unpublish_req(target: &Path) -> UnpublishRequest {
    UnpublishRequest {
        volume_id: VOL_A.into(),
        target_path: target.to_path_buf(),
    }
}
