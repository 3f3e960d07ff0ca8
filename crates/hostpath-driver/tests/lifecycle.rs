//! Volumes through their whole node-side life with real bind mounts and loop devices: mount
//! and block volumes, read-only publish, stats, ephemeral inline volumes, idempotent and
//! concurrent calls. Root only (skips, or fails under CSI_RS_REQUIRE_ALL, without it).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::{FileTypeExt, MetadataExt};

use common::*;
use csi_spec::v1::volume_capability::access_mode::Mode;
use csi_spec::v1::volume_usage::Unit;
use csi_spec::v1::*;
use hostpath_driver::Config;
use tonic::Code;

#[tokio::test]
async fn mount_volume_lifecycle() {
    if !root_parts_or_skip("the mount volume lifecycle bind-mounts directories") {
        return;
    }
    let s = Scratch::new();
    let d = Driver::start(config(&s)).await;
    let (mut c, mut n) = (d.controller(), d.node());
    let v = create(&mut c, "pvc-life", 8 * MIB, mount_cap()).await;
    let id = v.volume_id.as_str();
    let dir = s.state_dir().join("volumes").join(id);
    let staging = s.path("staging");
    let target = s.path("pods/p1/mount");

    for _ in 0..2 {
        n.node_stage_volume(stage_req(id, &staging, mount_cap()))
            .await
            .unwrap();
    }
    assert_eq!(mounts_at(&staging), 1, "a repeated stage mounts once");
    // Staged elsewhere too: incompatible.
    expect_code(
        n.node_stage_volume(stage_req(id, &s.path("staging2"), mount_cap()))
            .await,
        Code::AlreadyExists,
        "already staged",
    );
    for _ in 0..2 {
        n.node_publish_volume(publish_req(id, Some(&staging), &target, mount_cap(), false))
            .await
            .unwrap();
    }
    assert_eq!(mounts_at(&target), 1, "a repeated publish mounts once");
    // The same target read-only is incompatible with the read-write publish.
    expect_code(
        n.node_publish_volume(publish_req(id, Some(&staging), &target, mount_cap(), true))
            .await,
        Code::AlreadyExists,
        "read_only",
    );
    // In use: not deletable.
    expect_code(
        c.delete_volume(DeleteVolumeRequest {
            volume_id: id.into(),
            ..Default::default()
        })
        .await,
        Code::FailedPrecondition,
        "in use",
    );

    std::fs::write(target.join("hello.txt"), b"written through the target").unwrap();
    assert_eq!(
        std::fs::read(dir.join("hello.txt")).unwrap(),
        b"written through the target"
    );

    let stats = n
        .node_get_volume_stats(stats_req(id, &target))
        .await
        .unwrap()
        .into_inner();
    let bytes = stats
        .usage
        .iter()
        .find(|u| u.unit == Unit::Bytes as i32)
        .unwrap();
    let inodes = stats
        .usage
        .iter()
        .find(|u| u.unit == Unit::Inodes as i32)
        .unwrap();
    assert!(bytes.total > 0 && bytes.used <= bytes.total && bytes.available <= bytes.total);
    assert!(inodes.total > 0 && inodes.used > 0);
    assert_eq!(stats.volume_condition.map(|c| c.abnormal), Some(false));
    // The staging path is a mount of the volume too.
    n.node_get_volume_stats(stats_req(id, &staging))
        .await
        .unwrap();

    for _ in 0..2 {
        n.node_unpublish_volume(unpublish_req(id, &target))
            .await
            .unwrap();
    }
    assert_eq!(mounts_at(&target), 0);
    assert!(!target.exists(), "unpublish removes the target");
    for _ in 0..2 {
        n.node_unstage_volume(unstage_req(id, &staging))
            .await
            .unwrap();
    }
    assert_eq!(mounts_at(&staging), 0);

    // Another stage and another target see what was written.
    let staging2 = s.path("staging2");
    let target2 = s.path("pods/p2/mount");
    n.node_stage_volume(stage_req(id, &staging2, mount_cap()))
        .await
        .unwrap();
    n.node_publish_volume(publish_req(
        id,
        Some(&staging2),
        &target2,
        mount_cap(),
        false,
    ))
    .await
    .unwrap();
    assert_eq!(
        std::fs::read(target2.join("hello.txt")).unwrap(),
        b"written through the target"
    );
    n.node_unpublish_volume(unpublish_req(id, &target2))
        .await
        .unwrap();
    n.node_unstage_volume(unstage_req(id, &staging2))
        .await
        .unwrap();
    c.delete_volume(DeleteVolumeRequest {
        volume_id: id.into(),
        ..Default::default()
    })
    .await
    .unwrap();
    assert!(!dir.exists(), "delete removes the volume directory");
}

#[tokio::test]
async fn read_only_publish_refuses_writes() {
    if !root_parts_or_skip("read-only publish needs a read-only bind mount") {
        return;
    }
    let s = Scratch::new();
    let d = Driver::start(config(&s)).await;
    let (mut c, mut n) = (d.controller(), d.node());
    let v = create(&mut c, "pvc-ro", MIB, mount_cap()).await;
    let id = v.volume_id.as_str();
    std::fs::write(
        s.state_dir().join("volumes").join(id).join("existing"),
        b"x",
    )
    .unwrap();
    let staging = s.path("staging");
    n.node_stage_volume(stage_req(id, &staging, mount_cap()))
        .await
        .unwrap();
    // readonly=true, and a READER_ONLY mode without the flag: both read-only.
    let ro = s.path("ro");
    let reader = s.path("reader");
    n.node_publish_volume(publish_req(id, Some(&staging), &ro, mount_cap(), true))
        .await
        .unwrap();
    n.node_publish_volume(publish_req(
        id,
        Some(&staging),
        &reader,
        VolumeCapability::mount("", vec![], Mode::SingleNodeReaderOnly),
        false,
    ))
    .await
    .unwrap();
    for t in [&ro, &reader] {
        assert_eq!(std::fs::read(t.join("existing")).unwrap(), b"x");
        let err = std::fs::write(t.join("new"), b"y").unwrap_err();
        assert_eq!(err.raw_os_error(), Some(30), "EROFS expected: {err}");
    }
    // The staging mount stays writable.
    std::fs::write(staging.join("new"), b"y").unwrap();
    // Republishing read-write over the read-only target is incompatible.
    expect_code(
        n.node_publish_volume(publish_req(id, Some(&staging), &ro, mount_cap(), false))
            .await,
        Code::AlreadyExists,
        "read_only",
    );
    for t in [&ro, &reader] {
        n.node_unpublish_volume(unpublish_req(id, t)).await.unwrap();
    }
    n.node_unstage_volume(unstage_req(id, &staging))
        .await
        .unwrap();
}

#[tokio::test]
async fn block_volume_lifecycle() {
    if !root_parts_or_skip("block volumes attach loop devices") {
        return;
    }
    let s = Scratch::new();
    let d = Driver::start(config(&s)).await;
    let (mut c, mut n) = (d.controller(), d.node());
    let v = create(&mut c, "pvc-block", 16 * MIB, block_cap()).await;
    let id = v.volume_id.as_str();
    let image = s.state_dir().join("volumes").join(format!("{id}.img"));
    let staging = s.path("staging");
    let target = s.path("pods/p1/dev/block");

    // Mount access to a block volume is refused.
    expect_code(
        n.node_stage_volume(stage_req(id, &staging, mount_cap()))
            .await,
        Code::InvalidArgument,
        "block volume",
    );
    for _ in 0..2 {
        n.node_stage_volume(stage_req(id, &staging, block_cap()))
            .await
            .unwrap();
    }
    let loops = loops_of(&image);
    assert_eq!(
        loops.len(),
        1,
        "one loop device after two stages: {loops:?}"
    );
    for _ in 0..2 {
        n.node_publish_volume(publish_req(id, Some(&staging), &target, block_cap(), false))
            .await
            .unwrap();
    }
    assert_eq!(mounts_at(&target), 1);
    let meta = std::fs::metadata(&target).unwrap();
    assert!(meta.file_type().is_block_device(), "{meta:?}");
    let loop_meta = std::fs::metadata(&loops[0]).unwrap();
    assert_eq!(
        meta.rdev(),
        loop_meta.rdev(),
        "the target is the loop device"
    );

    // Write a pattern with dd through the target.
    let pattern: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
    let src = s.path("pattern");
    std::fs::write(&src, &pattern).unwrap();
    let out = std::process::Command::new("dd")
        .arg(format!("if={}", src.display()))
        .arg(format!("of={}", target.display()))
        .args(["bs=4096", "seek=1", "conv=fsync,notrunc", "status=none"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");

    let stats = n
        .node_get_volume_stats(stats_req(id, &target))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stats.usage.len(), 1);
    assert_eq!(stats.usage[0].total, 16 * MIB);
    assert_eq!(stats.usage[0].unit, Unit::Bytes as i32);

    n.node_unpublish_volume(unpublish_req(id, &target))
        .await
        .unwrap();
    assert!(!target.exists());
    assert_eq!(loops_of(&image), loops, "still staged: the device stays");

    let target2 = s.path("pods/p2/dev/block");
    n.node_publish_volume(publish_req(
        id,
        Some(&staging),
        &target2,
        block_cap(),
        false,
    ))
    .await
    .unwrap();
    let mut f = std::fs::File::open(&target2).unwrap();
    f.seek(SeekFrom::Start(4096)).unwrap();
    let mut back = vec![0u8; pattern.len()];
    f.read_exact(&mut back).unwrap();
    drop(f);
    assert_eq!(back, pattern, "data persists across unpublish/publish");

    n.node_unpublish_volume(unpublish_req(id, &target2))
        .await
        .unwrap();
    for _ in 0..2 {
        n.node_unstage_volume(unstage_req(id, &staging))
            .await
            .unwrap();
    }
    assert!(
        loops_of(&image).is_empty(),
        "unstage detaches the loop device"
    );
    // The data is in the image itself.
    let mut img = std::fs::File::open(&image).unwrap();
    img.seek(SeekFrom::Start(4096)).unwrap();
    let mut back = vec![0u8; pattern.len()];
    img.read_exact(&mut back).unwrap();
    assert_eq!(back, pattern);
    c.delete_volume(DeleteVolumeRequest {
        volume_id: id.into(),
        ..Default::default()
    })
    .await
    .unwrap();
    assert!(!image.exists());
}

#[tokio::test]
async fn stats_of_a_path_that_holds_another_volume_is_not_found() {
    if !root_parts_or_skip("stats are checked against real mounts") {
        return;
    }
    let s = Scratch::new();
    let d = Driver::start(config(&s)).await;
    let (mut c, mut n) = (d.controller(), d.node());
    let a = create(&mut c, "pvc-a", MIB, mount_cap()).await;
    let b = create(&mut c, "pvc-b", MIB, mount_cap()).await;
    let blk = create(&mut c, "pvc-blk", 4 * MIB, block_cap()).await;
    let ta = s.path("a");
    n.node_publish_volume(publish_req(&a.volume_id, None, &ta, mount_cap(), false))
        .await
        .unwrap();
    n.node_get_volume_stats(stats_req(&a.volume_id, &ta))
        .await
        .unwrap();
    expect_code(
        n.node_get_volume_stats(stats_req(&b.volume_id, &ta)).await,
        Code::NotFound,
        &b.volume_id,
    );
    // A block volume that is not attached anywhere is at no path.
    expect_code(
        n.node_get_volume_stats(stats_req(&blk.volume_id, &ta))
            .await,
        Code::NotFound,
        &blk.volume_id,
    );
    // Unpublishing a path with someone else's volume leaves that mount alone.
    n.node_unpublish_volume(unpublish_req(&b.volume_id, &ta))
        .await
        .unwrap();
    assert_eq!(mounts_at(&ta), 1);
    n.node_unpublish_volume(unpublish_req(&a.volume_id, &ta))
        .await
        .unwrap();
    assert_eq!(mounts_at(&ta), 0);
}

#[tokio::test]
async fn ephemeral_inline_volume_lives_from_publish_to_unpublish() {
    if !root_parts_or_skip("ephemeral volumes are bind-mounted") {
        return;
    }
    let s = Scratch::new();
    let d = Driver::start(config(&s)).await;
    let (mut c, mut n) = (d.controller(), d.node());
    let id = "csi-0123456789abcdef";
    let target = s.path("pods/p/volumes/inline/mount");
    let mut req = publish_req(id, None, &target, mount_cap(), false);
    req.volume_context = ephemeral_context();
    for _ in 0..2 {
        n.node_publish_volume(req.clone()).await.unwrap();
    }
    assert_eq!(mounts_at(&target), 1);
    let dir = s.state_dir().join("volumes").join(id);
    std::fs::write(target.join("scratch"), b"tmp").unwrap();
    assert!(dir.join("scratch").exists());
    assert_eq!(list_all(&mut c, 0).await, vec![id.to_string()]);
    n.node_get_volume_stats(stats_req(id, &target))
        .await
        .unwrap();

    n.node_unpublish_volume(unpublish_req(id, &target))
        .await
        .unwrap();
    assert!(
        !dir.exists(),
        "the ephemeral volume goes with its last publish"
    );
    assert!(list_all(&mut c, 0).await.is_empty());
    // Gone now: a repeat is NOT_FOUND like any unknown volume.
    expect_code(
        n.node_unpublish_volume(unpublish_req(id, &target)).await,
        Code::NotFound,
        id,
    );
    // Without the ephemeral flag an unknown volume is not created.
    expect_code(
        n.node_publish_volume(publish_req(id, None, &target, mount_cap(), false))
            .await,
        Code::NotFound,
        id,
    );
    // Ephemeral volumes are directories only; nothing is left behind by the refusal.
    let mut blk = publish_req("csi-block", None, &s.path("b"), block_cap(), false);
    blk.volume_context = ephemeral_context();
    expect_code(
        n.node_publish_volume(blk).await,
        Code::InvalidArgument,
        "ephemeral",
    );
    let mut bad = publish_req("../escape", None, &s.path("e"), mount_cap(), false);
    bad.volume_context = ephemeral_context();
    expect_code(
        n.node_publish_volume(bad).await,
        Code::InvalidArgument,
        "volume_id",
    );
    assert!(list_all(&mut c, 0).await.is_empty());
}

#[tokio::test]
async fn concurrent_publishes_of_one_target_mount_once() {
    if !root_parts_or_skip("publish bind-mounts") {
        return;
    }
    let s = Scratch::new();
    let d = Driver::start(config(&s)).await;
    let mut c = d.controller();
    let v = create(&mut c, "pvc-race", MIB, mount_cap()).await;
    let other = create(&mut c, "pvc-other", MIB, mount_cap()).await;
    let target = s.path("target");
    let mut calls = Vec::new();
    for i in 0..8 {
        let mut n = d.node();
        // Interleave calls for another volume: they must not wait on this one's lock.
        let (vid, t) = if i % 4 == 3 {
            (other.volume_id.clone(), s.path(&format!("other-{i}")))
        } else {
            (v.volume_id.clone(), target.clone())
        };
        calls.push(tokio::spawn(async move {
            n.node_publish_volume(publish_req(&vid, None, &t, mount_cap(), false))
                .await
                .map(drop)
        }));
    }
    for call in calls {
        call.await.unwrap().unwrap();
    }
    assert_eq!(mounts_at(&target), 1, "serialized per volume: one mount");
    assert_eq!(mounts_at(&s.path("other-3")), 1);
    assert_eq!(mounts_at(&s.path("other-7")), 1);
}

#[tokio::test]
async fn without_stage_unstage_publish_works_from_the_volume() {
    if !root_parts_or_skip("publish bind-mounts and attaches loop devices") {
        return;
    }
    let s = Scratch::new();
    let d = Driver::start(Config {
        stage_unstage: false,
        ..config(&s)
    })
    .await;
    let (mut c, mut n) = (d.controller(), d.node());
    let m = create(&mut c, "pvc-m", MIB, mount_cap()).await;
    let b = create(&mut c, "pvc-b", 4 * MIB, block_cap()).await;
    let image = s
        .state_dir()
        .join("volumes")
        .join(format!("{}.img", b.volume_id));
    let tm = s.path("m");
    let tb = s.path("b/dev");
    n.node_publish_volume(publish_req(&m.volume_id, None, &tm, mount_cap(), false))
        .await
        .unwrap();
    std::fs::write(tm.join("f"), b"direct").unwrap();
    n.node_publish_volume(publish_req(&b.volume_id, None, &tb, block_cap(), false))
        .await
        .unwrap();
    assert_eq!(loops_of(&image).len(), 1);
    assert!(
        std::fs::metadata(&tb)
            .unwrap()
            .file_type()
            .is_block_device()
    );
    n.node_unpublish_volume(unpublish_req(&b.volume_id, &tb))
        .await
        .unwrap();
    assert!(
        loops_of(&image).is_empty(),
        "the last unpublish detaches the loop device"
    );
    n.node_unpublish_volume(unpublish_req(&m.volume_id, &tm))
        .await
        .unwrap();
    assert_eq!(
        std::fs::read(s.state_dir().join("volumes").join(&m.volume_id).join("f")).unwrap(),
        b"direct"
    );
}

#[tokio::test]
async fn single_writer_volumes_publish_once() {
    if !root_parts_or_skip("publish bind-mounts") {
        return;
    }
    let s = Scratch::new();
    let d = Driver::start(config(&s)).await;
    let (mut c, mut n) = (d.controller(), d.node());
    let cap = VolumeCapability::mount("", vec![], Mode::SingleNodeSingleWriter);
    let v = create(&mut c, "pvc-sw", MIB, cap.clone()).await;
    n.node_publish_volume(publish_req(
        &v.volume_id,
        None,
        &s.path("t1"),
        cap.clone(),
        false,
    ))
    .await
    .unwrap();
    expect_code(
        n.node_publish_volume(publish_req(&v.volume_id, None, &s.path("t2"), cap, false))
            .await,
        Code::FailedPrecondition,
        "SINGLE_NODE_SINGLE_WRITER",
    );
    assert!(!s.path("t2").exists() || mounts_at(&s.path("t2")) == 0);
}

#[tokio::test]
async fn block_volume_expands_online() {
    if !root_parts_or_skip("online expansion resizes a loop device") {
        return;
    }
    let s = Scratch::new();
    let d = Driver::start(config(&s)).await;
    let (mut c, mut n) = (d.controller(), d.node());
    let b = create(&mut c, "pvc-grow", 8 * MIB, block_cap()).await;
    let id = b.volume_id.as_str();
    let staging = s.path("staging");
    let target = s.path("pod/dev");
    n.node_stage_volume(stage_req(id, &staging, block_cap()))
        .await
        .unwrap();
    n.node_publish_volume(publish_req(id, Some(&staging), &target, block_cap(), false))
        .await
        .unwrap();
    let r = c
        .controller_expand_volume(ControllerExpandVolumeRequest {
            volume_id: id.into(),
            capacity_range: Some(CapacityRange {
                required_bytes: 32 * MIB,
                limit_bytes: 0,
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.node_expansion_required);
    // Until the node step the loop device keeps its old size.
    let total = |n: &mut csi_spec::v1::node_client::NodeClient<_>| {
        let mut n = n.clone();
        let req = stats_req(id, &target);
        async move {
            n.node_get_volume_stats(req)
                .await
                .unwrap()
                .into_inner()
                .usage[0]
                .total
        }
    };
    assert_eq!(total(&mut n).await, 8 * MIB);
    for path in [&target, &staging] {
        let grown = n
            .node_expand_volume(NodeExpandVolumeRequest {
                volume_id: id.into(),
                volume_path: path.display().to_string(),
                capacity_range: Some(CapacityRange {
                    required_bytes: 32 * MIB,
                    limit_bytes: 0,
                }),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(grown.capacity_bytes, 32 * MIB);
    }
    assert_eq!(total(&mut n).await, 32 * MIB);
    // The device node at the target sees the new size too.
    let mut f = std::fs::File::open(&target).unwrap();
    assert_eq!(f.seek(SeekFrom::End(0)).unwrap(), 32 << 20);
    drop(f);
    // Asking the node for more than the controller granted is refused.
    expect_code(
        n.node_expand_volume(NodeExpandVolumeRequest {
            volume_id: id.into(),
            volume_path: target.display().to_string(),
            capacity_range: Some(CapacityRange {
                required_bytes: 64 * MIB,
                limit_bytes: 0,
            }),
            ..Default::default()
        })
        .await,
        Code::FailedPrecondition,
        "controller",
    );
    n.node_unpublish_volume(unpublish_req(id, &target))
        .await
        .unwrap();
    n.node_unstage_volume(unstage_req(id, &staging))
        .await
        .unwrap();
}

#[tokio::test]
async fn read_only_block_publish_refuses_writes() {
    if !root_parts_or_skip("read-only block publish attaches a read-only loop device") {
        return;
    }
    let s = Scratch::new();
    let d = Driver::start(config(&s)).await;
    let (mut c, mut n) = (d.controller(), d.node());
    let b = create(&mut c, "pvc-ro-block", 4 * MIB, block_cap()).await;
    let id = b.volume_id.as_str();
    let image = s.state_dir().join("volumes").join(format!("{id}.img"));
    let staging = s.path("staging");
    let (rw, ro) = (s.path("pod/rw"), s.path("pod/ro"));
    n.node_stage_volume(stage_req(id, &staging, block_cap()))
        .await
        .unwrap();
    n.node_publish_volume(publish_req(id, Some(&staging), &rw, block_cap(), false))
        .await
        .unwrap();
    for _ in 0..2 {
        n.node_publish_volume(publish_req(id, Some(&staging), &ro, block_cap(), true))
            .await
            .unwrap();
    }
    assert_eq!(
        loops_of(&image).len(),
        2,
        "one writable and one read-only device"
    );
    let dd = |target: &std::path::Path| {
        std::process::Command::new("dd")
            .arg("if=/dev/zero")
            .arg(format!("of={}", target.display()))
            .args(["bs=4096", "count=1", "conv=notrunc,fsync", "status=none"])
            .output()
            .unwrap()
    };
    let refused = dd(&ro);
    assert!(
        !refused.status.success(),
        "writing through the read-only target must fail"
    );
    assert!(dd(&rw).status.success());
    // Reading through the read-only target works.
    let mut f = std::fs::File::open(&ro).unwrap();
    let mut buf = [0u8; 512];
    f.read_exact(&mut buf).unwrap();
    drop(f);
    n.node_get_volume_stats(stats_req(id, &ro)).await.unwrap();

    n.node_unpublish_volume(unpublish_req(id, &ro))
        .await
        .unwrap();
    assert_eq!(
        loops_of(&image).len(),
        1,
        "the read-only device goes with its last user"
    );
    n.node_unpublish_volume(unpublish_req(id, &rw))
        .await
        .unwrap();
    n.node_unstage_volume(unstage_req(id, &staging))
        .await
        .unwrap();
    assert!(loops_of(&image).is_empty());
}
