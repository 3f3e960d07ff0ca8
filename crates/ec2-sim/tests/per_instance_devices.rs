//! `DeviceLayout::PerInstance` with real loop devices: every instance's links live in
//! `DEVDIR/<instance-id>/`, so two instances (two nodes, two `--dev-root`s) can use the same
//! device name for different volumes, and a Multi-Attach volume shows up in each of them.
#![allow(clippy::unwrap_used)] // helpers outside #[test] fns, test code all the same

mod common;

use std::path::{Path, PathBuf};

use common::loops::{LoopCleanup, VolumesCleanup, backing_of, loops_of, skip_reason, wait_for};
use common::{Ec2, Sim, spawn_binary, start_with};
use ec2_sim::{Backing, DeviceLayout, SimConfig, Simulator, Timing, instance_device_dir};

fn per_instance_config(dir: &Path) -> SimConfig {
    SimConfig {
        state_dir: dir.join("state"),
        device_dir: Some(dir.join("dev")),
        backing: Backing::Loop,
        device_layout: DeviceLayout::PerInstance,
        timing: Timing::Fast,
        ..SimConfig::default()
    }
}

/// Waits until `instance`'s attachment of `volume` is in `state` ("" = no such attachment).
async fn wait_attachment(ec2: &Ec2, volume: &str, instance: &str, state: &str) {
    ec2.wait_volume(volume, &format!("{state:?} on {instance}"), |v| {
        v.all("attachmentSet/item")
            .iter()
            .find(|a| a.get("instanceId") == instance)
            .map(|a| a.get("status"))
            .unwrap_or_default()
            == state
    })
    .await;
}

async fn attach(ec2: &Ec2, volume: &str, instance: &str, device: &str) {
    ec2.ok(
        "AttachVolume",
        &[
            ("VolumeId", volume),
            ("InstanceId", instance),
            ("Device", device),
        ],
    )
    .await;
    wait_attachment(ec2, volume, instance, "attached").await;
}

async fn detach(ec2: &Ec2, volume: &str, instance: &str) {
    ec2.ok(
        "DetachVolume",
        &[("VolumeId", volume), ("InstanceId", instance)],
    )
    .await;
    wait_attachment(ec2, volume, instance, "").await;
}

fn by_id(root: &Path, volume: &str) -> PathBuf {
    root.join("disk/by-id")
        .join(ec2_sim::by_id_link_name(volume))
}

fn link(path: &Path) -> Option<PathBuf> {
    std::fs::read_link(path).ok()
}

/// Both of `volume`'s links under `root` point at `dev`, which serves `volume`'s image.
fn assert_links(root: &Path, name: &str, volume: &str, dev: &Path, image: &Path) {
    assert_eq!(link(&root.join(name)).as_deref(), Some(dev), "{name} link");
    assert_eq!(
        link(&by_id(root, volume)).as_deref(),
        Some(dev),
        "by-id link of {volume} in {}",
        root.display()
    );
    assert_eq!(
        backing_of(dev),
        image.to_string_lossy(),
        "{} serves {volume}",
        dev.display()
    );
}

#[tokio::test]
async fn two_instances_use_one_device_name_for_two_volumes() {
    if let Some(why) = skip_reason() {
        test_support::skip_or_fail(&format!("loop-device test: {why}"));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let config = per_instance_config(dir.path());
    let devdir = dir.path().join("dev");
    let Sim {
        sim,
        ec2,
        dir: _sim_dir,
    } = start_with(config.clone()).await;
    let i1 = ec2.run_instance("us-east-1a").await;
    let i2 = ec2.run_instance("us-east-1a").await;
    let v1 = ec2.create_volume("us-east-1a", "1", &[]).await;
    let v2 = ec2.create_volume("us-east-1a", "1", &[]).await;
    ec2.wait_status(&v1, "available").await;
    ec2.wait_status(&v2, "available").await;
    let image1 = dir.path().join(format!("state/volumes/{v1}.img"));
    let image2 = dir.path().join(format!("state/volumes/{v2}.img"));
    let _cleanup = (LoopCleanup(image1.clone()), LoopCleanup(image2.clone()));
    let (root1, root2) = (
        instance_device_dir(&devdir, &i1),
        instance_device_dir(&devdir, &i2),
    );
    assert_eq!(root1, devdir.join(&i1));
    assert_eq!(sim.node_dev_root(&i1), root1);
    assert_eq!(sim.node_dev_root(&i2), root2);

    attach(&ec2, &v1, &i1, "/dev/xvdba").await;
    attach(&ec2, &v2, &i2, "/dev/xvdba").await;
    let dev1 = PathBuf::from(sim.loop_device(&v1).unwrap());
    let dev2 = PathBuf::from(sim.loop_device(&v2).unwrap());
    assert_ne!(dev1, dev2);
    assert_links(&root1, "xvdba", &v1, &dev1, &image1);
    assert_links(&root2, "xvdba", &v2, &dev2, &image2);
    assert!(link(&by_id(&root1, &v2)).is_none(), "{v2} is not on {i1}");
    assert!(link(&by_id(&root2, &v1)).is_none(), "{v1} is not on {i2}");
    assert!(
        link(&devdir.join("xvdba")).is_none() && link(&by_id(&devdir, &v1)).is_none(),
        "nothing in the shared dir"
    );

    // Detaching from one instance leaves the other's links (of the same name) alone.
    detach(&ec2, &v1, &i1).await;
    wait_for("v1's device released", || loops_of(&image1).is_empty()).await;
    assert!(link(&root1.join("xvdba")).is_none());
    assert!(link(&by_id(&root1, &v1)).is_none());
    assert_eq!(sim.loop_device(&v1), None);
    assert_links(&root2, "xvdba", &v2, &dev2, &image2);

    // The name is free on i1 again, for another volume.
    attach(&ec2, &v1, &i1, "/dev/xvdba").await;
    let dev1 = PathBuf::from(sim.loop_device(&v1).unwrap());
    assert_links(&root1, "xvdba", &v1, &dev1, &image1);
    assert_links(&root2, "xvdba", &v2, &dev2, &image2);

    // Shutdown releases both; the next start brings each back in its own instance's dir.
    sim.shutdown().await.unwrap();
    assert!(loops_of(&image1).is_empty() && loops_of(&image2).is_empty());
    assert!(link(&root1.join("xvdba")).is_none() && link(&root2.join("xvdba")).is_none());
    let sim = Simulator::start(config, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let dev1 = PathBuf::from(sim.loop_device(&v1).unwrap());
    let dev2 = PathBuf::from(sim.loop_device(&v2).unwrap());
    assert_links(&root1, "xvdba", &v1, &dev1, &image1);
    assert_links(&root2, "xvdba", &v2, &dev2, &image2);
    assert_eq!((loops_of(&image1).len(), loops_of(&image2).len()), (1, 1));
    sim.shutdown().await.unwrap();
    assert!(loops_of(&image1).is_empty() && loops_of(&image2).is_empty());
}

#[tokio::test]
async fn multi_attach_volume_has_links_in_each_instance_dir() {
    if let Some(why) = skip_reason() {
        test_support::skip_or_fail(&format!("loop-device test: {why}"));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let devdir = dir.path().join("dev");
    let Sim {
        sim,
        ec2,
        dir: _sim_dir,
    } = start_with(per_instance_config(dir.path())).await;
    let i1 = ec2.run_instance("us-east-1a").await;
    let i2 = ec2.run_instance("us-east-1a").await;
    let v = ec2
        .ok(
            "CreateVolume",
            &[
                ("AvailabilityZone", "us-east-1a"),
                ("Size", "4"),
                ("VolumeType", "io2"),
                ("Iops", "100"),
                ("MultiAttachEnabled", "true"),
            ],
        )
        .await
        .get("volumeId");
    ec2.wait_status(&v, "available").await;
    let image = dir.path().join(format!("state/volumes/{v}.img"));
    let _cleanup = LoopCleanup(image.clone());
    let (root1, root2) = (sim.node_dev_root(&i1), sim.node_dev_root(&i2));

    attach(&ec2, &v, &i1, "/dev/xvdba").await;
    attach(&ec2, &v, &i2, "/dev/xvdbb").await;
    let dev = PathBuf::from(sim.loop_device(&v).unwrap());
    assert_eq!(loops_of(&image), vec![dev.to_string_lossy().to_string()]);
    assert_links(&root1, "xvdba", &v, &dev, &image);
    assert_links(&root2, "xvdbb", &v, &dev, &image);
    assert!(link(&root1.join("xvdbb")).is_none() && link(&root2.join("xvdba")).is_none());

    // Detach from i1: its links go, the device stays for i2.
    detach(&ec2, &v, &i1).await;
    wait_for("i1's links removed", || {
        link(&root1.join("xvdba")).is_none() && link(&by_id(&root1, &v)).is_none()
    })
    .await;
    assert_eq!(sim.loop_device(&v).map(PathBuf::from), Some(dev.clone()));
    assert_eq!(loops_of(&image).len(), 1);
    assert_links(&root2, "xvdbb", &v, &dev, &image);

    // Detach from i2 as well: no attachment needs the device any more.
    detach(&ec2, &v, &i2).await;
    ec2.wait_status(&v, "available").await;
    wait_for("device released", || loops_of(&image).is_empty()).await;
    assert!(link(&root2.join("xvdbb")).is_none() && link(&by_id(&root2, &v)).is_none());
    assert!(!devdir.join("disk").exists(), "no shared by-id dir");
    sim.shutdown().await.unwrap();
}

#[tokio::test]
async fn sigkilled_binary_readopts_per_instance_devices_and_sweeps_stale_links() {
    if let Some(why) = skip_reason() {
        test_support::skip_or_fail(&format!("loop-device test: {why}"));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let devdir = dir.path().join("dev");
    // Before the child: on failure the child is killed first, then its devices detached.
    let _cleanup = VolumesCleanup(state.clone());
    let args = [
        "--state-dir",
        state.to_str().unwrap(),
        "--device-dir",
        devdir.to_str().unwrap(),
        "--backing",
        "loop",
        "--timing",
        "fast",
        "--per-instance-device-dirs",
    ];
    let (mut child, addr, _log) = spawn_binary(&args);
    let ec2 = Ec2::new(addr);
    let i1 = ec2.run_instance("us-east-1a").await;
    let i2 = ec2.run_instance("us-east-1a").await;
    let v1 = ec2.create_volume("us-east-1a", "1", &[]).await;
    let v2 = ec2.create_volume("us-east-1a", "1", &[]).await;
    ec2.wait_status(&v1, "available").await;
    ec2.wait_status(&v2, "available").await;
    let image1 = state.join(format!("volumes/{v1}.img"));
    let image2 = state.join(format!("volumes/{v2}.img"));
    attach(&ec2, &v1, &i1, "/dev/xvdba").await;
    attach(&ec2, &v2, &i2, "/dev/xvdba").await;
    let (root1, root2) = (
        instance_device_dir(&devdir, &i1),
        instance_device_dir(&devdir, &i2),
    );
    wait_for("both devices and links", || {
        loops_of(&image1).len() == 1
            && loops_of(&image2).len() == 1
            && link(&root1.join("xvdba")).is_some()
            && link(&root2.join("xvdba")).is_some()
    })
    .await;
    let (first1, first2) = (loops_of(&image1), loops_of(&image2));
    let (dev1, dev2) = (PathBuf::from(&first1[0]), PathBuf::from(&first2[0]));
    assert_links(&root1, "xvdba", &v1, &dev1, &image1);
    assert_links(&root2, "xvdba", &v2, &dev2, &image2);

    child.0.kill().unwrap(); // SIGKILL: nothing is released
    child.0.wait().unwrap();
    assert_eq!(
        (loops_of(&image1), loops_of(&image2)),
        (first1.clone(), first2.clone())
    );
    // Links of attachments that are gone (as a detach finishing while the process was dead
    // would leave them): the next start removes them.
    let stale_name = root1.join("xvdbz");
    let stale_by_id = by_id(&root2, "vol-00000000000000000");
    std::os::unix::fs::symlink("/dev/null", &stale_name).unwrap();
    std::os::unix::fs::symlink("/dev/null", &stale_by_id).unwrap();

    let (mut child, addr, log) = spawn_binary(&args);
    let ec2 = Ec2::new(addr);
    for v in [&v1, &v2] {
        assert_eq!(
            ec2.volume(v).await.at("attachmentSet/item/status"),
            "attached"
        );
    }
    assert_eq!(
        (loops_of(&image1), loops_of(&image2)),
        (first1.clone(), first2.clone()),
        "re-adopted, not duplicated"
    );
    {
        let log = log.lock().unwrap();
        for dev in [&first1[0], &first2[0]] {
            assert!(
                log.iter()
                    .any(|l| l.contains("re-adopted loop device") && l.contains(dev.as_str())),
                "{dev} was adopted, not released and re-created: {log:?}"
            );
        }
        assert!(!log.iter().any(|l| l.contains("released")), "{log:?}");
    }
    assert_links(&root1, "xvdba", &v1, &dev1, &image1);
    assert_links(&root2, "xvdba", &v2, &dev2, &image2);
    assert!(
        std::fs::symlink_metadata(&stale_name).is_err(),
        "stale name link swept"
    );
    assert!(
        std::fs::symlink_metadata(&stale_by_id).is_err(),
        "stale by-id link swept"
    );

    // The adopted devices are released like any other: i1's at detach, i2's at SIGTERM.
    detach(&ec2, &v1, &i1).await;
    wait_for("v1 released", || loops_of(&image1).is_empty()).await;
    assert!(link(&root1.join("xvdba")).is_none());
    assert_links(&root2, "xvdba", &v2, &dev2, &image2);
    test_support::process::sigterm(&child.0);
    assert!(child.0.wait().unwrap().success());
    assert!(loops_of(&image2).is_empty(), "SIGTERM released v2's device");
    assert!(link(&root2.join("xvdba")).is_none());
}
