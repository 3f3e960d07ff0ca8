//! The CSI error table in the spirit of csi-sanity, over the real unix socket: missing fields
//! are INVALID_ARGUMENT naming the field, unknown IDs are NOT_FOUND, creates and deletes are
//! idempotent, capacity and topology are enforced, lists paginate. The rows that need no mount
//! run as any user; docs/hostpath-driver.md's error table points here.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashSet;

use common::*;
use csi_spec::v1::controller_service_capability::rpc::Type as CtrlRpc;
use csi_spec::v1::node_service_capability::rpc::Type as NodeRpc;
use csi_spec::v1::plugin_capability::service::Type as Service;
use csi_spec::v1::volume_capability::access_mode::Mode;
use csi_spec::v1::volume_content_source::{SnapshotSource, Type as SourceType, VolumeSource};
use csi_spec::v1::*;
use hostpath_driver::{Config, TOPOLOGY_KEY};
use tonic::Code;

fn node_topology(node: &str) -> Topology {
    Topology {
        segments: [(TOPOLOGY_KEY.to_string(), node.to_string())].into(),
    }
}

#[tokio::test]
async fn identity_names_the_driver_and_its_capabilities() {
    let s = Scratch::new();
    let d = Driver::start(Config {
        driver_name: "hostpath.example.com".into(),
        ..config(&s)
    })
    .await;
    let mut id = d.identity();
    let info = id
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "hostpath.example.com");
    assert_eq!(info.vendor_version, env!("CARGO_PKG_VERSION"));
    let caps: Vec<_> = id
        .get_plugin_capabilities(GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities
        .iter()
        .filter_map(PluginCapability::service_type)
        .collect();
    assert_eq!(
        caps,
        vec![
            Service::ControllerService,
            Service::VolumeAccessibilityConstraints
        ]
    );
    let probe = id.probe(ProbeRequest {}).await.unwrap().into_inner();
    assert_eq!(probe.ready, Some(true));

    // No PUBLISH_UNPUBLISH_VOLUME: nothing to attach; ControllerPublish is UNIMPLEMENTED.
    let mut c = d.controller();
    let rpcs: HashSet<_> = c
        .controller_get_capabilities(ControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities
        .iter()
        .filter_map(ControllerServiceCapability::rpc_type)
        .collect();
    for want in [
        CtrlRpc::CreateDeleteVolume,
        CtrlRpc::ListVolumes,
        CtrlRpc::GetCapacity,
        CtrlRpc::CreateDeleteSnapshot,
        CtrlRpc::ListSnapshots,
        CtrlRpc::CloneVolume,
    ] {
        assert!(rpcs.contains(&want), "{want:?} missing from {rpcs:?}");
    }
    assert!(!rpcs.contains(&CtrlRpc::PublishUnpublishVolume));
    expect_code(
        c.controller_publish_volume(ControllerPublishVolumeRequest::default())
            .await,
        Code::Unimplemented,
        "",
    );

    let mut n = d.node();
    let rpcs: Vec<_> = n
        .node_get_capabilities(NodeGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities
        .iter()
        .filter_map(NodeServiceCapability::rpc_type)
        .collect();
    assert!(rpcs.contains(&NodeRpc::StageUnstageVolume), "{rpcs:?}");
    assert!(rpcs.contains(&NodeRpc::GetVolumeStats), "{rpcs:?}");
    assert!(rpcs.contains(&NodeRpc::VolumeCondition), "{rpcs:?}");
}

#[tokio::test]
async fn node_info_reports_id_limit_and_topology() {
    let s = Scratch::new();
    let d = Driver::start(Config {
        max_volumes_per_node: 7,
        stage_unstage: false,
        ..config(&s)
    })
    .await;
    let mut n = d.node();
    let info = n
        .node_get_info(NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.node_id, NODE);
    assert_eq!(info.max_volumes_per_node, 7);
    assert_eq!(info.accessible_topology, Some(node_topology(NODE)));
    // --stage-unstage=false: no STAGE_UNSTAGE_VOLUME, and the RPC itself says why.
    let rpcs: Vec<_> = n
        .node_get_capabilities(NodeGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities
        .iter()
        .filter_map(NodeServiceCapability::rpc_type)
        .collect();
    assert!(!rpcs.contains(&NodeRpc::StageUnstageVolume), "{rpcs:?}");
    expect_code(
        n.node_stage_volume(stage_req("v", &s.path("st"), mount_cap()))
            .await,
        Code::Unimplemented,
        "--stage-unstage=false",
    );
}

#[tokio::test]
async fn missing_fields_are_invalid_argument_naming_the_field() {
    let s = Scratch::new();
    let d = Driver::start(config(&s)).await;
    let mut c = d.controller();
    let mut n = d.node();
    let vol = create(&mut c, "pvc-fields", MIB, mount_cap()).await;
    let id = vol.volume_id.as_str();
    let staging = s.path("staging");
    let target = s.path("target");

    let mut no_type = mount_cap();
    no_type.access_type = None;
    let mut no_mode = mount_cap();
    no_mode.access_mode = None;

    // (what, result's error, field the message must name)
    let mut rows: Vec<(&str, tonic::Status, &str)> = Vec::new();
    let mut row = |what, r: Result<(), tonic::Status>, field| {
        rows.push((what, r.expect_err(what), field));
    };
    let mut req = create_req("", MIB, mount_cap());
    row(
        "CreateVolume without name",
        c.create_volume(req.clone()).await.map(drop),
        "name is required",
    );
    req.name = "x".into();
    req.volume_capabilities.clear();
    row(
        "CreateVolume without capabilities",
        c.create_volume(req.clone()).await.map(drop),
        "volume_capabilities is required",
    );
    req.volume_capabilities = vec![no_type.clone()];
    row(
        "CreateVolume without access type",
        c.create_volume(req.clone()).await.map(drop),
        "volume_capabilities[0].access_type",
    );
    req.volume_capabilities = vec![mount_cap(), no_mode.clone()];
    row(
        "CreateVolume without access mode",
        c.create_volume(req.clone()).await.map(drop),
        "volume_capabilities[1].access_mode is required",
    );
    req.volume_capabilities = vec![VolumeCapability::mount(
        "",
        vec![],
        Mode::MultiNodeMultiWriter,
    )];
    row(
        "CreateVolume with a multi-node mode",
        c.create_volume(req.clone()).await.map(drop),
        "MULTI_NODE_MULTI_WRITER",
    );
    req.volume_capabilities = vec![mount_cap()];
    req.volume_content_source = Some(VolumeContentSource { r#type: None });
    row(
        "CreateVolume with an empty content source",
        c.create_volume(req.clone()).await.map(drop),
        "volume_content_source.type",
    );
    row(
        "DeleteVolume without volume_id",
        c.delete_volume(DeleteVolumeRequest::default())
            .await
            .map(drop),
        "volume_id is required",
    );
    row(
        "ValidateVolumeCapabilities without volume_id",
        c.validate_volume_capabilities(ValidateVolumeCapabilitiesRequest {
            volume_capabilities: vec![mount_cap()],
            ..Default::default()
        })
        .await
        .map(drop),
        "volume_id is required",
    );
    row(
        "ValidateVolumeCapabilities without capabilities",
        c.validate_volume_capabilities(ValidateVolumeCapabilitiesRequest {
            volume_id: id.into(),
            ..Default::default()
        })
        .await
        .map(drop),
        "volume_capabilities is required",
    );
    row(
        "CreateSnapshot without name",
        c.create_snapshot(CreateSnapshotRequest {
            source_volume_id: id.into(),
            ..Default::default()
        })
        .await
        .map(drop),
        "name is required",
    );
    row(
        "CreateSnapshot without source_volume_id",
        c.create_snapshot(CreateSnapshotRequest {
            name: "snap".into(),
            ..Default::default()
        })
        .await
        .map(drop),
        "source_volume_id is required",
    );
    row(
        "DeleteSnapshot without snapshot_id",
        c.delete_snapshot(DeleteSnapshotRequest::default())
            .await
            .map(drop),
        "snapshot_id is required",
    );
    row(
        "NodeStageVolume without volume_id",
        n.node_stage_volume(stage_req("", &staging, mount_cap()))
            .await
            .map(drop),
        "volume_id is required",
    );
    row(
        "NodeStageVolume without staging_target_path",
        n.node_stage_volume(NodeStageVolumeRequest {
            volume_id: id.into(),
            volume_capability: Some(mount_cap()),
            ..Default::default()
        })
        .await
        .map(drop),
        "staging_target_path is required",
    );
    row(
        "NodeStageVolume without capability",
        n.node_stage_volume(NodeStageVolumeRequest {
            volume_id: id.into(),
            staging_target_path: staging.display().to_string(),
            ..Default::default()
        })
        .await
        .map(drop),
        "volume_capability is required",
    );
    row(
        "NodeStageVolume with block access to a mount volume",
        n.node_stage_volume(stage_req(id, &staging, block_cap()))
            .await
            .map(drop),
        "volume_capability.access_type",
    );
    row(
        "NodeUnstageVolume without volume_id",
        n.node_unstage_volume(unstage_req("", &staging))
            .await
            .map(drop),
        "volume_id is required",
    );
    row(
        "NodeUnstageVolume without staging_target_path",
        n.node_unstage_volume(NodeUnstageVolumeRequest {
            volume_id: id.into(),
            ..Default::default()
        })
        .await
        .map(drop),
        "staging_target_path is required",
    );
    row(
        "NodePublishVolume without volume_id",
        n.node_publish_volume(publish_req("", None, &target, mount_cap(), false))
            .await
            .map(drop),
        "volume_id is required",
    );
    row(
        "NodePublishVolume without target_path",
        n.node_publish_volume(NodePublishVolumeRequest {
            volume_id: id.into(),
            volume_capability: Some(mount_cap()),
            ..Default::default()
        })
        .await
        .map(drop),
        "target_path is required",
    );
    row(
        "NodePublishVolume without capability",
        n.node_publish_volume(NodePublishVolumeRequest {
            volume_id: id.into(),
            target_path: target.display().to_string(),
            ..Default::default()
        })
        .await
        .map(drop),
        "volume_capability is required",
    );
    row(
        "NodePublishVolume without access mode",
        n.node_publish_volume(publish_req(id, None, &target, no_mode, false))
            .await
            .map(drop),
        "volume_capability.access_mode is required",
    );
    row(
        "NodeUnpublishVolume without volume_id",
        n.node_unpublish_volume(unpublish_req("", &target))
            .await
            .map(drop),
        "volume_id is required",
    );
    row(
        "NodeUnpublishVolume without target_path",
        n.node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: id.into(),
            ..Default::default()
        })
        .await
        .map(drop),
        "target_path is required",
    );
    row(
        "NodeGetVolumeStats without volume_id",
        n.node_get_volume_stats(stats_req("", &target))
            .await
            .map(drop),
        "volume_id is required",
    );
    row(
        "NodeGetVolumeStats without volume_path",
        n.node_get_volume_stats(NodeGetVolumeStatsRequest {
            volume_id: id.into(),
            ..Default::default()
        })
        .await
        .map(drop),
        "volume_path is required",
    );
    row(
        "ListVolumes with negative max_entries",
        c.list_volumes(ListVolumesRequest {
            max_entries: -1,
            starting_token: String::new(),
        })
        .await
        .map(drop),
        "max_entries",
    );
    for (what, status, field) in rows {
        assert_eq!(status.code(), Code::InvalidArgument, "{what}: {status:?}");
        assert!(
            status.message().contains(field),
            "{what}: {:?} does not name {field:?}",
            status.message()
        );
    }
    // Nothing was staged or published by the refused calls.
    assert!(!staging.exists() && !target.exists());
}

#[tokio::test]
async fn unknown_volumes_and_snapshots_are_not_found() {
    let s = Scratch::new();
    let d = Driver::start(config(&s)).await;
    let mut c = d.controller();
    let mut n = d.node();
    let missing = "no-such-volume";
    let staging = s.path("staging");
    let target = s.path("target");
    expect_code(
        c.validate_volume_capabilities(ValidateVolumeCapabilitiesRequest {
            volume_id: missing.into(),
            volume_capabilities: vec![mount_cap()],
            ..Default::default()
        })
        .await,
        Code::NotFound,
        missing,
    );
    expect_code(
        c.create_snapshot(CreateSnapshotRequest {
            name: "snap".into(),
            source_volume_id: missing.into(),
            ..Default::default()
        })
        .await,
        Code::NotFound,
        missing,
    );
    let mut from_snapshot = create_req("from-snap", MIB, mount_cap());
    from_snapshot.volume_content_source = Some(VolumeContentSource {
        r#type: Some(SourceType::Snapshot(SnapshotSource {
            snapshot_id: "no-such-snapshot".into(),
        })),
    });
    expect_code(
        c.create_volume(from_snapshot).await,
        Code::NotFound,
        "snapshot no-such-snapshot",
    );
    let mut clone = create_req("clone", MIB, mount_cap());
    clone.volume_content_source = Some(VolumeContentSource {
        r#type: Some(SourceType::Volume(VolumeSource {
            volume_id: missing.into(),
        })),
    });
    expect_code(c.create_volume(clone).await, Code::NotFound, missing);
    expect_code(
        n.node_stage_volume(stage_req(missing, &staging, mount_cap()))
            .await,
        Code::NotFound,
        missing,
    );
    expect_code(
        n.node_unstage_volume(unstage_req(missing, &staging)).await,
        Code::NotFound,
        missing,
    );
    expect_code(
        n.node_publish_volume(publish_req(missing, None, &target, mount_cap(), false))
            .await,
        Code::NotFound,
        missing,
    );
    expect_code(
        n.node_unpublish_volume(unpublish_req(missing, &target))
            .await,
        Code::NotFound,
        missing,
    );
    expect_code(
        n.node_get_volume_stats(stats_req(missing, &target)).await,
        Code::NotFound,
        missing,
    );
    // A real volume on a path that does not exist, and on a directory that holds no mount.
    let vol = create(&mut c, "pvc-stats", MIB, mount_cap()).await;
    expect_code(
        n.node_get_volume_stats(stats_req(&vol.volume_id, &s.path("nowhere")))
            .await,
        Code::NotFound,
        "nowhere",
    );
    let empty = s.path("empty");
    std::fs::create_dir_all(&empty).unwrap();
    expect_code(
        n.node_get_volume_stats(stats_req(&vol.volume_id, &empty))
            .await,
        Code::NotFound,
        "empty",
    );
    // Deleting what is not there succeeds (idempotent), for volumes and snapshots.
    c.delete_volume(DeleteVolumeRequest {
        volume_id: missing.into(),
        ..Default::default()
    })
    .await
    .unwrap();
    c.delete_snapshot(DeleteSnapshotRequest {
        snapshot_id: "no-such-snapshot".into(),
        ..Default::default()
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn create_and_delete_are_idempotent_by_name() {
    let s = Scratch::new();
    let d = Driver::start(config(&s)).await;
    let mut c = d.controller();
    let a = create(&mut c, "pvc-a", 5 * MIB, mount_cap()).await;
    let again = create(&mut c, "pvc-a", 5 * MIB, mount_cap()).await;
    assert_eq!(a, again);
    assert_eq!(a.capacity_bytes, 5 * MIB);
    assert_eq!(a.accessible_topology, vec![node_topology(NODE)]);
    let dir = s.state_dir().join("volumes").join(&a.volume_id);
    assert!(dir.is_dir(), "{}", dir.display());

    // The same name with other parameters: ALREADY_EXISTS naming the name.
    expect_code(
        c.create_volume(create_req("pvc-a", 50 * MIB, mount_cap()))
            .await,
        Code::AlreadyExists,
        "pvc-a",
    );
    expect_code(
        c.create_volume(create_req("pvc-a", 5 * MIB, block_cap()))
            .await,
        Code::AlreadyExists,
        "block",
    );

    // A block volume is a sparse image of the requested size.
    let b = create(&mut c, "pvc-b", 16 * MIB, block_cap()).await;
    let img = s
        .state_dir()
        .join("volumes")
        .join(format!("{}.img", b.volume_id));
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 16 << 20);

    for v in [&a, &b] {
        for _ in 0..2 {
            c.delete_volume(DeleteVolumeRequest {
                volume_id: v.volume_id.clone(),
                ..Default::default()
            })
            .await
            .unwrap();
        }
    }
    assert!(!dir.exists() && !img.exists());
    assert!(list_all(&mut c, 0).await.is_empty());
    // The name is free again: a new volume with a new ID.
    let a2 = create(&mut c, "pvc-a", 5 * MIB, mount_cap()).await;
    assert_ne!(a2.volume_id, a.volume_id);
}

#[tokio::test]
async fn concurrent_creates_of_one_name_make_one_volume() {
    let s = Scratch::new();
    let d = Driver::start(config(&s)).await;
    let mut calls = Vec::new();
    for _ in 0..8 {
        let mut c = d.controller();
        calls.push(tokio::spawn(async move {
            create(&mut c, "pvc-race", MIB, mount_cap()).await.volume_id
        }));
    }
    let mut ids = HashSet::new();
    for call in calls {
        ids.insert(call.await.unwrap());
    }
    assert_eq!(ids.len(), 1, "{ids:?}");
    assert_eq!(list_all(&mut d.controller(), 0).await.len(), 1);
}

#[tokio::test]
async fn capacity_is_enforced_and_reported() {
    let s = Scratch::new();
    let d = Driver::start(Config {
        capacity_bytes: 10 << 20,
        ..config(&s)
    })
    .await;
    let mut c = d.controller();
    let available = |c: &mut csi_spec::v1::controller_client::ControllerClient<_>, topo| {
        let mut c = c.clone();
        async move {
            c.get_capacity(GetCapacityRequest {
                accessible_topology: topo,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .available_capacity
        }
    };
    assert_eq!(available(&mut c, None).await, 10 * MIB);
    let first = create(&mut c, "pvc-1", 6 * MIB, mount_cap()).await;
    assert_eq!(available(&mut c, None).await, 4 * MIB);
    assert_eq!(available(&mut c, Some(node_topology(NODE))).await, 4 * MIB);
    // Another node's topology has nothing of this driver's.
    assert_eq!(available(&mut c, Some(node_topology("node-b"))).await, 0);

    expect_code(
        c.create_volume(create_req("pvc-2", 6 * MIB, mount_cap()))
            .await,
        Code::ResourceExhausted,
        "capacity",
    );
    // More than the whole driver can ever hold, and a limit below the requirement.
    expect_code(
        c.create_volume(create_req("pvc-3", 20 * MIB, mount_cap()))
            .await,
        Code::OutOfRange,
        "capacity",
    );
    // ...but a name already taken with another size is ALREADY_EXISTS, whatever that size
    // (csi-sanity's "already existing name and different capacity" asks for more than a
    // small driver holds; it got OUT_OF_RANGE before the name was checked first).
    expect_code(
        c.create_volume(create_req("pvc-1", 20 * MIB, mount_cap()))
            .await,
        Code::AlreadyExists,
        "pvc-1",
    );
    let mut req = create_req("pvc-4", 2 * MIB, mount_cap());
    req.capacity_range = Some(CapacityRange {
        required_bytes: 2 * MIB,
        limit_bytes: MIB,
    });
    expect_code(c.create_volume(req).await, Code::OutOfRange, "limit_bytes");
    // A limit alone caps the default size.
    let mut req = create_req("pvc-5", 0, mount_cap());
    req.capacity_range = Some(CapacityRange {
        required_bytes: 0,
        limit_bytes: 3 * MIB,
    });
    let capped = c
        .create_volume(req)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(capped.capacity_bytes, 3 * MIB);

    c.delete_volume(DeleteVolumeRequest {
        volume_id: first.volume_id,
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(available(&mut c, None).await, 7 * MIB);
    create(&mut c, "pvc-2", 6 * MIB, mount_cap()).await;
}

#[tokio::test]
async fn list_volumes_paginates_with_tokens() {
    let s = Scratch::new();
    let d = Driver::start(config(&s)).await;
    let mut c = d.controller();
    let mut created = Vec::new();
    for i in 0..5 {
        created.push(
            create(&mut c, &format!("pvc-{i}"), MIB, mount_cap())
                .await
                .volume_id,
        );
    }
    created.sort();
    let first = c
        .list_volumes(ListVolumesRequest {
            max_entries: 2,
            starting_token: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.entries.len(), 2);
    assert!(!first.next_token.is_empty());
    let mut paged = list_all(&mut c, 2).await;
    paged.sort();
    assert_eq!(paged, created);
    let mut whole = list_all(&mut c, 0).await;
    whole.sort();
    assert_eq!(whole, created);
    expect_code(
        c.list_volumes(ListVolumesRequest {
            max_entries: 1,
            starting_token: "not-a-token".into(),
        })
        .await,
        Code::Aborted,
        "not-a-token",
    );
    expect_code(
        c.list_volumes(ListVolumesRequest {
            max_entries: 1,
            starting_token: "99".into(),
        })
        .await,
        Code::Aborted,
        "99",
    );
}

#[tokio::test]
async fn topology_requirements_that_exclude_this_node_are_refused() {
    let s = Scratch::new();
    let d = Driver::start(config(&s)).await;
    let mut c = d.controller();
    let mut req = create_req("pvc-elsewhere", MIB, mount_cap());
    req.accessibility_requirements = Some(TopologyRequirement {
        requisite: vec![node_topology("node-b")],
        preferred: vec![node_topology("node-b")],
    });
    expect_code(
        c.create_volume(req.clone()).await,
        Code::ResourceExhausted,
        TOPOLOGY_KEY,
    );
    assert!(list_all(&mut c, 0).await.is_empty());
    req.name = "pvc-here".into();
    req.accessibility_requirements = Some(TopologyRequirement {
        requisite: vec![node_topology("node-b"), node_topology(NODE)],
        preferred: vec![node_topology(NODE)],
    });
    let v = c
        .create_volume(req)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(v.accessible_topology, vec![node_topology(NODE)]);
}

#[tokio::test]
async fn validate_volume_capabilities_confirms_only_what_fits() {
    let s = Scratch::new();
    let d = Driver::start(config(&s)).await;
    let mut c = d.controller();
    let v = create(&mut c, "pvc-v", MIB, mount_cap()).await;
    let validate = |caps: Vec<VolumeCapability>| ValidateVolumeCapabilitiesRequest {
        volume_id: v.volume_id.clone(),
        volume_capabilities: caps,
        ..Default::default()
    };
    let ok = c
        .validate_volume_capabilities(validate(vec![
            mount_cap(),
            VolumeCapability::mount("", vec![], Mode::SingleNodeReaderOnly),
        ]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ok.confirmed.unwrap().volume_capabilities.len(), 2);
    for (cap, needle) in [
        (block_cap(), "not block"),
        (
            VolumeCapability::mount("", vec![], Mode::MultiNodeMultiWriter),
            "MULTI_NODE_MULTI_WRITER",
        ),
    ] {
        let r = c
            .validate_volume_capabilities(validate(vec![cap]))
            .await
            .unwrap()
            .into_inner();
        assert!(r.confirmed.is_none());
        assert!(r.message.contains(needle), "{}", r.message);
    }
}

#[tokio::test]
async fn snapshots_copy_content_list_and_restore() {
    let s = Scratch::new();
    let d = Driver::start(config(&s)).await;
    let mut c = d.controller();
    let src = create(&mut c, "pvc-src", 4 * MIB, mount_cap()).await;
    let src_dir = s.state_dir().join("volumes").join(&src.volume_id);
    std::fs::create_dir_all(src_dir.join("sub")).unwrap();
    std::fs::write(src_dir.join("sub/data"), b"snapshot me").unwrap();

    let snap_req = CreateSnapshotRequest {
        name: "snap-1".into(),
        source_volume_id: src.volume_id.clone(),
        ..Default::default()
    };
    let snap = c
        .create_snapshot(snap_req.clone())
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert!(snap.ready_to_use);
    assert_eq!(snap.source_volume_id, src.volume_id);
    assert_eq!(snap.size_bytes, 11);
    assert!(snap.creation_time.is_some());
    // Idempotent by name; the name with another source is taken.
    let again = c
        .create_snapshot(snap_req)
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert_eq!(again, snap);
    let other = create(&mut c, "pvc-other", MIB, mount_cap()).await;
    expect_code(
        c.create_snapshot(CreateSnapshotRequest {
            name: "snap-1".into(),
            source_volume_id: other.volume_id.clone(),
            ..Default::default()
        })
        .await,
        Code::AlreadyExists,
        "snap-1",
    );
    // The snapshot does not follow later writes to its source.
    std::fs::write(src_dir.join("sub/data"), b"changed").unwrap();

    let mut restore = create_req("pvc-restored", 4 * MIB, mount_cap());
    restore.volume_content_source = Some(VolumeContentSource {
        r#type: Some(SourceType::Snapshot(SnapshotSource {
            snapshot_id: snap.snapshot_id.clone(),
        })),
    });
    let restored = c
        .create_volume(restore.clone())
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert!(restored.content_source.is_some());
    let restored_dir = s.state_dir().join("volumes").join(&restored.volume_id);
    assert_eq!(
        std::fs::read(restored_dir.join("sub/data")).unwrap(),
        b"snapshot me"
    );
    // A block volume cannot come from a directory snapshot.
    restore.name = "pvc-restored-block".into();
    restore.volume_capabilities = vec![block_cap()];
    expect_code(
        c.create_volume(restore).await,
        Code::InvalidArgument,
        "volume_content_source",
    );
    // A clone copies the volume as it is now.
    let mut clone = create_req("pvc-clone", 4 * MIB, mount_cap());
    clone.volume_content_source = Some(VolumeContentSource {
        r#type: Some(SourceType::Volume(VolumeSource {
            volume_id: src.volume_id.clone(),
        })),
    });
    let cloned = c
        .create_volume(clone)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let cloned_dir = s.state_dir().join("volumes").join(&cloned.volume_id);
    assert_eq!(
        std::fs::read(cloned_dir.join("sub/data")).unwrap(),
        b"changed"
    );

    // Lists: by ID, by source, paginated, and a bad token.
    let snap2 = c
        .create_snapshot(CreateSnapshotRequest {
            name: "snap-2".into(),
            source_volume_id: other.volume_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    let lister = c.clone();
    let list = |req: ListSnapshotsRequest| {
        let mut c = lister.clone();
        async move {
            c.list_snapshots(req)
                .await
                .unwrap()
                .into_inner()
                .entries
                .into_iter()
                .map(|e| e.snapshot.unwrap().snapshot_id)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(list(ListSnapshotsRequest::default()).await.len(), 2);
    assert_eq!(
        list(ListSnapshotsRequest {
            source_volume_id: other.volume_id.clone(),
            ..Default::default()
        })
        .await,
        vec![snap2.snapshot_id.clone()]
    );
    assert_eq!(
        list(ListSnapshotsRequest {
            snapshot_id: snap.snapshot_id.clone(),
            ..Default::default()
        })
        .await,
        vec![snap.snapshot_id.clone()]
    );
    assert!(
        list(ListSnapshotsRequest {
            snapshot_id: "no-such-snapshot".into(),
            ..Default::default()
        })
        .await
        .is_empty()
    );
    let page = c
        .list_snapshots(ListSnapshotsRequest {
            max_entries: 1,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(page.entries.len(), 1);
    assert_eq!(page.next_token, "1");
    expect_code(
        c.list_snapshots(ListSnapshotsRequest {
            starting_token: "bogus".into(),
            ..Default::default()
        })
        .await,
        Code::Aborted,
        "bogus",
    );
    // Deleting the source volume leaves the snapshot; deleting the snapshot removes its copy.
    c.delete_volume(DeleteVolumeRequest {
        volume_id: src.volume_id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    let snap_dir = s.state_dir().join("snapshots").join(&snap.snapshot_id);
    assert!(snap_dir.is_dir());
    for _ in 0..2 {
        c.delete_snapshot(DeleteSnapshotRequest {
            snapshot_id: snap.snapshot_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    assert!(!snap_dir.exists());
    assert_eq!(list(ListSnapshotsRequest::default()).await.len(), 1);
}

#[tokio::test]
async fn serve_refuses_a_config_without_node_id() {
    let s = Scratch::new();
    let dir = tempfile::tempdir().unwrap();
    let endpoint = format!("unix://{}", dir.path().join("csi.sock").display());
    let socket = csi_spec::UnixSocket::bind(&endpoint).unwrap();
    let err = hostpath_driver::serve(
        socket,
        Config {
            node_id: String::new(),
            ..config(&s)
        },
        std::future::pending(),
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("node_id is required"), "{err}");
    // A damaged state file stops the driver rather than forgetting volumes.
    std::fs::create_dir_all(s.state_dir()).unwrap();
    std::fs::write(s.state_dir().join("state.json"), b"{broken").unwrap();
    let socket = csi_spec::UnixSocket::bind(&endpoint).unwrap();
    let err = hostpath_driver::serve(socket, config(&s), std::future::pending())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("state.json"), "{err}");
}

#[tokio::test]
async fn expansion_grows_within_capacity_and_names_fields() {
    let s = Scratch::new();
    let d = Driver::start(Config {
        capacity_bytes: 64 << 20,
        ..config(&s)
    })
    .await;
    let mut c = d.controller();
    let mut n = d.node();
    let online = d
        .identity()
        .get_plugin_capabilities(GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities
        .iter()
        .any(|cap| {
            matches!(
                &cap.r#type,
                Some(plugin_capability::Type::VolumeExpansion(v))
                    if v.r#type == plugin_capability::volume_expansion::Type::Online as i32
            )
        });
    assert!(online, "ONLINE volume expansion is offered");
    let expand = |id: &str, bytes: i64| ControllerExpandVolumeRequest {
        volume_id: id.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        ..Default::default()
    };
    expect_code(
        c.controller_expand_volume(expand("", MIB)).await,
        Code::InvalidArgument,
        "volume_id is required",
    );
    expect_code(
        c.controller_expand_volume(ControllerExpandVolumeRequest {
            volume_id: "x".into(),
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
        "capacity_range is required",
    );
    expect_code(
        c.controller_expand_volume(expand("x", 0)).await,
        Code::InvalidArgument,
        "capacity_range must set required_bytes or limit_bytes",
    );
    expect_code(
        c.controller_expand_volume(expand("no-such-volume", MIB))
            .await,
        Code::NotFound,
        "no-such-volume",
    );
    let m = create(&mut c, "pvc-m", 8 * MIB, mount_cap()).await;
    let b = create(&mut c, "pvc-b", 8 * MIB, block_cap()).await;
    // A directory grows by bookkeeping alone; an image grows on disk and needs the node.
    let r = c
        .controller_expand_volume(expand(&m.volume_id, 16 * MIB))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (r.capacity_bytes, r.node_expansion_required),
        (16 * MIB, false)
    );
    let r = c
        .controller_expand_volume(expand(&b.volume_id, 24 * MIB))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (r.capacity_bytes, r.node_expansion_required),
        (24 * MIB, true)
    );
    let img = s
        .state_dir()
        .join("volumes")
        .join(format!("{}.img", b.volume_id));
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 24 << 20);
    // Never shrinks: a smaller request answers the current size.
    let r = c
        .controller_expand_volume(expand(&b.volume_id, 4 * MIB))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.capacity_bytes, 24 * MIB);
    let listed: Vec<i64> = c
        .list_volumes(ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .entries
        .into_iter()
        .map(|e| e.volume.unwrap().capacity_bytes)
        .collect();
    assert_eq!(listed.iter().sum::<i64>(), 40 * MIB);
    // 40 MiB taken of 64: growing one volume by 30 MiB more does not fit.
    expect_code(
        c.controller_expand_volume(expand(&m.volume_id, 46 * MIB))
            .await,
        Code::ResourceExhausted,
        "capacity",
    );
    expect_code(
        c.controller_expand_volume(expand(&m.volume_id, 65 * MIB))
            .await,
        Code::OutOfRange,
        "capacity",
    );
    let node_expand = |id: &str, path: &str| NodeExpandVolumeRequest {
        volume_id: id.into(),
        volume_path: path.into(),
        ..Default::default()
    };
    expect_code(
        n.node_expand_volume(node_expand("", "/x")).await,
        Code::InvalidArgument,
        "volume_id is required",
    );
    expect_code(
        n.node_expand_volume(node_expand(&b.volume_id, "")).await,
        Code::InvalidArgument,
        "volume_path is required",
    );
    expect_code(
        n.node_expand_volume(node_expand("no-such-volume", "/x"))
            .await,
        Code::NotFound,
        "no-such-volume",
    );
    let nowhere = s.path("nowhere").display().to_string();
    expect_code(
        n.node_expand_volume(node_expand(&b.volume_id, &nowhere))
            .await,
        Code::NotFound,
        "nowhere",
    );
}
