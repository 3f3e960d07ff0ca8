//! The CSI v1.12 error table of every RPC the driver implements, row by row, over the real unix
//! socket (the driver in mode all, EC2 from an in-process ec2-sim through the real SDK). The
//! table in docs/ebs-driver.md names the test that covers each row.
//!
//! The rule csi-sanity checks and these tests pin: a well-formed request that names a volume or
//! a path that is not there is NOT_FOUND, whatever the shape of the ID (an ID is opaque to the
//! CO); only a missing required field is INVALID_ARGUMENT.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod ctl;

use csi_spec::v1::controller_service_capability::rpc::Type as CtrlRpc;
use csi_spec::v1::node_service_capability::rpc::Type as NodeRpc;
use csi_spec::v1::volume_capability::access_mode::Mode;
use csi_spec::v1::*;
use ctl::{
    Driver, Env, GIB, attach, controller_rpcs, create, create_req, delete_req, expand_req,
    expect_code, mount_cap, node_publish_req, node_rpcs, node_stage_req, node_unpublish_req,
    node_unstage_req, publish_req, unpublish_req, validate_req,
};
use ebs_driver::Mode as DriverMode;
use ec2_sim::{Backing, Timing};
use tonic::Code;

/// Not an EBS volume ID at all: what csi-sanity's ID generator hands out.
const FAKE_VOLUME: &str = "fake-vol-id-0001";
/// Shaped like one, but no such volume exists.
const MISSING_VOLUME: &str = "vol-0aaaaaaaaaaaaaaaa";

/// The device path of requests for a volume that was never attached.
const DEVICE: &str = "/dev/xvdba";

fn stats_req(volume_id: &str, path: &str) -> NodeGetVolumeStatsRequest {
    NodeGetVolumeStatsRequest {
        volume_id: volume_id.into(),
        volume_path: path.into(),
        ..Default::default()
    }
}

fn node_expand_req(volume_id: &str, path: &str) -> NodeExpandVolumeRequest {
    NodeExpandVolumeRequest {
        volume_id: volume_id.into(),
        volume_path: path.into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn node_volume_or_path_not_there_is_not_found() {
    let env = Env::start(Timing::Fast, Backing::File, 26).await;
    let d = Driver::start(env.driver_config(DriverMode::All)).await;
    let mut n = d.node();
    let staging = env.path("staging").display().to_string();
    let target = env.path("target").display().to_string();
    let empty_dir = env.path("empty");
    std::fs::create_dir_all(&empty_dir).unwrap();
    let empty_dir = empty_dir.display().to_string();

    // An ID that cannot be an EBS volume names a volume that does not exist.
    expect_code(
        n.node_stage_volume(node_stage_req(FAKE_VOLUME, DEVICE, &staging, mount_cap()))
            .await,
        Code::NotFound,
        FAKE_VOLUME,
    );
    expect_code(
        n.node_publish_volume(node_publish_req(
            FAKE_VOLUME,
            DEVICE,
            &staging,
            &target,
            mount_cap(),
        ))
        .await,
        Code::NotFound,
        FAKE_VOLUME,
    );
    expect_code(
        n.node_unstage_volume(node_unstage_req(FAKE_VOLUME, &staging))
            .await,
        Code::NotFound,
        FAKE_VOLUME,
    );
    expect_code(
        n.node_unpublish_volume(node_unpublish_req(FAKE_VOLUME, &target))
            .await,
        Code::NotFound,
        FAKE_VOLUME,
    );

    // NodeGetVolumeStats: csi-sanity's "volume not found" (fake ID, relative path) and "volume
    // does not exist on the specified path" (real-looking ID, path that holds nothing).
    // (volume, path, what the message names)
    for (volume_id, path, needle) in [
        (FAKE_VOLUME, "some/path", FAKE_VOLUME),
        (MISSING_VOLUME, "some/path", "some/path"),
        (MISSING_VOLUME, "/nonexistent/volume", "/nonexistent/volume"),
        (MISSING_VOLUME, empty_dir.as_str(), empty_dir.as_str()),
    ] {
        expect_code(
            n.node_get_volume_stats(stats_req(volume_id, path)).await,
            Code::NotFound,
            needle,
        );
    }

    // NodeExpandVolume: the same three ways of not being there.
    for (volume_id, path, needle) in [
        (FAKE_VOLUME, "some/path", FAKE_VOLUME),
        (MISSING_VOLUME, "some/path", "some/path"),
        (MISSING_VOLUME, empty_dir.as_str(), empty_dir.as_str()),
    ] {
        expect_code(
            n.node_expand_volume(node_expand_req(volume_id, path)).await,
            Code::NotFound,
            needle,
        );
    }

    // A real-looking volume that never got attached: its device never appears.
    let mut cfg = env.driver_config(DriverMode::Node);
    cfg.node.device_wait = std::time::Duration::from_millis(100);
    let quick = Driver::start(cfg).await;
    expect_code(
        quick
            .node()
            .node_stage_volume(node_stage_req(
                MISSING_VOLUME,
                DEVICE,
                &staging,
                mount_cap(),
            ))
            .await,
        Code::NotFound,
        MISSING_VOLUME,
    );
}

#[tokio::test]
async fn node_idempotent_teardown_and_preconditions() {
    let env = Env::start(Timing::Fast, Backing::File, 26).await;
    let d = Driver::start(env.driver_config(DriverMode::All)).await;
    let mut n = d.node();
    let staging = env.path("staging").display().to_string();
    let target = env.path("target").display().to_string();

    // Nothing staged or published there: the work is already done.
    n.node_unstage_volume(node_unstage_req(MISSING_VOLUME, &staging))
        .await
        .unwrap();
    n.node_unpublish_volume(node_unpublish_req(MISSING_VOLUME, &target))
        .await
        .unwrap();

    // NodePublish, "staging target path not set": STAGE_UNSTAGE_VOLUME is advertised.
    expect_code(
        n.node_publish_volume(node_publish_req(
            MISSING_VOLUME,
            DEVICE,
            "",
            &target,
            mount_cap(),
        ))
        .await,
        Code::FailedPrecondition,
        "staging_target_path",
    );
    // ...and set, but nothing is staged there.
    std::fs::create_dir_all(&staging).unwrap();
    expect_code(
        n.node_publish_volume(node_publish_req(
            MISSING_VOLUME,
            DEVICE,
            &staging,
            &target,
            mount_cap(),
        ))
        .await,
        Code::FailedPrecondition,
        &staging,
    );

    // Missing required fields stay INVALID_ARGUMENT naming the field.
    expect_code(
        n.node_get_volume_stats(stats_req("", "/x")).await,
        Code::InvalidArgument,
        "volume_id",
    );
    expect_code(
        n.node_expand_volume(node_expand_req(MISSING_VOLUME, ""))
            .await,
        Code::InvalidArgument,
        "volume_path",
    );
    // NodeExpandVolume "exceeds capabilities" is INVALID_ARGUMENT.
    let mut r = node_expand_req(MISSING_VOLUME, &staging);
    r.volume_capability = Some(VolumeCapability::mount(
        "ext4",
        vec![],
        Mode::MultiNodeReaderOnly,
    ));
    expect_code(
        n.node_expand_volume(r).await,
        Code::InvalidArgument,
        "volume_capability.access_mode",
    );
}

#[tokio::test]
async fn both_services_advertise_single_node_multi_writer() {
    let env = Env::start(Timing::Fast, Backing::File, 26).await;
    let d = Driver::start(env.driver_config(DriverMode::All)).await;
    let node = node_rpcs(&mut d.node()).await;
    assert!(node.contains(&NodeRpc::SingleNodeMultiWriter), "{node:?}");
    let ctrl = controller_rpcs(&mut d.controller()).await;
    assert!(ctrl.contains(&CtrlRpc::SingleNodeMultiWriter), "{ctrl:?}");
}

#[tokio::test]
async fn controller_volume_or_node_not_there() {
    let env = Env::start(Timing::Fast, Backing::File, 26).await;
    let d = Driver::start(env.driver_config(DriverMode::Controller)).await;
    let mut c = d.controller();
    let v = create(&mut c, create_req("pvc-codes", GIB)).await;

    for missing in [FAKE_VOLUME, MISSING_VOLUME] {
        expect_code(
            c.controller_publish_volume(publish_req(missing, &env.node_id))
                .await,
            Code::NotFound,
            missing,
        );
        expect_code(
            c.validate_volume_capabilities(validate_req(missing, mount_cap()))
                .await,
            Code::NotFound,
            missing,
        );
        expect_code(
            c.controller_expand_volume(expand_req(missing, 2 * GIB))
                .await,
            Code::NotFound,
            missing,
        );
        // Gone already: DeleteVolume and ControllerUnpublishVolume succeed (the spec's
        // idempotency rule; the volume "can be safely regarded as unpublished").
        c.delete_volume(delete_req(missing)).await.unwrap();
        c.controller_unpublish_volume(unpublish_req(missing, &env.node_id))
            .await
            .unwrap();
        // DeleteSnapshot of a snapshot that is not there: OK as well.
        c.delete_snapshot(DeleteSnapshotRequest {
            snapshot_id: missing.replace("vol-", "snap-"),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    // A node that does not exist, whatever its ID looks like.
    for node in ["fake-node-id", "i-0aaaaaaaaaaaaaaaa"] {
        expect_code(
            c.controller_publish_volume(publish_req(&v.volume_id, node))
                .await,
            Code::NotFound,
            node,
        );
    }
    // ControllerExpandVolume "unsupported capacity_range": no whole GiB fits in the range.
    expect_code(
        c.controller_expand_volume(ControllerExpandVolumeRequest {
            volume_id: v.volume_id.clone(),
            capacity_range: Some(CapacityRange {
                required_bytes: 2 * GIB + 1,
                limit_bytes: 2 * GIB + 1,
            }),
            ..Default::default()
        })
        .await,
        Code::OutOfRange,
        "limit_bytes",
    );
    // CreateVolume "source incompatible or not supported": cloning is not a capability.
    let mut r = create_req("pvc-clone", GIB);
    r.volume_content_source = Some(VolumeContentSource {
        r#type: Some(volume_content_source::Type::Volume(
            volume_content_source::VolumeSource {
                volume_id: v.volume_id.clone(),
            },
        )),
    });
    expect_code(
        c.create_volume(r).await,
        Code::InvalidArgument,
        "volume_content_source.volume",
    );
    expect_code(
        c.list_snapshots(ListSnapshotsRequest {
            max_entries: -1,
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
        "max_entries",
    );

    // RPCs whose capability is not advertised: UNIMPLEMENTED (the general error table).
    let s = c
        .list_volumes(ListVolumesRequest::default())
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::Unimplemented, "{s:?}");
    let s = c
        .get_capacity(GetCapacityRequest::default())
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::Unimplemented, "{s:?}");
    let s = c
        .controller_get_volume(ControllerGetVolumeRequest {
            volume_id: v.volume_id.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::Unimplemented, "{s:?}");

    // CreateVolume "unable to provision in accessible_topology": a valid requirement naming a
    // zone where no volume can be made.
    let mut r = create_req("pvc-nowhere", GIB);
    r.accessibility_requirements = Some(TopologyRequirement {
        requisite: vec![Topology::from_segments([(
            "topology.kubernetes.io/zone",
            "us-east-1z",
        )])],
        preferred: vec![],
    });
    expect_code(
        c.create_volume(r).await,
        Code::ResourceExhausted,
        "us-east-1z",
    );
    // ListSnapshots with a token this driver did not hand out: ABORTED.
    let s = c
        .list_snapshots(ListSnapshotsRequest {
            starting_token: "not-a-token".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::Aborted, "{s:?}");
}

/// Every access mode and access type ValidateVolumeCapabilities confirms must stage and publish
/// on a real device, and every one it refuses must be refused by NodeStage too: the controller
/// and the node share one set of rules.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_confirmed_capability_stages_and_publishes() {
    if !ctl::block_parts_or_skip("this test needs loop devices and mkfs/mount") {
        return;
    }
    let env = Env::start(Timing::Fast, Backing::Loop, 26).await;
    let d = Driver::start(env.driver_config(DriverMode::All)).await;
    let (mut c, mut n) = (d.controller(), d.node());
    let v = create(&mut c, create_req("pvc-caps", GIB)).await;
    let dev = attach(&mut c, &v.volume_id, &env.node_id).await;
    let staging = env.path("staging").display().to_string();
    let modes: Vec<Mode> = (1..=20).filter_map(|m| Mode::try_from(m).ok()).collect();
    assert!(modes.contains(&Mode::SingleNodeMultiWriter), "{modes:?}");
    let mut confirmed = 0;
    for mode in modes {
        for (kind, cap) in [
            ("mount", VolumeCapability::mount("ext4", vec![], mode)),
            ("block", VolumeCapability::block(mode)),
        ] {
            let what = format!("{kind} {}", mode.as_str_name());
            let validated = c
                .validate_volume_capabilities(validate_req(&v.volume_id, cap.clone()))
                .await
                .unwrap()
                .into_inner();
            let stage = node_stage_req(&v.volume_id, &dev, &staging, cap.clone());
            if validated.confirmed.is_none() {
                // Refused by the controller: refused by the node, for the same reason.
                let s = n.node_stage_volume(stage).await.unwrap_err();
                assert_eq!(s.code(), Code::InvalidArgument, "{what}: {s:?}");
                assert!(
                    s.message().contains("access_mode"),
                    "{what}: {} vs {}",
                    s.message(),
                    validated.message
                );
                let target = env.path("pods/refused").display().to_string();
                let publish = node_publish_req(&v.volume_id, &dev, &staging, &target, cap);
                let s = n.node_publish_volume(publish).await.unwrap_err();
                assert_eq!(s.code(), Code::InvalidArgument, "{what}: {s:?}");
                continue;
            }
            confirmed += 1;
            let target = env.path(&format!("pods/{kind}-{}", mode.as_str_name()));
            let target = target.display().to_string();
            n.node_stage_volume(stage)
                .await
                .unwrap_or_else(|s| panic!("{what}: NodeStage: {s:?}"));
            let publish = node_publish_req(&v.volume_id, &dev, &staging, &target, cap);
            n.node_publish_volume(publish)
                .await
                .unwrap_or_else(|s| panic!("{what}: NodePublish: {s:?}"));
            let mounted = std::fs::read_to_string("/proc/self/mountinfo")
                .unwrap()
                .lines()
                .any(|l| l.split(' ').nth(4) == Some(target.as_str()));
            assert!(mounted, "{what}: nothing mounted at {target}");
            if kind == "mount" {
                let probe = std::path::Path::new(&target).join("probe");
                let wrote = std::fs::write(&probe, b"x").is_ok();
                assert_eq!(
                    wrote,
                    mode != Mode::SingleNodeReaderOnly,
                    "{what}: writable iff the mode has a writer"
                );
                let _ = std::fs::remove_file(&probe);
            }
            n.node_unpublish_volume(node_unpublish_req(&v.volume_id, &target))
                .await
                .unwrap();
            n.node_unstage_volume(node_unstage_req(&v.volume_id, &staging))
                .await
                .unwrap();
        }
    }
    // 4 single-node modes for mount, the same 4 + MULTI_NODE_MULTI_WRITER for block.
    assert_eq!(confirmed, 9);

    // NodeStage "exceeds capabilities": the volume holds ext4 (formatted above), the request
    // asks for xfs. Nothing is formatted over it.
    let mut stage = node_stage_req(&v.volume_id, &dev, &staging, mount_cap());
    stage.volume_capability = Some(VolumeCapability::mount(
        "xfs",
        vec![],
        Mode::SingleNodeWriter,
    ));
    expect_code(
        n.node_stage_volume(stage).await,
        Code::FailedPrecondition,
        "ext4",
    );

    // Staged already, but with another filesystem than this request asks for: ALREADY_EXISTS.
    let mut stage = node_stage_req(&v.volume_id, &dev, &staging, mount_cap());
    n.node_stage_volume(stage.clone()).await.unwrap();
    stage.volume_capability = Some(VolumeCapability::mount(
        "xfs",
        vec![],
        Mode::SingleNodeWriter,
    ));
    expect_code(n.node_stage_volume(stage).await, Code::AlreadyExists, "xfs");
    // The staging path holds this volume, not another one: stats and expand naming another
    // (real-looking) volume are NOT_FOUND.
    expect_code(
        n.node_get_volume_stats(stats_req(MISSING_VOLUME, &staging))
            .await,
        Code::NotFound,
        &v.volume_id,
    );
    expect_code(
        n.node_expand_volume(node_expand_req(MISSING_VOLUME, &staging))
            .await,
        Code::NotFound,
        &v.volume_id,
    );
    n.node_get_volume_stats(stats_req(&v.volume_id, &staging))
        .await
        .unwrap();
    n.node_unstage_volume(node_unstage_req(&v.volume_id, &staging))
        .await
        .unwrap();
}
