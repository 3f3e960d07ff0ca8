//! `csi-cluster demo` (what `sudo scripts/demo` runs) as a test: the real binary to its end,
//! every step's evidence in its output, nothing left behind.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Command;

use common::{can_run, loop_devices_below, mounts_below, sockets_below};

#[test]
fn the_demo_runs_to_the_end_and_leaves_nothing() {
    if !can_run() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let data = work.path().join("data");
    let out = Command::new(env!("CARGO_BIN_EXE_csi-cluster"))
        .args(["demo", "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let guard = scopeguard(&data);
    assert!(
        out.status.success(),
        "demo failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    for evidence in [
        // The EBS volume: provisioned and attached on node-1 ...
        "pod writer Ready on node-1",
        "(ebs.csi.aws.com on node-1, attached=true)",
        // ... detached, then on node-2 with the file ...
        "is available",
        "pod reader Ready on node-2; hello.txt reads back: \"written on node-1",
        // ... through the in-tree PV by the CSI driver, then deleted.
        "pod in-tree-reader Ready on node-0; hello.txt reads back",
        "says awsElasticBlockStore aws://us-east-1a/vol-",
        "EC2 no longer has vol-",
        // Hostpath without and with attach.
        "proves: attachRequired: false → no VolumeAttachment at all",
        "CSIDriver hostpath.csi.k8s.io: attachRequired true",
        "(hostpath.csi.k8s.io on node-1, attached=true)",
        "PersistentVolumes 0, claims 0, VolumeAttachments 0",
        "csi-cluster demo: done",
    ] {
        assert!(
            stdout.contains(evidence),
            "missing {evidence:?} in:\n{stdout}\n{stderr}"
        );
    }
    // Every step is numbered and timed.
    assert!(stdout.contains("] == 1. start a cluster"), "{stdout}");
    drop(guard);
}

/// Checks (and cleans, so a failure leaves nothing) the data dir once the demo ended.
struct Leftovers(std::path::PathBuf);

fn scopeguard(data: &std::path::Path) -> Leftovers {
    Leftovers(data.to_path_buf())
}

impl Drop for Leftovers {
    fn drop(&mut self) {
        let mounts = mounts_below(&self.0);
        let loops = loop_devices_below(&self.0);
        let sockets = sockets_below(&self.0);
        test_support::unmount_all_below(&self.0);
        for (dev, _) in &loops {
            let _ = Command::new("losetup").arg("-d").arg(dev).status();
        }
        if !std::thread::panicking() {
            assert!(
                mounts.is_empty() && loops.is_empty() && sockets.is_empty(),
                "left behind: {mounts:?} {loops:?} {sockets:?}"
            );
        }
    }
}
