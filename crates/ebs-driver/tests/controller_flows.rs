//! Whole flows over the real socket: the volume lifecycle with real mounts (data survives
//! unstage/stage and detach/attach), 100 concurrent publishes, the attach limit,
//! "Kubernetes changes its mind" (the EBS driver design, docs/design/ebs-driver.md), and faults
//! from ec2-sim.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod ctl;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use ctl::{
    Driver, Env, GIB, attach, create, create_req, delete_req, expect_code, mount_cap,
    node_publish_req, node_stage_req, node_unpublish_req, node_unstage_req, publish_req,
    unpublish_req,
};
use ebs_cloud::Cloud;
use ebs_driver::Mode as DriverMode;
use ec2_sim::{Backing, Faults, Throttle, Timing};
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_survives_unstage_stage_and_detach_attach() {
    if !ctl::block_parts_or_skip("this test needs loop devices and mkfs/mount") {
        return;
    }
    let env = Env::start(Timing::Fast, Backing::Loop, 26).await;
    let d = Driver::start(env.driver_config(DriverMode::All)).await;
    let (mut c, mut n) = (d.controller(), d.node());
    let v = create(&mut c, create_req("pvc-life", GIB)).await;
    let staging = env.path("staging");
    let target = env.path("target");
    std::fs::create_dir_all(&staging).unwrap();
    let (staging_s, target_s) = (staging.display().to_string(), target.display().to_string());
    let stage = |dev: String| node_stage_req(&v.volume_id, &dev, &staging_s, mount_cap());
    let publish =
        |dev: String| node_publish_req(&v.volume_id, &dev, &staging_s, &target_s, mount_cap());
    let unpublish = node_unpublish_req(&v.volume_id, &target_s);
    let unstage = node_unstage_req(&v.volume_id, &staging_s);

    let dev = attach(&mut c, &v.volume_id, &env.node_id).await;
    n.node_stage_volume(stage(dev.clone())).await.unwrap();
    n.node_publish_volume(publish(dev.clone())).await.unwrap();
    std::fs::write(target.join("data.txt"), "survives\n").unwrap();
    n.node_unpublish_volume(unpublish.clone()).await.unwrap();
    n.node_unstage_volume(unstage.clone()).await.unwrap();
    // Stage again on the same attachment: the data is there.
    n.node_stage_volume(stage(dev.clone())).await.unwrap();
    n.node_publish_volume(publish(dev.clone())).await.unwrap();
    assert_eq!(
        std::fs::read_to_string(target.join("data.txt")).unwrap(),
        "survives\n"
    );
    n.node_unpublish_volume(unpublish.clone()).await.unwrap();
    n.node_unstage_volume(unstage.clone()).await.unwrap();
    // Detach and attach again.
    c.controller_unpublish_volume(unpublish_req(&v.volume_id, &env.node_id))
        .await
        .unwrap();
    assert!(
        env.cloud
            .get_disk_by_id(&v.volume_id)
            .await
            .unwrap()
            .attachments
            .is_empty()
    );
    let dev2 = attach(&mut c, &v.volume_id, &env.node_id).await;
    n.node_stage_volume(stage(dev2.clone())).await.unwrap();
    n.node_publish_volume(publish(dev2.clone())).await.unwrap();
    assert_eq!(
        std::fs::read_to_string(target.join("data.txt")).unwrap(),
        "survives\n"
    );
    n.node_unpublish_volume(unpublish).await.unwrap();
    n.node_unstage_volume(unstage).await.unwrap();
    c.controller_unpublish_volume(unpublish_req(&v.volume_id, &env.node_id))
        .await
        .unwrap();
    c.delete_volume(delete_req(&v.volume_id)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_concurrent_publishes_get_distinct_devices() {
    let env = Env::start(Timing::Fast, Backing::File, 128).await;
    let mut config = env.driver_config(DriverMode::Controller);
    config.controller.publish.attach_limit = Some(128);
    let d = Driver::start(config).await;
    let mut c = d.controller();
    let mut vols = Vec::new();
    for i in 0..100 {
        vols.push(
            create(&mut c, create_req(&format!("pvc-many-{i}"), GIB))
                .await
                .volume_id,
        );
    }
    let mut tasks = Vec::new();
    for v in vols.clone() {
        let mut c = d.controller();
        let node = env.node_id.clone();
        tasks.push(tokio::spawn(async move {
            c.controller_publish_volume(publish_req(&v, &node))
                .await
                .map(|r| r.into_inner().publish_context["devicePath"].clone())
        }));
    }
    let mut devices = BTreeSet::new();
    for t in tasks {
        devices.insert(t.await.unwrap().unwrap());
    }
    assert_eq!(devices.len(), 100, "every volume has its own device name");
    let inst = env.cloud.get_instance(&env.node_id).await.unwrap();
    assert_eq!(inst.devices.len(), 100);
}

#[tokio::test]
async fn the_attach_limit_is_resource_exhausted() {
    let env = Env::start(Timing::Fast, Backing::File, 26).await;
    let mut config = env.driver_config(DriverMode::Controller);
    config.controller.publish.attach_limit = Some(3);
    let d = Driver::start(config).await;
    let mut c = d.controller();
    for i in 0..3 {
        let v = create(&mut c, create_req(&format!("pvc-lim-{i}"), GIB)).await;
        c.controller_publish_volume(publish_req(&v.volume_id, &env.node_id))
            .await
            .unwrap();
    }
    let v = create(&mut c, create_req("pvc-lim-x", GIB)).await;
    expect_code(
        c.controller_publish_volume(publish_req(&v.volume_id, &env.node_id))
            .await,
        Code::ResourceExhausted,
        &env.node_id,
    );
    // EC2's own limit (the sim's 26 attachment slots) maps to the same code.
    let env2 = Env::start(Timing::Fast, Backing::File, 2).await;
    let mut config = env2.driver_config(DriverMode::Controller);
    config.controller.publish.attach_limit = None;
    let d2 = Driver::start(config).await;
    let mut c2 = d2.controller();
    for i in 0..2 {
        let v = create(&mut c2, create_req(&format!("pvc-ec2-{i}"), GIB)).await;
        c2.controller_publish_volume(publish_req(&v.volume_id, &env2.node_id))
            .await
            .unwrap();
    }
    let v = create(&mut c2, create_req("pvc-ec2-x", GIB)).await;
    let err = c2
        .controller_publish_volume(publish_req(&v.volume_id, &env2.node_id))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{}", err.message());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_publishes_never_overshoot_the_attach_limit() {
    // Realistic timing: attaches take seconds, so all ten publishes are in flight together and
    // DescribeInstances cannot yet show the others' attachments.
    let env = Env::start(Timing::Realistic, Backing::File, 26).await;
    let mut config = env.driver_config(DriverMode::Controller);
    config.controller.publish.attach_limit = Some(4);
    let d = Driver::start(config).await;
    let mut c = d.controller();
    let mut vols = Vec::new();
    for i in 0..10 {
        vols.push(
            create(&mut c, create_req(&format!("pvc-race-{i}"), GIB))
                .await
                .volume_id,
        );
    }
    let mut tasks = Vec::new();
    for v in vols {
        let mut c = d.controller();
        let node = env.node_id.clone();
        tasks.push(tokio::spawn(async move {
            c.controller_publish_volume(publish_req(&v, &node))
                .await
                .map(|_| ())
                .map_err(|s| s.code())
        }));
    }
    let mut ok = 0;
    let mut exhausted = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(()) => ok += 1,
            Err(Code::ResourceExhausted) => exhausted += 1,
            Err(other) => panic!("unexpected code {other:?}"),
        }
    }
    assert_eq!((ok, exhausted), (4, 6));
    let inst = env.cloud.get_instance(&env.node_id).await.unwrap();
    assert_eq!(
        inst.devices.len(),
        4,
        "EC2 shows exactly the limit attached"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_call_wins_when_kubernetes_changes_its_mind() {
    let env = Env::start(Timing::Fast, Backing::File, 26).await;
    let d = Driver::start(env.driver_config(DriverMode::Controller)).await;
    let mut c = d.controller();
    let v = create(&mut c, create_req("pvc-mind", GIB)).await;

    // Unpublish during an in-flight Publish: the attach is stuck, so the Publish is in flight.
    env.sim.set_faults(Faults {
        stuck_attaching: vec![v.volume_id.clone()],
        ..Faults::default()
    });
    let mut c1 = d.controller();
    let (vid, node) = (v.volume_id.clone(), env.node_id.clone());
    let publish =
        tokio::spawn(async move { c1.controller_publish_volume(publish_req(&vid, &node)).await });
    // Wait until the attach was sent.
    env.wait_for_calls("AttachVolume", 1).await;
    // A repeat of the same call while it runs: Aborted.
    expect_code(
        c.controller_publish_volume(publish_req(&v.volume_id, &env.node_id))
            .await,
        Code::Aborted,
        &v.volume_id,
    );
    let mut c2 = d.controller();
    let (vid, node) = (v.volume_id.clone(), env.node_id.clone());
    let unpublish = tokio::spawn(async move {
        c2.controller_unpublish_volume(unpublish_req(&vid, &node))
            .await
    });
    // The earlier Publish is superseded.
    let p = publish.await.unwrap();
    assert_eq!(p.unwrap_err().code(), Code::Aborted);
    // The attach completes once the fault is lifted; then it is detached (never forced). Lift
    // it only after the worker has polled the stuck attachment again.
    let polled = env.calls("DescribeVolumes");
    env.wait_for_calls("DescribeVolumes", polled + 2).await;
    env.sim.set_faults(Faults::default());
    unpublish.await.unwrap().unwrap();
    assert!(
        env.cloud
            .get_disk_by_id(&v.volume_id)
            .await
            .unwrap()
            .attachments
            .is_empty()
    );

    // Publish during an in-flight Unpublish: attach, then a detach that is stuck.
    c.controller_publish_volume(publish_req(&v.volume_id, &env.node_id))
        .await
        .unwrap();
    env.sim.set_faults(Faults {
        stuck_detaching: vec![v.volume_id.clone()],
        ..Faults::default()
    });
    let mut c3 = d.controller();
    let (vid, node) = (v.volume_id.clone(), env.node_id.clone());
    let unpublish = tokio::spawn(async move {
        c3.controller_unpublish_volume(unpublish_req(&vid, &node))
            .await
    });
    env.wait_for_calls("DetachVolume", 2).await;
    let mut c4 = d.controller();
    let (vid, node) = (v.volume_id.clone(), env.node_id.clone());
    let publish =
        tokio::spawn(async move { c4.controller_publish_volume(publish_req(&vid, &node)).await });
    assert_eq!(unpublish.await.unwrap().unwrap_err().code(), Code::Aborted);
    // Lift the fault only after the worker has polled the stuck detach again.
    let polled = env.calls("DescribeVolumes");
    env.wait_for_calls("DescribeVolumes", polled + 2).await;
    env.sim.set_faults(Faults::default());
    let device = publish.await.unwrap().unwrap().into_inner().publish_context["devicePath"].clone();
    let disk = env.cloud.get_disk_by_id(&v.volume_id).await.unwrap();
    assert_eq!(disk.attachments.len(), 1);
    assert_eq!(disk.attachments[0].device, device);
    assert_eq!(
        disk.attachments[0].state,
        ebs_cloud::AttachmentState::Attached
    );
    assert_eq!(
        env.sim.call_counts().get("DetachVolume").copied(),
        Some(2),
        "never a forced detach, no extra detach"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttling_and_slow_attach_converge() {
    let env = Env::start(Timing::Fast, Backing::File, 26).await;
    let d = Driver::start(env.driver_config(DriverMode::Controller)).await;
    let mut c = d.controller();
    env.sim.set_faults(Faults {
        throttle: vec![
            Throttle {
                action: Some("CreateVolume".into()),
                rate: 0.0,
                next: 2,
            },
            Throttle {
                action: Some("AttachVolume".into()),
                rate: 0.0,
                next: 2,
            },
            Throttle {
                action: Some("DescribeVolumes".into()),
                rate: 0.3,
                next: 0,
            },
        ],
        latency_ms: [("AttachVolume".to_string(), 300)].into_iter().collect(),
        ..Faults::default()
    });
    let vols: Vec<String> = {
        let mut v = Vec::new();
        for i in 0..5 {
            v.push(
                create(&mut c, create_req(&format!("pvc-thr-{i}"), GIB))
                    .await
                    .volume_id,
            );
        }
        v
    };
    let mut tasks = Vec::new();
    for v in vols.clone() {
        let mut c = d.controller();
        let node = env.node_id.clone();
        tasks.push(tokio::spawn(async move {
            c.controller_publish_volume(publish_req(&v, &node)).await
        }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    env.sim.set_faults(Faults::default());
    // Exactly one volume per name, each attached once.
    let inst = env.cloud.get_instance(&env.node_id).await.unwrap();
    assert_eq!(inst.devices.len(), 5);
    for i in 0..5 {
        assert!(
            env.cloud
                .get_disk_by_name(&format!("pvc-thr-{i}"))
                .await
                .unwrap()
                .is_some()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_attach_is_undone_and_its_device_name_tried_last() {
    let env = Env::start(Timing::Fast, Backing::File, 26).await;
    let mut config = env.driver_config(DriverMode::Controller);
    config.controller.publish.attach_timeout = Duration::from_millis(800);
    let d = Driver::start(config).await;
    let mut c = d.controller();
    let v = create(&mut c, create_req("pvc-stuck", GIB)).await;
    env.sim.set_faults(Faults {
        stuck_attaching: vec![v.volume_id.clone()],
        ..Faults::default()
    });
    let err = c
        .controller_publish_volume(publish_req(&v.volume_id, &env.node_id))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Internal, "{}", err.message());
    assert!(err.message().contains("attaching"), "{}", err.message());
    // Undone: no attachment is left behind.
    let disk = env.cloud.get_disk_by_id(&v.volume_id).await.unwrap();
    assert!(disk.attachments.is_empty(), "{:?}", disk.attachments);
    env.sim.set_faults(Faults::default());
    // The retry works, on another device name.
    let dev = attach(&mut c, &v.volume_id, &env.node_id).await;
    assert_ne!(dev, "/dev/xvdba", "the name that got stuck is tried last");
    let _ = Arc::new(());
}
