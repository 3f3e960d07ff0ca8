//! The controller through its gRPC face on a real unix socket, against ec2-sim through the real
//! SDK: what the CSI spec requires of each RPC (missing fields, idempotent repeats, not-found
//! cases, capability checks), and the modes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod ctl;

use std::collections::HashMap;
use test_support::net::http_get;

use csi_spec::v1::controller_service_capability::rpc::Type as Rpc;
use csi_spec::v1::plugin_capability::service::Type as PluginService;
use csi_spec::v1::volume_capability::access_mode::Mode;
use csi_spec::v1::*;
use ctl::{
    Driver, Env, GIB, attach, controller_rpcs, create, create_req, delete_req, expand_req,
    expect_code, mount_cap, probe_ready, publish_req, unpublish_req, validate_req,
};
use ebs_cloud::Cloud;
use ebs_driver::Mode as DriverMode;
use ec2_sim::{Backing, Timing};
use tonic::Code;

async fn env() -> Env {
    Env::start(Timing::Fast, Backing::File, 26).await
}

#[tokio::test]
async fn missing_fields_are_invalid_argument_naming_the_field() {
    let env = env().await;
    let d = Driver::start(env.driver_config(DriverMode::Controller)).await;
    let mut c = d.controller();
    let mut r = create_req("", GIB);
    expect_code(
        c.create_volume(r.clone()).await,
        Code::InvalidArgument,
        "name",
    );
    r.name = "pvc-x".into();
    r.volume_capabilities.clear();
    expect_code(
        c.create_volume(r.clone()).await,
        Code::InvalidArgument,
        "volume_capabilities",
    );
    r.volume_capabilities = vec![VolumeCapability::default()];
    expect_code(
        c.create_volume(r.clone()).await,
        Code::InvalidArgument,
        "access_type",
    );
    r.volume_capabilities = vec![VolumeCapability::mount(
        "ext4",
        vec![],
        Mode::MultiNodeMultiWriter,
    )];
    expect_code(
        c.create_volume(r).await,
        Code::InvalidArgument,
        "MULTI_NODE_MULTI_WRITER",
    );
    let mut r = create_req("pvc-x", GIB);
    r.parameters = HashMap::from([("iops".into(), "lots".into())]);
    expect_code(
        c.create_volume(r.clone()).await,
        Code::InvalidArgument,
        "iops",
    );
    r.parameters = HashMap::from([("colour".into(), "blue".into())]);
    expect_code(c.create_volume(r).await, Code::InvalidArgument, "colour");

    expect_code(
        c.delete_volume(DeleteVolumeRequest::default()).await,
        Code::InvalidArgument,
        "volume_id",
    );
    expect_code(
        c.controller_publish_volume(publish_req("", &env.node_id))
            .await,
        Code::InvalidArgument,
        "volume_id",
    );
    expect_code(
        c.controller_publish_volume(publish_req("vol-0123456789abcdef0", ""))
            .await,
        Code::InvalidArgument,
        "node_id",
    );
    let mut p = publish_req("vol-0123456789abcdef0", &env.node_id);
    p.volume_capability = None;
    expect_code(
        c.controller_publish_volume(p).await,
        Code::InvalidArgument,
        "volume_capability",
    );
    expect_code(
        c.controller_unpublish_volume(unpublish_req("", &env.node_id))
            .await,
        Code::InvalidArgument,
        "volume_id",
    );
    expect_code(
        c.validate_volume_capabilities(ValidateVolumeCapabilitiesRequest::default())
            .await,
        Code::InvalidArgument,
        "volume_id",
    );
    expect_code(
        c.validate_volume_capabilities(ValidateVolumeCapabilitiesRequest {
            volume_id: "vol-0123456789abcdef0".into(),
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
        "volume_capabilities",
    );
    expect_code(
        c.create_snapshot(CreateSnapshotRequest::default()).await,
        Code::InvalidArgument,
        "name",
    );
    expect_code(
        c.create_snapshot(CreateSnapshotRequest {
            name: "s".into(),
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
        "source_volume_id",
    );
    expect_code(
        c.delete_snapshot(DeleteSnapshotRequest::default()).await,
        Code::InvalidArgument,
        "snapshot_id",
    );
    expect_code(
        c.controller_expand_volume(ControllerExpandVolumeRequest::default())
            .await,
        Code::InvalidArgument,
        "volume_id",
    );
    expect_code(
        c.controller_expand_volume(ControllerExpandVolumeRequest {
            volume_id: "vol-0123456789abcdef0".into(),
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
        "capacity_range",
    );
}

#[tokio::test]
async fn create_is_idempotent_and_a_reused_name_is_already_exists() {
    let env = env().await;
    let d = Driver::start(env.driver_config(DriverMode::Controller)).await;
    let mut c = d.controller();
    let mut r = create_req("pvc-idem", GIB + 1);
    r.parameters = HashMap::from([
        ("type".into(), "gp3".into()),
        ("tagSpecification_1".into(), "team=storage".into()),
        ("csi.storage.k8s.io/fstype".into(), "ext4".into()),
    ]);
    let a = create(&mut c, r.clone()).await;
    // Rounded up to whole GiB.
    assert_eq!(a.capacity_bytes, 2 * GIB);
    assert_eq!(
        a.volume_context.get("fsType").map(String::as_str),
        Some("ext4")
    );
    let zone = &a.accessible_topology[0].segments["topology.ebs.csi.aws.com/zone"];
    assert_eq!(zone, "us-east-1a");
    let b = create(&mut c, r.clone()).await;
    assert_eq!(a.volume_id, b.volume_id);
    let disk = env.cloud.get_disk_by_id(&a.volume_id).await.unwrap();
    assert_eq!(disk.tags.get("team").map(String::as_str), Some("storage"));
    assert_eq!(
        disk.tags.get("CSIVolumeName").map(String::as_str),
        Some("pvc-idem")
    );

    let mut bigger = r.clone();
    bigger.capacity_range = Some(CapacityRange {
        required_bytes: 10 * GIB,
        limit_bytes: 0,
    });
    expect_code(
        c.create_volume(bigger).await,
        Code::AlreadyExists,
        "pvc-idem",
    );
    let mut other_type = r.clone();
    other_type.parameters.insert("type".into(), "io1".into());
    other_type.parameters.insert("iops".into(), "200".into());
    expect_code(
        c.create_volume(other_type).await,
        Code::AlreadyExists,
        "io1",
    );

    // A range no whole GiB fits.
    let mut odd = create_req("pvc-odd", GIB + 1);
    odd.capacity_range = Some(CapacityRange {
        required_bytes: GIB + 1,
        limit_bytes: GIB + 2,
    });
    expect_code(c.create_volume(odd).await, Code::OutOfRange, "limit_bytes");
}

#[tokio::test]
async fn a_name_created_again_after_its_volume_was_deleted_gets_a_new_volume() {
    // csi-sanity's ModifyVolume specs create, delete and create one name three times, with and
    // without mutable_parameters; EC2 remembers a deleted volume's client token, and the
    // second create failed (INTERNAL "VolumeGone", then ALREADY_EXISTS for the changed
    // parameters) before the name's token generations.
    let env = env().await;
    let d = Driver::start(env.driver_config(DriverMode::Controller)).await;
    let mut c = d.controller();
    let mut seen = Vec::new();
    for round in 0..3 {
        let mut r = create_req("pvc-reused", GIB);
        if round == 1 {
            r.mutable_parameters = HashMap::from([("iops".into(), "4000".into())]);
            r.capacity_range = Some(CapacityRange {
                required_bytes: 10 * GIB,
                limit_bytes: 0,
            });
        }
        let v = create(&mut c, r.clone()).await;
        assert!(!seen.contains(&v.volume_id), "round {round}: {seen:?}");
        // A repeat while it lives is the same volume.
        assert_eq!(create(&mut c, r).await.volume_id, v.volume_id);
        c.delete_volume(delete_req(&v.volume_id)).await.unwrap();
        seen.push(v.volume_id);
    }
}

#[tokio::test]
async fn zone_follows_accessibility_requirements() {
    let env = env().await;
    let d = Driver::start(env.driver_config(DriverMode::Controller)).await;
    let mut c = d.controller();
    let topo = |z: &str| Topology::from_segments([("topology.kubernetes.io/zone", z)]);
    let mut r = create_req("pvc-zone", GIB);
    r.accessibility_requirements = Some(TopologyRequirement {
        requisite: vec![topo("us-east-1c"), topo("us-east-1b")],
        preferred: vec![topo("us-east-1b")],
    });
    let v = create(&mut c, r).await;
    assert_eq!(
        env.cloud.get_disk_by_id(&v.volume_id).await.unwrap().zone,
        "us-east-1b"
    );
    assert_eq!(
        v.accessible_topology[0].segments["topology.kubernetes.io/zone"],
        "us-east-1b"
    );
    // The node is in us-east-1a: EC2 refuses the attach, and that is FailedPrecondition.
    expect_code(
        c.controller_publish_volume(publish_req(&v.volume_id, &env.node_id))
            .await,
        Code::FailedPrecondition,
        "availability zone",
    );
}

#[tokio::test]
async fn delete_publish_unpublish_validate_and_not_found_cases() {
    let env = env().await;
    let other = env.cloud.run_instance("other-node", None).await.unwrap();
    let d = Driver::start(env.driver_config(DriverMode::Controller)).await;
    let mut c = d.controller();
    // Absent volume: delete and unpublish succeed, publish and validate are NotFound.
    let ghost = "vol-0123456789abcdef0";
    c.delete_volume(delete_req(ghost)).await.unwrap();
    c.controller_unpublish_volume(unpublish_req(ghost, &env.node_id))
        .await
        .unwrap();
    expect_code(
        c.controller_publish_volume(publish_req(ghost, &env.node_id))
            .await,
        Code::NotFound,
        ghost,
    );
    expect_code(
        c.validate_volume_capabilities(validate_req(ghost, mount_cap()))
            .await,
        Code::NotFound,
        ghost,
    );

    let v = create(&mut c, create_req("pvc-pub", GIB)).await;
    expect_code(
        c.controller_publish_volume(publish_req(&v.volume_id, "i-0123456789abcdef0"))
            .await,
        Code::NotFound,
        "i-0123456789abcdef0",
    );
    let dev = attach(&mut c, &v.volume_id, &env.node_id).await;
    assert!(dev.starts_with("/dev/xvd"), "{dev}");
    // Again: success with the same device.
    assert_eq!(attach(&mut c, &v.volume_id, &env.node_id).await, dev);
    // Elsewhere: FailedPrecondition.
    expect_code(
        c.controller_publish_volume(publish_req(&v.volume_id, &other.instance_id))
            .await,
        Code::FailedPrecondition,
        &env.node_id,
    );
    // Delete while attached: FailedPrecondition.
    expect_code(
        c.delete_volume(delete_req(&v.volume_id)).await,
        Code::FailedPrecondition,
        &v.volume_id,
    );
    // Validate.
    let ok = c
        .validate_volume_capabilities(validate_req(&v.volume_id, mount_cap()))
        .await
        .unwrap()
        .into_inner();
    assert!(ok.confirmed.is_some());
    let no = c
        .validate_volume_capabilities(validate_req(
            &v.volume_id,
            VolumeCapability::mount("ext4", vec![], Mode::MultiNodeReaderOnly),
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(no.confirmed.is_none());
    assert!(
        no.message.contains("MULTI_NODE_READER_ONLY"),
        "{}",
        no.message
    );

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
    // Not attached: success.
    c.controller_unpublish_volume(unpublish_req(&v.volume_id, &env.node_id))
        .await
        .unwrap();
    // Gone already: success again.
    for _ in 0..2 {
        c.delete_volume(delete_req(&v.volume_id)).await.unwrap();
    }
}

#[tokio::test]
async fn capabilities_probe_snapshots_and_expand() {
    let env = env().await;
    let d = Driver::start(env.driver_config(DriverMode::Controller)).await;
    let mut id = d.identity();
    assert_eq!(probe_ready(&mut id).await, Some(true));
    let caps = id
        .get_plugin_capabilities(GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(
        caps.capabilities
            .iter()
            .any(|c| c.service_type() == Some(PluginService::ControllerService))
    );
    let mut c = d.controller();
    let rpcs = controller_rpcs(&mut c).await;
    for want in [
        Rpc::CreateDeleteVolume,
        Rpc::PublishUnpublishVolume,
        Rpc::CreateDeleteSnapshot,
        Rpc::ListSnapshots,
        Rpc::ExpandVolume,
    ] {
        assert!(rpcs.contains(&want), "{want:?}");
    }

    let v = create(&mut c, create_req("pvc-snap", GIB)).await;
    let snap = |name: &str, vol: &str| CreateSnapshotRequest {
        name: name.into(),
        source_volume_id: vol.into(),
        ..Default::default()
    };
    let mut snapshot_a = async || {
        c.create_snapshot(snap("snap-a", &v.volume_id))
            .await
            .unwrap()
            .into_inner()
            .snapshot
            .unwrap()
    };
    let s = snapshot_a().await;
    assert_eq!(s.source_volume_id, v.volume_id);
    assert_eq!(s.size_bytes, GIB);
    assert!(s.creation_time.is_some());
    let again = snapshot_a().await;
    assert_eq!(again.snapshot_id, s.snapshot_id);
    expect_code(
        c.create_snapshot(snap("snap-b", "vol-0123456789abcdef0"))
            .await,
        Code::NotFound,
        "vol-0123456789abcdef0",
    );
    let listed = c
        .list_snapshots(ListSnapshotsRequest {
            source_volume_id: v.volume_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.entries.len(), 1);
    let by_id = c
        .list_snapshots(ListSnapshotsRequest {
            snapshot_id: "snap-0123456789abcdef0".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(by_id.entries.is_empty());

    // Wait until the snapshot completes, then restore it into a new volume.
    let mut ready = false;
    for _ in 0..100 {
        let l = c
            .list_snapshots(ListSnapshotsRequest {
                snapshot_id: s.snapshot_id.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        if l.entries[0].snapshot.as_ref().unwrap().ready_to_use {
            ready = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(ready, "the snapshot never completed");
    let mut from = create_req("pvc-from-snap", GIB);
    from.volume_content_source = Some(VolumeContentSource {
        r#type: Some(volume_content_source::Type::Snapshot(
            volume_content_source::SnapshotSource {
                snapshot_id: s.snapshot_id.clone(),
            },
        )),
    });
    let restored = create(&mut c, from).await;
    assert!(restored.content_source.is_some());
    let mut missing = create_req("pvc-from-nothing", GIB);
    missing.volume_content_source = Some(VolumeContentSource {
        r#type: Some(volume_content_source::Type::Snapshot(
            volume_content_source::SnapshotSource {
                snapshot_id: "snap-0123456789abcdef0".into(),
            },
        )),
    });
    expect_code(
        c.create_volume(missing).await,
        Code::NotFound,
        "snap-0123456789abcdef0",
    );

    // Twice: the second finds it gone, which is success.
    for _ in 0..2 {
        c.delete_snapshot(DeleteSnapshotRequest {
            snapshot_id: s.snapshot_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    }

    let mut grow = expand_req(&v.volume_id, 3 * GIB);
    grow.volume_capability = Some(mount_cap());
    let grown = c.controller_expand_volume(grow).await.unwrap().into_inner();
    assert_eq!(grown.capacity_bytes, 3 * GIB);
    assert!(grown.node_expansion_required);
    expect_code(
        c.controller_expand_volume(expand_req("vol-0123456789abcdef0", 3 * GIB))
            .await,
        Code::NotFound,
        "vol-0123456789abcdef0",
    );
}

#[tokio::test]
async fn unusable_kms_key_is_a_clear_error_and_leaks_nothing() {
    let env = env().await;
    let d = Driver::start(env.driver_config(DriverMode::Controller)).await;
    let mut c = d.controller();
    let mut r = create_req("pvc-kms", GIB);
    r.parameters = HashMap::from([
        ("encrypted".into(), "true".into()),
        ("kmsKeyId".into(), "alias/nope".into()),
    ]);
    expect_code(c.create_volume(r).await, Code::InvalidArgument, "kmsKeyId");
    assert!(
        env.cloud
            .get_disk_by_name("pvc-kms")
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn node_mode_has_no_controller_and_makes_no_ec2_call() {
    let env = env().await;
    let mut config = env.driver_config(DriverMode::Node);
    // A dead endpoint: node mode must not need it.
    config.aws.endpoint = Some("http://127.0.0.1:9".into());
    env.sim.reset_call_counts();
    let d = Driver::start(config).await;
    let mut id = d.identity();
    assert_eq!(probe_ready(&mut id).await, Some(true));
    let caps = id
        .get_plugin_capabilities(GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(
        !caps
            .capabilities
            .iter()
            .any(|c| c.service_type() == Some(PluginService::ControllerService))
    );
    let err = d
        .controller()
        .create_volume(create_req("pvc-n", GIB))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented);
    let info = d
        .node()
        .node_get_info(NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.node_id, env.node_id);
    assert!(
        env.sim.call_counts().is_empty(),
        "{:?}",
        env.sim.call_counts()
    );
}

#[tokio::test]
async fn probe_is_not_ready_while_ec2_fails() {
    let env = env().await;
    let mut config = env.driver_config(DriverMode::Controller);
    config.aws.endpoint = Some("http://127.0.0.1:9".into());
    config.aws.retry.max_attempts = 1;
    let d = Driver::start(config).await;
    assert_eq!(probe_ready(&mut d.identity()).await, Some(false));
}

#[tokio::test]
async fn http_endpoint_serves_metrics_and_health() {
    let env = env().await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut config = env.driver_config(DriverMode::Controller);
    config.http_endpoint = Some(port);
    let d = Driver::start(config).await;
    let mut c = d.controller();
    c.create_volume(create_req("pvc-metrics", GIB))
        .await
        .unwrap();
    expect_code(
        c.delete_volume(DeleteVolumeRequest::default()).await,
        Code::InvalidArgument,
        "volume_id",
    );
    assert_eq!(probe_ready(&mut d.identity()).await, Some(true));
    let (status, body) = http_get(port, "/metrics").await;
    assert_eq!(status, 200, "{body}");
    for needle in [
        "ebs_csi_ec2_api_requests_total{action=\"CreateVolume\"} 1",
        "ebs_csi_ec2_api_requests_total{action=\"DescribeAvailabilityZones\"}",
        "ebs_csi_ec2_api_request_duration_seconds_bucket{",
        "ebs_csi_rpc_requests_total{method=\"CreateVolume\",code=\"OK\"} 1",
        "ebs_csi_rpc_requests_total{method=\"DeleteVolume\",code=\"InvalidArgument\"} 1",
        "ebs_csi_rpc_duration_seconds_count{method=\"Probe\"} 1",
    ] {
        assert!(body.contains(needle), "missing {needle} in\n{body}");
    }
    assert_eq!(http_get(port, "/healthz").await.0, 200);
    assert_eq!(http_get(port, "/readyz").await.0, 200);
}
