//! Backing::Loop end to end: attach yields a real block device that mkfs.ext4 formats and
//! mount mounts; data survives detach, re-attach and a simulator restart.
#![allow(clippy::unwrap_used)] // helpers outside #[test] fns, test code all the same

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::loops::{LoopCleanup, backing_of, loops_of, skip_reason, wait_for};
use common::{Ec2, Sim, spawn_binary, start_with};
use ec2_sim::{Backing, SimConfig, Simulator, Timing};

/// Unmounts on drop (lazily, so a failing test still cleans up).
struct Mount(PathBuf);

impl Mount {
    fn new(device: &Path, dir: &Path) -> Mount {
        std::fs::create_dir_all(dir).unwrap();
        let st = Command::new("mount").arg(device).arg(dir).status().unwrap();
        assert!(st.success(), "mount {} {}", device.display(), dir.display());
        Mount(dir.to_path_buf())
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let st = Command::new("umount").arg(&self.0).status();
        if !st.map(|s| s.success()).unwrap_or(false) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

async fn attach(ec2: &Ec2, v: &str, i: &str, dev: &str) {
    ec2.ok(
        "AttachVolume",
        &[("VolumeId", v), ("InstanceId", i), ("Device", dev)],
    )
    .await;
    ec2.wait_attached(v).await;
}

async fn detach(ec2: &Ec2, v: &str) {
    ec2.ok("DetachVolume", &[("VolumeId", v)]).await;
    ec2.wait_status(v, "available").await;
}

fn loop_config(dir: &Path) -> SimConfig {
    SimConfig {
        state_dir: dir.join("state"),
        device_dir: Some(dir.join("dev")),
        backing: Backing::Loop,
        timing: Timing::Fast,
        ..SimConfig::default()
    }
}

#[tokio::test]
async fn loop_attach_format_mount_detach_reattach_restart() {
    if let Some(why) = skip_reason() {
        test_support::skip_or_fail(&format!("loop-device test: {why}"));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let config = loop_config(dir.path());
    let Sim {
        sim,
        ec2,
        dir: _sim_dir,
    } = start_with(config.clone()).await;
    let i = ec2.run_instance("us-east-1a").await;
    let v = ec2.create_volume("us-east-1a", "1", &[]).await;
    ec2.wait_status(&v, "available").await;
    let image = dir.path().join(format!("state/volumes/{v}.img"));
    let by_id = dir.path().join("dev/disk/by-id").join(format!(
        "nvme-Amazon_Elastic_Block_Store_{}",
        v.replace('-', "")
    ));
    assert_eq!(
        by_id.file_name().unwrap().to_str().unwrap(),
        format!("{}", ec2_sim::by_id_link_name(&v))
    );
    let named = dir.path().join("dev/xvdba");

    attach(&ec2, &v, &i, "/dev/xvdba").await;
    let loop_dev = sim.loop_device(&v).expect("a loop device while attached");
    assert_eq!(
        std::fs::read_link(&named).unwrap(),
        PathBuf::from(&loop_dev)
    );
    assert_eq!(
        std::fs::read_link(&by_id).unwrap(),
        PathBuf::from(&loop_dev)
    );
    let name = loop_dev.trim_start_matches("/dev/");
    let backing = std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")).unwrap();
    assert_eq!(
        Path::new(backing.trim()),
        image,
        "serial check: backing file is the image"
    );

    let mkfs = Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .arg(&by_id)
        .status()
        .unwrap();
    assert!(mkfs.success());
    let mnt = dir.path().join("mnt");
    {
        let _m = Mount::new(&named, &mnt);
        std::fs::write(mnt.join("hello.txt"), b"still here").unwrap();
    }
    detach(&ec2, &v).await;
    wait_for("symlinks removed", || {
        !named.exists() && std::fs::symlink_metadata(&by_id).is_err()
    })
    .await;
    wait_for("loop device released", || loops_of(&image).is_empty()).await;
    assert_eq!(sim.loop_device(&v), None);

    // Re-attach under another name: the data is there.
    attach(&ec2, &v, &i, "/dev/xvdbc").await;
    let named2 = dir.path().join("dev/xvdbc");
    {
        let _m = Mount::new(&named2, &mnt);
        assert_eq!(std::fs::read(mnt.join("hello.txt")).unwrap(), b"still here");
    }

    // Shutdown releases the device; the next start brings it back.
    sim.shutdown().await.unwrap();
    assert!(
        loops_of(&image).is_empty(),
        "shutdown released the loop device"
    );
    assert!(!named2.exists());
    let sim = Simulator::start(config, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let again = sim.loop_device(&v).expect("re-created at start");
    assert_eq!(std::fs::read_link(&named2).unwrap(), PathBuf::from(&again));
    {
        let _m = Mount::new(&by_id, &mnt);
        assert_eq!(std::fs::read(mnt.join("hello.txt")).unwrap(), b"still here");
    }
    sim.shutdown().await.unwrap();
    assert!(loops_of(&image).is_empty());
}

/// A detach while something still holds the loop device open only marks it for release at the
/// last close (autoclear). A re-attach in that window must not adopt the doomed device: at the
/// close it would be freed, the volume's links would point at a free device (or at whatever
/// image takes it next), and the next detach would cut off that other image.
#[tokio::test]
async fn reattach_while_the_old_device_is_still_open_gets_a_live_device() {
    if let Some(why) = skip_reason() {
        test_support::skip_or_fail(&format!("loop-device test: {why}"));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let Sim {
        sim,
        ec2,
        dir: _sim_dir,
    } = start_with(loop_config(dir.path())).await;
    let i = ec2.run_instance("us-east-1a").await;
    let v = ec2.create_volume("us-east-1a", "1", &[]).await;
    let w = ec2.create_volume("us-east-1a", "1", &[]).await;
    ec2.wait_status(&v, "available").await;
    ec2.wait_status(&w, "available").await;
    let v_image = dir.path().join(format!("state/volumes/{v}.img"));
    let w_image = dir.path().join(format!("state/volumes/{w}.img"));
    let _cleanup = (LoopCleanup(v_image.clone()), LoopCleanup(w_image.clone()));

    attach(&ec2, &v, &i, "/dev/xvdba").await;
    let first = PathBuf::from(sim.loop_device(&v).unwrap());
    let held = std::fs::File::open(&first).unwrap();
    detach(&ec2, &v).await;
    attach(&ec2, &v, &i, "/dev/xvdbc").await;
    let xvdbc = dir.path().join("dev/xvdbc");
    drop(held); // the old device is freed now, if it was marked for release
    let now = std::fs::read_link(&xvdbc).unwrap();
    assert_eq!(
        backing_of(&now),
        v_image.to_string_lossy(),
        "{} (the re-attached link) must still serve {v} after the old holder closed it",
        now.display()
    );

    // Another volume attached now, and the first detached again: the second keeps its device.
    attach(&ec2, &w, &i, "/dev/xvdbd").await;
    let w_dev = PathBuf::from(sim.loop_device(&w).unwrap());
    detach(&ec2, &v).await;
    assert_eq!(backing_of(&w_dev), w_image.to_string_lossy());
    detach(&ec2, &w).await;
    sim.shutdown().await.unwrap();
    assert!(loops_of(&v_image).is_empty() && loops_of(&w_image).is_empty());
}

#[tokio::test]
async fn sigkilled_binary_leaks_nothing_for_good() {
    if let Some(why) = skip_reason() {
        test_support::skip_or_fail(&format!("loop-device test: {why}"));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let devdir = dir.path().join("dev");
    let args = [
        "--state-dir",
        state.to_str().unwrap(),
        "--device-dir",
        devdir.to_str().unwrap(),
        "--backing",
        "loop",
        "--timing",
        "fast",
    ];
    let (mut child, addr, _log) = spawn_binary(&args);
    let ec2 = Ec2::new(addr);
    let i = ec2.run_instance("us-east-1a").await;
    let v = ec2.create_volume("us-east-1a", "1", &[]).await;
    ec2.wait_status(&v, "available").await;
    let image = state.join(format!("volumes/{v}.img"));
    let _cleanup = LoopCleanup(image.clone());
    attach(&ec2, &v, &i, "/dev/xvdba").await;
    wait_for("loop device", || loops_of(&image).len() == 1).await;
    let first = loops_of(&image);
    child.0.kill().unwrap(); // SIGKILL: nothing is released
    child.0.wait().unwrap();
    assert_eq!(loops_of(&image), first, "the device outlives the process");

    let (mut child, addr, log) = spawn_binary(&args);
    let ec2 = Ec2::new(addr);
    assert_eq!(
        ec2.volume(&v).await.at("attachmentSet/item/status"),
        "attached"
    );
    assert_eq!(loops_of(&image), first, "re-adopted, not duplicated");
    {
        let log = log.lock().unwrap();
        assert!(
            log.iter()
                .any(|l| l.contains("re-adopted loop device") && l.contains(&first[0])),
            "the leftover device was adopted, not released and re-created: {log:?}"
        );
        assert!(!log.iter().any(|l| l.contains("released")), "{log:?}");
    }
    let link = std::fs::read_link(devdir.join("xvdba")).unwrap();
    assert_eq!(link, PathBuf::from(&first[0]));
    // Detach while the new process runs: the adopted device is released.
    detach(&ec2, &v).await;
    wait_for("release", || loops_of(&image).is_empty()).await;
    test_support::process::sigterm(&child.0);
    let _ = child.0.wait();
}

#[tokio::test]
async fn no_device_while_attaching_or_after_aborted_attach() {
    if let Some(why) = skip_reason() {
        test_support::skip_or_fail(&format!("loop-device test: {why}"));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s = start_with(loop_config(dir.path())).await;
    let i = s.ec2.run_instance("us-east-1a").await;
    let v = s.ec2.create_volume("us-east-1a", "1", &[]).await;
    s.ec2.wait_status(&v, "available").await;
    let image = dir.path().join(format!("state/volumes/{v}.img"));
    let _cleanup = LoopCleanup(image.clone());
    s.sim.set_faults(ec2_sim::Faults {
        stuck_attaching: vec![v.clone()],
        stuck_detaching_all: true,
        ..ec2_sim::Faults::default()
    });
    s.ec2
        .ok(
            "AttachVolume",
            &[
                ("VolumeId", &v),
                ("InstanceId", &i),
                ("Device", "/dev/xvdba"),
            ],
        )
        .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        s.ec2.volume(&v).await.at("attachmentSet/item/status"),
        "attaching"
    );
    assert!(loops_of(&image).is_empty(), "no device while attaching");
    assert!(std::fs::symlink_metadata(dir.path().join("dev/xvdba")).is_err());
    // Give up on the attach: it never had a device, and none appears while detaching.
    s.ec2.ok("DetachVolume", &[("VolumeId", &v)]).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        s.ec2.volume(&v).await.at("attachmentSet/item/status"),
        "detaching"
    );
    assert!(loops_of(&image).is_empty(), "no device while detaching");
    s.ec2
        .ok("DetachVolume", &[("VolumeId", &v), ("Force", "true")])
        .await;
    s.ec2.wait_status(&v, "available").await;
    assert!(loops_of(&image).is_empty());
    s.sim.shutdown().await.unwrap();
}

#[tokio::test]
async fn detach_waits_for_unmount_when_asked() {
    if let Some(why) = skip_reason() {
        test_support::skip_or_fail(&format!("loop-device test: {why}"));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut config = loop_config(dir.path());
    config.faults.detach_waits_for_unmount = true;
    let s = start_with(config).await;
    let i = s.ec2.run_instance("us-east-1a").await;
    let v = s.ec2.create_volume("us-east-1a", "1", &[]).await;
    s.ec2.wait_status(&v, "available").await;
    let image = dir.path().join(format!("state/volumes/{v}.img"));
    let _cleanup = LoopCleanup(image.clone());
    attach(&s.ec2, &v, &i, "/dev/xvdba").await;
    let dev = dir.path().join("dev/xvdba");
    let mkfs = Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .arg(&dev)
        .status()
        .unwrap();
    assert!(mkfs.success());
    let mnt = dir.path().join("mnt");
    let mount = Mount::new(&dev, &mnt);
    s.ec2.ok("DetachVolume", &[("VolumeId", &v)]).await;
    // Well past the Fast detach time, the mounted device keeps it detaching, as on AWS.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        s.ec2.volume(&v).await.at("attachmentSet/item/status"),
        "detaching"
    );
    assert_eq!(loops_of(&image).len(), 1);
    drop(mount);
    s.ec2.wait_status(&v, "available").await;
    wait_for("release", || loops_of(&image).is_empty()).await;
    // Held back until the unmount, so the record has no detach under a mounted device.
    assert!(
        s.sim
            .attachment_history()
            .detached_while_in_use()
            .is_empty()
    );
    s.sim.shutdown().await.unwrap();
}

/// Without `detach_waits_for_unmount` a detach finishes under a mounted device, as a stack
/// that detaches before it unmounts would make it; the attachment history marks exactly that
/// detach, not one that came after the unmount.
#[tokio::test]
async fn the_history_marks_a_detach_under_a_mounted_device() {
    if let Some(why) = skip_reason() {
        test_support::skip_or_fail(&format!("loop-device test: {why}"));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s = start_with(loop_config(dir.path())).await;
    let i = s.ec2.run_instance("us-east-1a").await;
    let v = s.ec2.create_volume("us-east-1a", "1", &[]).await;
    s.ec2.wait_status(&v, "available").await;
    let image = dir.path().join(format!("state/volumes/{v}.img"));
    let _cleanup = LoopCleanup(image.clone());
    attach(&s.ec2, &v, &i, "/dev/xvdba").await;
    let dev = dir.path().join("dev/xvdba");
    let mkfs = Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .arg(&dev)
        .status()
        .unwrap();
    assert!(mkfs.success());
    let mnt = dir.path().join("mnt");
    let mount = Mount::new(&dev, &mnt);
    detach(&s.ec2, &v).await;
    drop(mount);
    attach(&s.ec2, &v, &i, "/dev/xvdbb").await;
    detach(&s.ec2, &v).await;
    let h = s.sim.attachment_history();
    let detached: Vec<bool> = h
        .of_volume(&v)
        .filter(|e| e.state == ec2_sim::AttachmentState::Detached)
        .map(|e| e.device_in_use)
        .collect();
    assert_eq!(detached, vec![true, false], "{:#?}", h.events);
    assert_eq!(h.detached_while_in_use().len(), 1);
    wait_for("release", || loops_of(&image).is_empty()).await;
    s.sim.shutdown().await.unwrap();
}

#[tokio::test]
async fn launch_volumes_get_loop_devices_and_go_with_the_instance() {
    if let Some(why) = skip_reason() {
        test_support::skip_or_fail(&format!("loop-device test: {why}"));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s = start_with(loop_config(dir.path())).await;
    let x = s
        .ec2
        .ok(
            "RunInstances",
            &[
                ("ImageId", "ami-12345678"),
                ("MinCount", "1"),
                ("MaxCount", "1"),
                ("Placement.AvailabilityZone", "us-east-1a"),
                ("BlockDeviceMapping.1.DeviceName", "/dev/sdf"),
                ("BlockDeviceMapping.1.Ebs.VolumeSize", "1"),
                ("BlockDeviceMapping.1.Ebs.VolumeType", "gp3"),
                // 64 TiB: on ext4 the image is capped below 16 TiB, and the device with it.
                ("BlockDeviceMapping.2.DeviceName", "/dev/sdg"),
                ("BlockDeviceMapping.2.Ebs.VolumeSize", "65536"),
                ("BlockDeviceMapping.2.Ebs.VolumeType", "io2"),
                ("BlockDeviceMapping.2.Ebs.Iops", "1000"),
                ("BlockDeviceMapping.2.Ebs.DeleteOnTermination", "false"),
            ],
        )
        .await;
    let inst = x.at("instancesSet/item/instanceId");
    let d = s
        .ec2
        .ok("DescribeInstances", &[("InstanceId.1", &inst)])
        .await;
    let maps = d.all("reservationSet/item/instancesSet/item/blockDeviceMapping/item");
    let volume_at = |dev: &str| {
        maps.iter()
            .find(|m| m.get("deviceName") == dev)
            .map(|m| m.at("ebs/volumeId"))
            .unwrap()
    };
    let (vf, vg) = (volume_at("/dev/sdf"), volume_at("/dev/sdg"));
    let image_f = dir.path().join(format!("state/volumes/{vf}.img"));
    let image_g = dir.path().join(format!("state/volumes/{vg}.img"));
    let _cleanup = (LoopCleanup(image_f.clone()), LoopCleanup(image_g.clone()));
    s.ec2.wait_attached(&vf).await;
    s.ec2.wait_attached(&vg).await;

    let dev_f = dir.path().join("dev/sdf");
    let by_id = dir
        .path()
        .join("dev/disk/by-id")
        .join(ec2_sim::by_id_link_name(&vf));
    wait_for("sdf link", || dev_f.exists() && by_id.exists()).await;
    assert_eq!(
        std::fs::read_link(&dev_f).unwrap(),
        std::fs::read_link(&by_id).unwrap()
    );
    let mkfs = Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .arg(&dev_f)
        .status()
        .unwrap();
    assert!(mkfs.success());

    // The big volume's device is exactly its (possibly capped) image.
    let dev_g = dir.path().join("dev/sdg");
    wait_for("sdg link", || dev_g.exists()).await;
    let loop_g = std::fs::read_link(&dev_g).unwrap();
    let name = loop_g.file_name().unwrap().to_str().unwrap().to_string();
    let sectors: u64 = std::fs::read_to_string(format!("/sys/block/{name}/size"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let image_len = std::fs::metadata(&image_g).unwrap().len();
    assert_eq!(sectors * 512, image_len);
    assert_eq!(s.ec2.volume(&vg).await.get("size"), "65536");

    s.ec2
        .ok("TerminateInstances", &[("InstanceId.1", &inst)])
        .await;
    s.ec2.wait_status(&vg, "available").await;
    wait_for("launch volume deleted", || !image_f.exists()).await;
    wait_for("devices released", || {
        loops_of(&image_f).is_empty() && loops_of(&image_g).is_empty()
    })
    .await;
    assert!(!dev_f.exists() && !by_id.exists() && !dev_g.exists());
    assert!(
        image_g.exists(),
        "DeleteOnTermination=false keeps the volume"
    );
    s.sim.shutdown().await.unwrap();
}
