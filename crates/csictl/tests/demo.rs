//! `csictl demo`: the EBS driver on its embedded EC2 in this process, one volume walked through
//! its life over the real socket with real loop devices, mkfs and mounts, and nothing left over.
#![cfg(feature = "demo")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

/// Why the demo cannot run here, if it cannot.
fn missing_block_parts() -> Option<String> {
    if !ebs_driver::loop_devices_available() {
        return Some("not root or no /dev/loop-control".into());
    }
    for tool in ["losetup", "blkid", "mkfs.ext4", "e2fsck", "mount", "umount"] {
        let found = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).exists()))
            .unwrap_or(false);
        if !found {
            return Some(format!("{tool} is not on PATH"));
        }
    }
    None
}

fn mounts_under(dir: &Path) -> Vec<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let prefix = dir.display().to_string();
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| p.starts_with(&prefix))
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csictl_demo_walks_a_volume_through_its_life() {
    if let Some(why) = missing_block_parts() {
        test_support::skip_or_fail(&format!(
            "{why}; the demo needs loop devices and mkfs/mount"
        ));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let r = csictl::demo::run(csictl::DemoArgs {
        dir: Some(dir.path().to_path_buf()),
        fs_type: "ext4".into(),
        timing: "fast".into(),
    })
    .await;
    let left = mounts_under(dir.path());
    test_support::unmount_all_below(dir.path());
    r.unwrap();
    // Nothing left mounted, and the socket is gone.
    assert_eq!(left, Vec::<String>::new());
    assert!(!dir.path().join("csi.sock").exists());
}
