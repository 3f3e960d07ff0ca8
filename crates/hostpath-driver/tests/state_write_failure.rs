//! A stage or publish whose state cannot be recorded (the state dir's filesystem is full)
//! fails and leaves nothing mounted. A mount the state does not know about would let
//! DeleteVolume remove the volume from under it, and NodeUnstage would not find it: what
//! `csi-cluster chaos` hit when the disk filled during a run. Root only.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Command;

use common::*;
use hostpath_driver::Config;
use tonic::Code;

/// A 1 MiB tmpfs for the driver's state, unmounted (with everything below) on drop.
struct SmallFs(tempfile::TempDir);

impl SmallFs {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
            .arg(dir.path())
            .status()
            .unwrap()
            .success();
        assert!(ok, "mounting a tmpfs");
        SmallFs(dir)
    }

    /// Takes every free byte (a file written until ENOSPC).
    fn fill(&self) {
        use std::io::Write as _;
        let mut f = std::fs::File::create(self.0.path().join("filler")).unwrap();
        let block = vec![0u8; 64 * 1024];
        while f.write_all(&block).is_ok() {}
        let _ = f.sync_all();
    }

    fn free(&self) {
        std::fs::remove_file(self.0.path().join("filler")).unwrap();
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        test_support::unmount_all_below(self.0.path());
    }
}

#[tokio::test]
async fn a_stage_or_publish_that_cannot_be_recorded_leaves_nothing_mounted() {
    if !root_parts_or_skip("the test mounts a tmpfs and bind-mounts volumes") {
        return;
    }
    let s = Scratch::new();
    let fs = SmallFs::new();
    let d = Driver::start(Config {
        state_dir: fs.0.path().join("state"),
        ..config(&s)
    })
    .await;
    let mut c = d.controller();
    let mut n = d.node();
    let v = create(&mut c, "pv-full", 1 << 20, mount_cap()).await;
    let staging = s.path("staging");
    let target = s.path("target");

    // Full: NodeStage cannot record the stage, so it must not stay mounted.
    fs.fill();
    let e = n
        .node_stage_volume(stage_req(&v.volume_id, &staging, mount_cap()))
        .await
        .unwrap_err();
    assert_ne!(e.code(), Code::Ok);
    assert_eq!(
        mounts_at(&staging),
        0,
        "an unrecorded stage stayed mounted: {e:?}"
    );

    // Room again: staged; then publish cannot be recorded, and must not stay mounted.
    fs.free();
    n.node_stage_volume(stage_req(&v.volume_id, &staging, mount_cap()))
        .await
        .unwrap();
    assert_eq!(mounts_at(&staging), 1);
    fs.fill();
    let e = n
        .node_publish_volume(publish_req(
            &v.volume_id,
            Some(&staging),
            &target,
            mount_cap(),
            false,
        ))
        .await
        .unwrap_err();
    assert_eq!(
        mounts_at(&target),
        0,
        "an unrecorded publish stayed mounted: {e:?}"
    );
    fs.free();

    // The stage that was recorded keeps the volume from being deleted.
    expect_code(
        c.delete_volume(csi_spec::v1::DeleteVolumeRequest {
            volume_id: v.volume_id.clone(),
            ..Default::default()
        })
        .await,
        Code::FailedPrecondition,
        "still in use",
    );
    n.node_unstage_volume(unstage_req(&v.volume_id, &staging))
        .await
        .unwrap();
    assert_eq!(mounts_at(&staging), 0);
    c.delete_volume(csi_spec::v1::DeleteVolumeRequest {
        volume_id: v.volume_id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    d.stop().await;
}
