//! The node service against real loop devices, mkfs, fsck and mount.
// Shared scenario helpers below are plain async fns, not #[test]s; a failure in them is a test
// failure, so unwrap is the right tool there too.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::{Read, Seek, SeekFrom, Write};

use common::{
    MIB, VOL_A, blkid_type, mount_access, publish_req, rdev, run, stage_req, unpublish_req,
    unstage_req,
};
use ebs_driver::{AccessType, Error, ExpandRequest, VolumeStats};

async fn stage_blank_and_repeat(fs: &str) {
    let Some(mut fx) = fixture!() else { return };
    let dev = fx.attach_linked(VOL_A, 512 * MIB, "xvdba");
    let svc = fx.service();
    let staging = fx.path("staging");
    assert_eq!(blkid_type(&dev), None, "a new volume is blank");

    svc.stage(stage_req(VOL_A, "/dev/xvdba", &staging, mount_access(fs)))
        .await
        .unwrap();
    assert_eq!(blkid_type(&dev).as_deref(), Some(fs));
    assert!(fx.mounted(&staging).is_some(), "staging path is mounted");
    std::fs::write(staging.join("marker"), b"first").unwrap();

    // A retried stage (the CO timed out) succeeds without formatting or mounting again.
    svc.stage(stage_req(VOL_A, "/dev/xvdba", &staging, mount_access(fs)))
        .await
        .unwrap();
    let stacked = fx
        .mounts()
        .iter()
        .filter(|(mp, _)| *mp == std::fs::canonicalize(&staging).unwrap())
        .count();
    assert_eq!(stacked, 1, "no second mount on top");
    assert_eq!(std::fs::read(staging.join("marker")).unwrap(), b"first");
}

#[tokio::test]
async fn stage_formats_blank_ext4_and_repeats_idempotently() {
    stage_blank_and_repeat("ext4").await;
}

#[tokio::test]
async fn stage_formats_blank_xfs_and_repeats_idempotently() {
    stage_blank_and_repeat("xfs").await;
}

#[tokio::test]
async fn stage_without_fs_type_uses_the_default_ext4() {
    let Some(mut fx) = fixture!() else { return };
    let dev = fx.attach_linked(VOL_A, 128 * MIB, "xvdba");
    let staging = fx.path("staging");
    fx.service()
        .stage(stage_req(VOL_A, "/dev/xvdba", &staging, mount_access("")))
        .await
        .unwrap();
    assert_eq!(blkid_type(&dev).as_deref(), Some("ext4"));
}

#[tokio::test]
async fn a_volume_with_data_is_never_reformatted() {
    let Some(mut fx) = fixture!() else { return };
    let dev = fx.attach_linked(VOL_A, 128 * MIB, "xvdba");
    let svc = fx.service();
    let staging = fx.path("staging");
    svc.stage(stage_req(
        VOL_A,
        "/dev/xvdba",
        &staging,
        mount_access("ext4"),
    ))
    .await
    .unwrap();
    std::fs::write(staging.join("data"), b"precious").unwrap();
    let uuid_before = run(
        "blkid",
        &["-p", "-o", "value", "-s", "UUID", dev.to_str().unwrap()],
    );
    svc.unstage(unstage_req(&staging)).await.unwrap();
    assert!(fx.mounted(&staging).is_none());

    // Asking for another filesystem must not format over the data.
    let err = svc
        .stage(stage_req(
            VOL_A,
            "/dev/xvdba",
            &staging,
            mount_access("xfs"),
        ))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::FsTypeMismatch { .. }), "{err}");
    assert!(
        err.to_string().contains("ext4") && err.to_string().contains("xfs"),
        "{err}"
    );
    assert!(fx.mounted(&staging).is_none());

    svc.stage(stage_req(
        VOL_A,
        "/dev/xvdba",
        &staging,
        mount_access("ext4"),
    ))
    .await
    .unwrap();
    assert_eq!(std::fs::read(staging.join("data")).unwrap(), b"precious");
    let uuid_after = run(
        "blkid",
        &["-p", "-o", "value", "-s", "UUID", dev.to_str().unwrap()],
    );
    assert_eq!(uuid_before, uuid_after, "same filesystem, not a new one");
}

#[tokio::test]
async fn corrupted_ext4_is_refused_by_fsck_and_not_mounted() {
    let Some(mut fx) = fixture!() else { return };
    let dev = fx.attach_linked(VOL_A, 64 * MIB, "xvdba");
    let d = dev.to_str().unwrap();
    run("mkfs.ext4", &["-q", d]);
    // Clear the root inode and mark the filesystem unclean: e2fsck -p cannot fix that alone.
    run("debugfs", &["-w", "-R", "clri <2>", d]);
    run("debugfs", &["-w", "-R", "ssv state 0", d]);

    let staging = fx.path("staging");
    let err = fx
        .service()
        .stage(stage_req(
            VOL_A,
            "/dev/xvdba",
            &staging,
            mount_access("ext4"),
        ))
        .await
        .unwrap_err();
    match &err {
        Error::Mount(mount_utils::Error::FsckFailed { code, output, .. }) => {
            assert_eq!(*code, 4, "{err}");
            assert!(output.contains("RUN fsck MANUALLY"), "{output}");
        }
        other => panic!("expected FsckFailed, got {other}"),
    }
    assert!(
        fx.mounted(&staging).is_none(),
        "a corrupt filesystem must not be mounted"
    );
    assert_eq!(
        blkid_type(&dev).as_deref(),
        Some("ext4"),
        "and not reformatted either"
    );
}

#[tokio::test]
async fn a_damaged_xfs_that_blkid_no_longer_recognises_is_not_reformatted() {
    let Some(mut fx) = fixture!() else { return };
    if !common::on_path("xfs_db") {
        test_support::skip_or_fail("xfs_db is not on PATH; it is needed to damage the superblock");
        return;
    }
    let dev = fx.attach_linked(VOL_A, 512 * MIB, "xvdba");
    let d = dev.to_str().unwrap();
    run("mkfs.xfs", &["-q", d]);
    // A bad superblock field: blkid stops recognising the filesystem, mount says "Structure
    // needs cleaning", and xfs_repair could still restore it from the secondary superblocks.
    run(
        "xfs_db",
        &["-x", "-c", "sb 0", "-c", "write -d agcount 0", d],
    );
    assert_eq!(
        blkid_type(&dev),
        None,
        "blkid no longer sees the filesystem"
    );

    let staging = fx.path("staging");
    let err = fx
        .service()
        .stage(stage_req(
            VOL_A,
            "/dev/xvdba",
            &staging,
            mount_access("xfs"),
        ))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Mount(mount_utils::Error::UnsupportedContent { .. })
        ),
        "{err}"
    );
    assert!(err.to_string().contains("damaged"), "{err}");
    assert!(fx.mounted(&staging).is_none());
    let mut magic = [0u8; 4];
    std::fs::File::open(&dev)
        .unwrap()
        .read_exact(&mut magic)
        .unwrap();
    assert_eq!(&magic, b"XFSB", "the superblock was not overwritten");
}

#[tokio::test]
async fn partition_table_is_neither_formatted_nor_mounted() {
    let Some(mut fx) = fixture!() else { return };
    let dev = fx.attach_linked(VOL_A, 64 * MIB, "xvdba");
    // A DOS partition table with one partition: the MBR's entry at 446 and its 55 AA mark.
    {
        let mut f = std::fs::OpenOptions::new().write(true).open(&dev).unwrap();
        let mut entry = vec![0u8, 0, 0, 0, 0x83, 0, 0, 0];
        entry.extend_from_slice(&2048u32.to_le_bytes());
        entry.extend_from_slice(&4096u32.to_le_bytes());
        f.seek(SeekFrom::Start(446)).unwrap();
        f.write_all(&entry).unwrap();
        f.seek(SeekFrom::Start(510)).unwrap();
        f.write_all(&[0x55, 0xaa]).unwrap();
        f.sync_all().unwrap();
    }
    let staging = fx.path("staging");
    let err = fx
        .service()
        .stage(stage_req(
            VOL_A,
            "/dev/xvdba",
            &staging,
            mount_access("ext4"),
        ))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Mount(mount_utils::Error::UnsupportedContent { .. })
        ),
        "{err}"
    );
    assert!(err.to_string().contains("partition table dos"), "{err}");
    assert_eq!(blkid_type(&dev), None, "still no filesystem on it");
    assert!(fx.mounted(&staging).is_none());
}

#[tokio::test]
async fn publish_readonly_publish_unpublish_unstage() {
    let Some(mut fx) = fixture!() else { return };
    fx.attach_linked(VOL_A, 128 * MIB, "xvdba");
    let svc = fx.service();
    let staging = fx.path("staging");
    let rw = fx.path("pods/p1/mount");
    let ro = fx.path("pods/p2/mount");

    // Publish before stage is refused.
    let err = svc
        .publish(publish_req(&staging, &rw, mount_access("ext4"), false))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NotStaged(_)), "{err}");

    svc.stage(stage_req(
        VOL_A,
        "/dev/xvdba",
        &staging,
        mount_access("ext4"),
    ))
    .await
    .unwrap();
    svc.publish(publish_req(&staging, &rw, mount_access("ext4"), false))
        .await
        .unwrap();
    std::fs::write(rw.join("through-rw"), b"hello").unwrap();
    assert_eq!(
        std::fs::read(staging.join("through-rw")).unwrap(),
        b"hello",
        "same filesystem"
    );

    svc.publish(publish_req(&staging, &ro, mount_access("ext4"), true))
        .await
        .unwrap();
    assert!(fx.mounted(&ro).unwrap().split(',').any(|o| o == "ro"));
    assert_eq!(std::fs::read(ro.join("through-rw")).unwrap(), b"hello");
    let write = std::fs::write(ro.join("nope"), b"x").unwrap_err();
    assert_eq!(write.raw_os_error(), Some(30), "EROFS: {write}");

    // Repeats are idempotent; a repeat asking for the other mode is incompatible.
    svc.publish(publish_req(&staging, &rw, mount_access("ext4"), false))
        .await
        .unwrap();
    svc.publish(publish_req(&staging, &ro, mount_access("ext4"), true))
        .await
        .unwrap();
    let err = svc
        .publish(publish_req(&staging, &rw, mount_access("ext4"), true))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::PublishedIncompatible { .. }), "{err}");

    for target in [&rw, &ro] {
        svc.unpublish(unpublish_req(target)).await.unwrap();
        assert!(fx.mounted(target).is_none());
        assert!(!target.exists(), "unpublish removes the target directory");
        svc.unpublish(unpublish_req(target)).await.unwrap();
    }
    svc.unstage(unstage_req(&staging)).await.unwrap();
    assert!(fx.mounted(&staging).is_none());
    svc.unstage(unstage_req(&staging)).await.unwrap();
}

#[tokio::test]
async fn raw_block_publish_binds_the_device_onto_a_file() {
    let Some(mut fx) = fixture!() else { return };
    let dev = fx.attach_linked(VOL_A, 64 * MIB, "xvdba");
    let svc = fx.service();
    let staging = fx.path("staging");
    let target = fx.path("pods/p1/volumeDevices/vol");

    svc.stage(stage_req(VOL_A, "/dev/xvdba", &staging, AccessType::Block))
        .await
        .unwrap();
    assert!(
        fx.mounted(&staging).is_none(),
        "raw block volumes are not mounted at stage"
    );
    svc.publish(publish_req(&staging, &target, AccessType::Block, false))
        .await
        .unwrap();
    assert_eq!(
        rdev(&target),
        rdev(&dev),
        "the target is the volume's device"
    );
    assert_eq!(
        blkid_type(&dev),
        None,
        "raw block volumes are never formatted"
    );

    // Bytes written through the target land on the device.
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(&target)
            .unwrap();
        f.seek(SeekFrom::Start(4096)).unwrap();
        f.write_all(b"raw bytes").unwrap();
        f.sync_all().unwrap();
    }
    let mut buf = [0u8; 9];
    let mut d = std::fs::File::open(&dev).unwrap();
    d.seek(SeekFrom::Start(4096)).unwrap();
    d.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"raw bytes");

    svc.publish(publish_req(&staging, &target, AccessType::Block, false))
        .await
        .unwrap();
    let stats = svc.volume_stats(VOL_A, &target).await.unwrap();
    assert_eq!(
        stats,
        VolumeStats::Block {
            size_bytes: 64 * MIB
        }
    );

    svc.unpublish(unpublish_req(&target)).await.unwrap();
    assert!(!target.exists(), "unpublish removes the target file");
    svc.unstage(unstage_req(&staging)).await.unwrap();
}

#[tokio::test]
async fn stats_report_filesystem_sizes_and_usage() {
    let Some(mut fx) = fixture!() else { return };
    fx.attach_linked(VOL_A, 256 * MIB, "xvdba");
    let svc = fx.service();
    let staging = fx.path("staging");
    let target = fx.path("pods/p/mount");
    svc.stage(stage_req(
        VOL_A,
        "/dev/xvdba",
        &staging,
        mount_access("ext4"),
    ))
    .await
    .unwrap();
    svc.publish(publish_req(&staging, &target, mount_access("ext4"), false))
        .await
        .unwrap();

    let VolumeStats::Filesystem {
        bytes: before,
        inodes,
    } = svc.volume_stats(VOL_A, &target).await.unwrap()
    else {
        panic!("expected filesystem stats");
    };
    assert!(
        before.total > 200 * MIB && before.total <= 256 * MIB,
        "{before:?}"
    );
    assert!(
        before.available <= before.total && before.used > 0,
        "{before:?}"
    );
    assert!(inodes.total > 1000 && inodes.used >= 11, "{inodes:?}");

    std::fs::write(target.join("blob"), vec![7u8; 8 * MIB as usize]).unwrap();
    rustix::fs::sync();
    let VolumeStats::Filesystem { bytes: after, .. } =
        svc.volume_stats(VOL_A, &target).await.unwrap()
    else {
        panic!("expected filesystem stats");
    };
    assert!(
        after.used >= before.used + 8 * MIB,
        "{before:?} -> {after:?}"
    );
    assert!(
        after.available + 8 * MIB <= before.available,
        "{before:?} -> {after:?}"
    );
}

async fn expand_after_growing(fs: &str, from: u64, to: u64) {
    let Some(mut fx) = fixture!() else { return };
    let dev = fx.attach_linked(VOL_A, from, "xvdba");
    let svc = fx.service();
    let staging = fx.path("staging");
    let target = fx.path("pods/p/mount");
    svc.stage(stage_req(VOL_A, "/dev/xvdba", &staging, mount_access(fs)))
        .await
        .unwrap();
    svc.publish(publish_req(&staging, &target, mount_access(fs), false))
        .await
        .unwrap();
    let total = |s: VolumeStats| match s {
        VolumeStats::Filesystem { bytes, .. } => bytes.total,
        VolumeStats::Block { .. } => panic!("expected filesystem stats"),
    };
    let before = total(svc.volume_stats(VOL_A, &target).await.unwrap());

    // The controller's resize has not reached the device yet: a clear error, nothing done.
    let err = svc
        .expand(ExpandRequest {
            volume_id: VOL_A.into(),
            volume_path: target.clone(),
            required_bytes: Some(to),
        })
        .await
        .unwrap_err();
    assert!(matches!(err, Error::DeviceTooSmall { .. }), "{err}");

    fx.grow(VOL_A, &dev, to);
    if fs != "xfs" && !common::has_cap_sys_resource() {
        // Online ext4 growth (EXT4_IOC_RESIZE_FS) needs CAP_SYS_RESOURCE; this sandbox drops it.
        eprintln!("SKIPPED the ext4 growth step: no CAP_SYS_RESOURCE in this environment");
        return;
    }
    let size = svc
        .expand(ExpandRequest {
            volume_id: VOL_A.into(),
            volume_path: target.clone(),
            required_bytes: Some(to),
        })
        .await
        .unwrap();
    assert_eq!(size, to);
    let after = total(svc.volume_stats(VOL_A, &target).await.unwrap());
    assert!(
        after > before + (to - from) / 2,
        "{fs}: {before} -> {after}"
    );
    // Expanding again is a no-op success.
    svc.expand(ExpandRequest {
        volume_id: VOL_A.into(),
        volume_path: staging.clone(),
        required_bytes: None,
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn expand_grows_ext4_online() {
    expand_after_growing("ext4", 128 * MIB, 384 * MIB).await;
}

#[tokio::test]
async fn expand_grows_xfs_online() {
    expand_after_growing("xfs", 512 * MIB, 1024 * MIB).await;
}
