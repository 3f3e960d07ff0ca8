//! The loop-backed round trip through the real SDK: an attached volume is a real block device
//! that mkfs.ext4 formats and mount mounts, and a file written there survives detach and
//! re-attach under another device name. Needs root and /dev/loop-control (skips otherwise).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};

use aws_sdk_ec2::types::{VolumeAttachmentState, VolumeState, VolumeType};
use ec2_conformance::block::{self, MountGuard};
use ec2_conformance::{SimServer, client, wait};

use common::{WAIT, ZONE_A, instance};

async fn attach_and_wait(c: &aws_sdk_ec2::Client, vol: &str, inst: &str, device: &str) {
    c.attach_volume()
        .volume_id(vol)
        .instance_id(inst)
        .device(device)
        .send()
        .await
        .unwrap();
    wait::attachment_state(c, vol, inst, VolumeAttachmentState::Attached, WAIT)
        .await
        .unwrap();
}

async fn detach_and_wait(c: &aws_sdk_ec2::Client, vol: &str, inst: &str) {
    c.detach_volume()
        .volume_id(vol)
        .instance_id(inst)
        .send()
        .await
        .unwrap();
    wait::detached(c, vol, inst, WAIT).await.unwrap();
}

/// The loop device behind the attachment: the name link and the by-id link both resolve to
/// the same /dev/loopN, which the simulator reports and whose backing file is the image.
async fn resolve_device(sim: &SimServer, vol: &str, name: &str, image: &Path) -> PathBuf {
    let name_link = sim.device_dir().join(name);
    let by_id = sim.device_dir().join("disk/by-id").join(format!(
        "nvme-Amazon_Elastic_Block_Store_{}",
        vol.replace('-', "")
    ));
    assert_eq!(
        by_id.file_name().unwrap().to_string_lossy(),
        ec2_sim::by_id_link_name(vol)
    );
    let dev = name_link
        .canonicalize()
        .unwrap_or_else(|e| panic!("{}: {e}", name_link.display()));
    assert_eq!(
        by_id.canonicalize().unwrap(),
        dev,
        "by-id link and name link differ"
    );
    let dev_name = dev.file_name().unwrap().to_string_lossy().to_string();
    assert!(dev_name.starts_with("loop"), "{}", dev.display());
    assert_eq!(
        sim.loop_device(vol).await.unwrap().as_deref(),
        Some(dev.to_str().unwrap())
    );
    let backing =
        std::fs::read_to_string(format!("/sys/block/{dev_name}/loop/backing_file")).unwrap();
    assert_eq!(
        Path::new(backing.trim()),
        image,
        "backing file of {dev_name}"
    );
    assert_eq!(
        block::loops_backing(image).unwrap(),
        [dev.to_string_lossy().to_string()]
    );
    dev
}

#[tokio::test]
async fn attached_volume_formats_mounts_and_keeps_data_across_reattach() {
    if let Some(reason) = block::loop_unavailable_reason() {
        test_support::skip_or_fail(&reason);
        return;
    }
    // Our own state dir, so the image can still be checked after the simulator is gone.
    let state = tempfile::tempdir().unwrap();
    let mnt = tempfile::tempdir().unwrap();
    let sim = SimServer::start_with(|config| {
        config.state_dir = state.path().join("sim");
        config.backing = ec2_sim::Backing::Loop;
    })
    .unwrap();
    let c = client(sim.endpoint());

    let out = c
        .create_volume()
        .availability_zone(ZONE_A)
        .size(1)
        .volume_type(VolumeType::Gp3)
        .send()
        .await
        .unwrap();
    let vol = out.volume_id().unwrap().to_string();
    wait::volume_state(&c, &vol, VolumeState::Available, WAIT)
        .await
        .unwrap();
    let image = sim.state_dir().join("volumes").join(format!("{vol}.img"));
    assert_eq!(std::fs::metadata(&image).unwrap().len(), 1 << 30);
    assert!(block::loops_backing(&image).unwrap().is_empty());
    let inst = instance(&c, ZONE_A).await;

    // First attachment: format, mount, write.
    attach_and_wait(&c, &vol, &inst, "/dev/xvdba").await;
    let dev = resolve_device(&sim, &vol, "xvdba", &image).await;
    block::run("mkfs.ext4", &["-q", "-F", dev.to_str().unwrap()]).unwrap();
    let blkid = block::run(
        "blkid",
        &["-o", "value", "-s", "TYPE", dev.to_str().unwrap()],
    );
    assert_eq!(blkid.unwrap().trim(), "ext4");
    let mount = MountGuard::mount(&dev, mnt.path()).unwrap();
    assert!(block::is_mounted(mnt.path()));
    let file = mnt.path().join("hello.txt");
    std::fs::write(&file, b"written through aws-sdk-ec2 and a loop device\n").unwrap();
    block::run("sync", &[]).unwrap();
    mount.unmount().unwrap();
    assert!(!block::is_mounted(mnt.path()));

    // Detach: the device and its links go away.
    detach_and_wait(&c, &vol, &inst).await;
    assert!(block::loops_backing(&image).unwrap().is_empty());
    assert!(!sim.device_dir().join("xvdba").exists());
    assert_eq!(sim.loop_device(&vol).await.unwrap(), None);

    // Re-attach under another name: the file is still there.
    attach_and_wait(&c, &vol, &inst, "/dev/xvdbc").await;
    let dev = resolve_device(&sim, &vol, "xvdbc", &image).await;
    let mount = MountGuard::mount(&dev, mnt.path()).unwrap();
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "written through aws-sdk-ec2 and a loop device\n"
    );
    mount.unmount().unwrap();

    // Shutting the simulator down (still attached) releases its loop devices.
    sim.shutdown().unwrap();
    assert!(image.exists());
    assert!(
        block::loops_backing(&image).unwrap().is_empty(),
        "loop devices left behind after shutdown"
    );
}
