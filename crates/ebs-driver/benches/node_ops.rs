//! What the node side costs per call on real parts (a loop device, mkfs'd ext4, mount):
//! the idempotent repeat of a stage (mountinfo + device lookup + identity check), a
//! publish/unpublish bind-mount cycle, a full stage/unstage cycle of a formatted volume
//! (blkid + e2fsck + mount + umount), and NodeGetVolumeStats.
//!
//! Run (as root, needs /dev/loop-control): `cargo bench -p ebs-driver --bench node_ops`

// A benchmark that cannot set up has nothing to measure: failing loudly is right.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Duration;

use common::{MIB, VOL_A};
use criterion::Criterion;
use ebs_driver::{AccessType, PublishRequest, StageRequest, UnpublishRequest, UnstageRequest};

fn main() {
    if let Some(why) = common::missing_parts() {
        eprintln!("SKIPPED: {why}; the node benchmarks need real loop devices");
        return;
    }
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    let mut fx = common::Fixture::new();
    fx.attach_linked(VOL_A, 256 * MIB, "xvdba");
    let svc = fx.service();
    let staging = fx.path("staging");
    let target = fx.path("pods/p/mount");
    let stage = StageRequest {
        volume_id: VOL_A.into(),
        device_path: Some("/dev/xvdba".into()),
        staging_path: staging.clone(),
        access: AccessType::Mount {
            fs_type: "ext4".into(),
            mount_flags: vec![],
        },
    };
    let unstage = UnstageRequest {
        volume_id: VOL_A.into(),
        staging_path: staging.clone(),
    };
    let publish = PublishRequest {
        volume_id: VOL_A.into(),
        device_path: Some("/dev/xvdba".into()),
        staging_path: staging.clone(),
        target_path: target.clone(),
        access: stage.access.clone(),
        read_only: false,
    };
    let unpublish = UnpublishRequest {
        volume_id: VOL_A.into(),
        target_path: target.clone(),
    };
    // The first stage formats; everything measured below runs on a formatted volume.
    rt.block_on(svc.stage(stage.clone())).expect("first stage");

    let mut c = Criterion::default()
        .sample_size(20)
        .measurement_time(Duration::from_secs(5))
        .configure_from_args();
    c.bench_function("node: stage again (already staged)", |b| {
        b.to_async(&rt).iter(|| svc.stage(stage.clone()))
    });
    c.bench_function("node: publish + unpublish (bind mount)", |b| {
        b.to_async(&rt).iter(|| async {
            svc.publish(publish.clone()).await.expect("publish");
            svc.unpublish(unpublish.clone()).await.expect("unpublish");
        })
    });
    rt.block_on(svc.publish(publish.clone())).expect("publish");
    c.bench_function("node: volume stats (statvfs)", |b| {
        b.to_async(&rt).iter(|| svc.volume_stats(VOL_A, &target))
    });
    rt.block_on(svc.unpublish(unpublish.clone()))
        .expect("unpublish");
    c.bench_function(
        "node: unstage + stage (e2fsck + mount, ext4 256 MiB)",
        |b| {
            b.to_async(&rt).iter(|| async {
                svc.unstage(unstage.clone()).await.expect("unstage");
                svc.stage(stage.clone()).await.expect("stage");
            })
        },
    );
    c.final_summary();
    drop(fx);
}
