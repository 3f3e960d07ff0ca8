//! Pins the CSI v1.12 wire format: representative messages are encoded and compared with
//! protobuf encodings written out by hand, so a wrong field number, wire type or enum value in
//! `proto/csi.proto` cannot pass.
//!
//! Reading the bytes: a key is `field_number << 3 | wire_type`, wire type 0 = varint,
//! 2 = length-delimited (strings, bytes, messages, map entries). prost writes fields in field
//! number order (oneof members at their own numbers). A map field is a repeated message whose
//! entries are `{1: key, 2: value}`; every map here has one entry so the bytes are
//! deterministic.

use std::collections::HashMap;

use csi_spec::v1::volume_capability::access_mode::Mode;
use csi_spec::v1::*;
use prost::Message;

fn one(k: &str, v: &str) -> HashMap<String, String> {
    HashMap::from([(k.to_owned(), v.to_owned())])
}

/// Compares with a hex dump on failure: a diff of two long decimal arrays is unreadable.
#[track_caller]
fn assert_wire(actual: &[u8], expected: &[u8]) {
    let hex = |b: &[u8]| {
        b.iter()
            .map(|x| format!("{x:02X}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(
        hex(actual),
        hex(expected),
        "\n actual:   {}\n expected: {}",
        hex(actual),
        hex(expected)
    );
}

#[test]
fn create_volume_request() {
    let req = CreateVolumeRequest {
        name: "pvc-1".into(),
        capacity_range: Some(CapacityRange {
            required_bytes: 1 << 30,
            limit_bytes: 1 << 31,
        }),
        volume_capabilities: vec![
            VolumeCapability::mount("ext4", vec!["noatime".into()], Mode::SingleNodeWriter),
            VolumeCapability::block(Mode::MultiNodeMultiWriter),
        ],
        parameters: one("type", "gp3"),
        secrets: one("key", "s3cr3t"),
        volume_content_source: Some(VolumeContentSource {
            r#type: Some(volume_content_source::Type::Snapshot(
                volume_content_source::SnapshotSource {
                    snapshot_id: "snap-1".into(),
                },
            )),
        }),
        accessibility_requirements: Some(TopologyRequirement {
            requisite: vec![Topology::from_segments([("zone", "az-a")])],
            preferred: vec![Topology::from_segments([("zone", "az-a")])],
        }),
        mutable_parameters: one("iops", "3000"),
    };
    let expected: Vec<u8> = [
        // 1 name: string, key 0x0A, len 5
        &[0x0A, 0x05][..],
        b"pvc-1",
        // 2 capacity_range: message, key 0x12, len 12
        &[0x12, 0x0C],
        //   1 required_bytes: int64 varint, key 0x08, 2^30 = 80 80 80 80 04
        &[0x08, 0x80, 0x80, 0x80, 0x80, 0x04],
        //   2 limit_bytes: int64 varint, key 0x10, 2^31 = 80 80 80 80 08
        &[0x10, 0x80, 0x80, 0x80, 0x80, 0x08],
        // 3 volume_capabilities[0]: message, key 0x1A, len 21
        &[0x1A, 0x15],
        //   2 mount (oneof access_type): MountVolume, key 0x12, len 15
        &[0x12, 0x0F],
        //     1 fs_type: key 0x0A, len 4, "ext4"
        &[0x0A, 0x04],
        b"ext4",
        //     2 mount_flags[0]: key 0x12, len 7, "noatime"
        &[0x12, 0x07],
        b"noatime",
        //   3 access_mode: AccessMode, key 0x1A, len 2; 1 mode: enum varint SINGLE_NODE_WRITER=1
        &[0x1A, 0x02, 0x08, 0x01],
        // 3 volume_capabilities[1]: key 0x1A, len 6
        &[0x1A, 0x06],
        //   1 block (oneof access_type): empty BlockVolume, key 0x0A, len 0 (present though empty)
        &[0x0A, 0x00],
        //   3 access_mode: mode MULTI_NODE_MULTI_WRITER=5
        &[0x1A, 0x02, 0x08, 0x05],
        // 4 parameters entry: key 0x22, len 11; entry 1 key "type", 2 value "gp3"
        &[0x22, 0x0B, 0x0A, 0x04],
        b"type",
        &[0x12, 0x03],
        b"gp3",
        // 5 secrets entry: key 0x2A, len 13; "key" -> "s3cr3t"
        &[0x2A, 0x0D, 0x0A, 0x03],
        b"key",
        &[0x12, 0x06],
        b"s3cr3t",
        // 6 volume_content_source: key 0x32, len 10
        &[0x32, 0x0A],
        //   1 snapshot (oneof type): SnapshotSource, key 0x0A, len 8; 1 snapshot_id "snap-1"
        &[0x0A, 0x08, 0x0A, 0x06],
        b"snap-1",
        // 7 accessibility_requirements: key 0x3A, len 32
        &[0x3A, 0x20],
        //   1 requisite[0]: Topology, key 0x0A, len 14; 1 segments entry len 12: "zone" -> "az-a"
        &[0x0A, 0x0E, 0x0A, 0x0C, 0x0A, 0x04],
        b"zone",
        &[0x12, 0x04],
        b"az-a",
        //   2 preferred[0]: Topology, key 0x12, same body
        &[0x12, 0x0E, 0x0A, 0x0C, 0x0A, 0x04],
        b"zone",
        &[0x12, 0x04],
        b"az-a",
        // 8 mutable_parameters entry: key 0x42, len 12; "iops" -> "3000"
        &[0x42, 0x0C, 0x0A, 0x04],
        b"iops",
        &[0x12, 0x04],
        b"3000",
    ]
    .concat();
    assert_wire(&req.encode_to_vec(), &expected);
    assert_eq!(
        CreateVolumeRequest::decode(expected.as_slice()).unwrap(),
        req
    );
}

#[test]
fn volume_content_source_volume_variant() {
    let src = VolumeContentSource {
        r#type: Some(volume_content_source::Type::Volume(
            volume_content_source::VolumeSource {
                volume_id: "vol-1".into(),
            },
        )),
    };
    let expected: Vec<u8> = [
        // 2 volume (oneof type): VolumeSource, key 0x12, len 7; 1 volume_id "vol-1"
        &[0x12, 0x07, 0x0A, 0x05][..],
        b"vol-1",
    ]
    .concat();
    assert_wire(&src.encode_to_vec(), &expected);
}

#[test]
fn create_volume_response() {
    let resp = CreateVolumeResponse {
        volume: Some(Volume {
            capacity_bytes: 1 << 30,
            volume_id: "vol-1".into(),
            volume_context: one("a", "b"),
            content_source: Some(VolumeContentSource {
                r#type: Some(volume_content_source::Type::Volume(
                    volume_content_source::VolumeSource {
                        volume_id: "vol-0".into(),
                    },
                )),
            }),
            accessible_topology: vec![Topology::from_segments([("zone", "az-a")])],
        }),
    };
    let expected: Vec<u8> = [
        // 1 volume: key 0x0A, len 48
        &[0x0A, 0x30][..],
        //   1 capacity_bytes: int64 2^30
        &[0x08, 0x80, 0x80, 0x80, 0x80, 0x04],
        //   2 volume_id: key 0x12, "vol-1"
        &[0x12, 0x05],
        b"vol-1",
        //   3 volume_context entry: key 0x1A, len 6; "a" -> "b"
        &[0x1A, 0x06, 0x0A, 0x01, b'a', 0x12, 0x01, b'b'],
        //   4 content_source: key 0x22, len 9; 2 volume: len 7; 1 volume_id "vol-0"
        &[0x22, 0x09, 0x12, 0x07, 0x0A, 0x05],
        b"vol-0",
        //   5 accessible_topology[0]: key 0x2A, len 14; segments "zone" -> "az-a"
        &[0x2A, 0x0E, 0x0A, 0x0C, 0x0A, 0x04],
        b"zone",
        &[0x12, 0x04],
        b"az-a",
    ]
    .concat();
    assert_wire(&resp.encode_to_vec(), &expected);
}

#[test]
fn controller_publish_volume() {
    let req = ControllerPublishVolumeRequest {
        volume_id: "vol-1".into(),
        node_id: "i-0abc".into(),
        volume_capability: Some(VolumeCapability::block(Mode::SingleNodeWriter)),
        readonly: true,
        secrets: one("k", "v"),
        volume_context: one("partition", "1"),
    };
    let expected: Vec<u8> = [
        // 1 volume_id: key 0x0A, "vol-1"
        &[0x0A, 0x05][..],
        b"vol-1",
        // 2 node_id: key 0x12, "i-0abc"
        &[0x12, 0x06],
        b"i-0abc",
        // 3 volume_capability: key 0x1A, len 6; 1 block {}, 3 access_mode {mode 1}
        &[0x1A, 0x06, 0x0A, 0x00, 0x1A, 0x02, 0x08, 0x01],
        // 4 readonly: bool varint, key 0x20, 1
        &[0x20, 0x01],
        // 5 secrets entry: key 0x2A, len 6; "k" -> "v"
        &[0x2A, 0x06, 0x0A, 0x01, b'k', 0x12, 0x01, b'v'],
        // 6 volume_context entry: key 0x32, len 14; "partition" -> "1"
        &[0x32, 0x0E, 0x0A, 0x09],
        b"partition",
        &[0x12, 0x01, b'1'],
    ]
    .concat();
    assert_wire(&req.encode_to_vec(), &expected);

    let resp = ControllerPublishVolumeResponse {
        publish_context: one("devicePath", "/dev/xvdba"),
    };
    let expected: Vec<u8> = [
        // 1 publish_context entry: key 0x0A, len 24; "devicePath" -> "/dev/xvdba"
        &[0x0A, 0x18, 0x0A, 0x0A][..],
        b"devicePath",
        &[0x12, 0x0A],
        b"/dev/xvdba",
    ]
    .concat();
    assert_wire(&resp.encode_to_vec(), &expected);
}

#[test]
fn node_stage_volume_request() {
    let mut cap = VolumeCapability::mount("xfs", vec![], Mode::SingleNodeWriter);
    if let Some(volume_capability::AccessType::Mount(m)) = cap.access_type.as_mut() {
        m.volume_mount_group = "1000".into();
    }
    let req = NodeStageVolumeRequest {
        volume_id: "vol-1".into(),
        publish_context: one("devicePath", "/dev/xvdba"),
        staging_target_path: "/staging/pv1".into(),
        volume_capability: Some(cap),
        secrets: one("k", "v"),
        volume_context: one("a", "b"),
    };
    let expected: Vec<u8> = [
        // 1 volume_id: "vol-1"
        &[0x0A, 0x05][..],
        b"vol-1",
        // 2 publish_context entry: key 0x12, len 24
        &[0x12, 0x18, 0x0A, 0x0A],
        b"devicePath",
        &[0x12, 0x0A],
        b"/dev/xvdba",
        // 3 staging_target_path: key 0x1A, len 12
        &[0x1A, 0x0C],
        b"/staging/pv1",
        // 4 volume_capability: key 0x22, len 17
        &[0x22, 0x11],
        //   2 mount: len 11; 1 fs_type "xfs"; 3 volume_mount_group "1000" (key 0x1A)
        &[0x12, 0x0B, 0x0A, 0x03],
        b"xfs",
        &[0x1A, 0x04],
        b"1000",
        //   3 access_mode {mode SINGLE_NODE_WRITER=1}
        &[0x1A, 0x02, 0x08, 0x01],
        // 5 secrets entry: key 0x2A
        &[0x2A, 0x06, 0x0A, 0x01, b'k', 0x12, 0x01, b'v'],
        // 6 volume_context entry: key 0x32
        &[0x32, 0x06, 0x0A, 0x01, b'a', 0x12, 0x01, b'b'],
    ]
    .concat();
    assert_wire(&req.encode_to_vec(), &expected);
}

#[test]
fn node_get_info_response_with_topology() {
    let resp = NodeGetInfoResponse {
        node_id: "i-0123".into(),
        max_volumes_per_node: 25,
        accessible_topology: Some(Topology::from_segments([(
            "topology.ebs.csi.aws.com/zone",
            "us-east-1a",
        )])),
    };
    let expected: Vec<u8> = [
        // 1 node_id: key 0x0A, "i-0123"
        &[0x0A, 0x06][..],
        b"i-0123",
        // 2 max_volumes_per_node: int64 varint, key 0x10, 25
        &[0x10, 0x19],
        // 3 accessible_topology: key 0x1A, len 45
        &[0x1A, 0x2D],
        //   1 segments entry: key 0x0A, len 43; key len 29, value len 10
        &[0x0A, 0x2B, 0x0A, 0x1D],
        b"topology.ebs.csi.aws.com/zone",
        &[0x12, 0x0A],
        b"us-east-1a",
    ]
    .concat();
    assert_wire(&resp.encode_to_vec(), &expected);
}

#[test]
fn create_snapshot_response_with_timestamp() {
    let resp = CreateSnapshotResponse {
        snapshot: Some(Snapshot {
            size_bytes: 1 << 30,
            snapshot_id: "snap-1".into(),
            source_volume_id: "vol-1".into(),
            creation_time: Some(prost_types::Timestamp {
                seconds: 1_700_000_000,
                nanos: 500,
            }),
            ready_to_use: true,
            group_snapshot_id: "grp-1".into(),
        }),
    };
    let expected: Vec<u8> = [
        // 1 snapshot: key 0x0A, len 41
        &[0x0A, 0x29][..],
        //   1 size_bytes: int64 2^30
        &[0x08, 0x80, 0x80, 0x80, 0x80, 0x04],
        //   2 snapshot_id: key 0x12
        &[0x12, 0x06],
        b"snap-1",
        //   3 source_volume_id: key 0x1A
        &[0x1A, 0x05],
        b"vol-1",
        //   4 creation_time: google.protobuf.Timestamp, key 0x22, len 9
        &[0x22, 0x09],
        //     1 seconds: 1_700_000_000 = 80 E2 CF AA 06
        &[0x08, 0x80, 0xE2, 0xCF, 0xAA, 0x06],
        //     2 nanos: 500 = F4 03
        &[0x10, 0xF4, 0x03],
        //   5 ready_to_use: bool, key 0x28
        &[0x28, 0x01],
        //   6 group_snapshot_id: key 0x32
        &[0x32, 0x05],
        b"grp-1",
    ]
    .concat();
    assert_wire(&resp.encode_to_vec(), &expected);
}

#[test]
fn capability_enums() {
    use controller_service_capability::rpc::Type as C;
    let resp = ControllerGetCapabilitiesResponse {
        capabilities: [
            C::CreateDeleteVolume,
            C::PublishUnpublishVolume,
            C::ModifyVolume,
            C::GetSnapshot,
        ]
        .into_iter()
        .map(ControllerServiceCapability::rpc)
        .collect(),
    };
    // Each: 1 capabilities (key 0x0A, len 4) → 1 rpc (key 0x0A, len 2) → 1 type (key 0x08).
    let expected = [
        0x0A, 0x04, 0x0A, 0x02, 0x08, 0x01, // CREATE_DELETE_VOLUME = 1
        0x0A, 0x04, 0x0A, 0x02, 0x08, 0x02, // PUBLISH_UNPUBLISH_VOLUME = 2
        0x0A, 0x04, 0x0A, 0x02, 0x08, 0x0E, // MODIFY_VOLUME = 14
        0x0A, 0x04, 0x0A, 0x02, 0x08, 0x0F, // GET_SNAPSHOT = 15
    ];
    assert_wire(&resp.encode_to_vec(), &expected);

    use node_service_capability::rpc::Type as N;
    let resp = NodeGetCapabilitiesResponse {
        capabilities: [N::StageUnstageVolume, N::ExpandVolume, N::VolumeMountGroup]
            .into_iter()
            .map(NodeServiceCapability::rpc)
            .collect(),
    };
    let expected = [
        0x0A, 0x04, 0x0A, 0x02, 0x08, 0x01, // STAGE_UNSTAGE_VOLUME = 1
        0x0A, 0x04, 0x0A, 0x02, 0x08, 0x03, // EXPAND_VOLUME = 3
        0x0A, 0x04, 0x0A, 0x02, 0x08, 0x06, // VOLUME_MOUNT_GROUP = 6
    ];
    assert_wire(&resp.encode_to_vec(), &expected);

    let resp = GetPluginCapabilitiesResponse {
        capabilities: vec![
            PluginCapability::service(plugin_capability::service::Type::ControllerService),
            PluginCapability::service(
                plugin_capability::service::Type::VolumeAccessibilityConstraints,
            ),
            PluginCapability::volume_expansion(plugin_capability::volume_expansion::Type::Online),
        ],
    };
    let expected = [
        0x0A, 0x04, 0x0A, 0x02, 0x08, 0x01, // 1 service {type CONTROLLER_SERVICE = 1}
        0x0A, 0x04, 0x0A, 0x02, 0x08,
        0x02, // 1 service {type VOLUME_ACCESSIBILITY_CONSTRAINTS = 2}
        0x0A, 0x04, 0x12, 0x02, 0x08, 0x01, // 2 volume_expansion {type ONLINE = 1}
    ];
    assert_wire(&resp.encode_to_vec(), &expected);
}

#[test]
fn wrappers_keep_presence() {
    // ready is google.protobuf.BoolValue: "false" is an empty but present message, unlike a
    // plain bool, which would vanish from the wire.
    let ready = ProbeResponse { ready: Some(true) };
    assert_wire(&ready.encode_to_vec(), &[0x0A, 0x02, 0x08, 0x01]);
    let not_ready = ProbeResponse { ready: Some(false) };
    assert_wire(&not_ready.encode_to_vec(), &[0x0A, 0x00]);
    assert_wire(&ProbeResponse { ready: None }.encode_to_vec(), &[]);

    let cap = GetCapacityResponse {
        available_capacity: 100,
        maximum_volume_size: Some(5),
        minimum_volume_size: Some(1),
    };
    let expected = [
        0x08, 0x64, // 1 available_capacity: int64 100
        0x12, 0x02, 0x08, 0x05, // 2 maximum_volume_size: Int64Value {1 value: 5}
        0x1A, 0x02, 0x08, 0x01, // 3 minimum_volume_size: Int64Value {1 value: 1}
    ];
    assert_wire(&cap.encode_to_vec(), &expected);
}

#[test]
fn int32_page_sizes_are_plain_varints() {
    // max_entries is int32 (not sint32): -1 takes ten bytes, sign-extended.
    let req = ListVolumesRequest {
        max_entries: -1,
        starting_token: "t".into(),
    };
    let expected = [
        0x08, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01, // 1 max_entries: -1
        0x12, 0x01, b't', // 2 starting_token: "t"
    ];
    assert_wire(&req.encode_to_vec(), &expected);
}

#[test]
fn modify_volume_request() {
    let req = ControllerModifyVolumeRequest {
        volume_id: "vol-1".into(),
        secrets: one("k", "v"),
        mutable_parameters: one("iops", "3000"),
    };
    let expected: Vec<u8> = [
        &[0x0A, 0x05][..], // 1 volume_id
        b"vol-1",
        &[0x12, 0x06, 0x0A, 0x01, b'k', 0x12, 0x01, b'v'], // 2 secrets entry
        &[0x1A, 0x0C, 0x0A, 0x04],                         // 3 mutable_parameters entry
        b"iops",
        &[0x12, 0x04],
        b"3000",
    ]
    .concat();
    assert_wire(&req.encode_to_vec(), &expected);
}

#[test]
fn snapshot_metadata_messages() {
    let req = GetMetadataDeltaRequest {
        base_snapshot_id: "a".into(),
        target_snapshot_id: "b".into(),
        starting_offset: 4096,
        max_results: 256,
        secrets: one("k", "v"),
    };
    let expected = [
        0x0A, 0x01, b'a', // 1 base_snapshot_id
        0x12, 0x01, b'b', // 2 target_snapshot_id
        0x18, 0x80, 0x20, // 3 starting_offset: int64 4096
        0x20, 0x80, 0x02, // 4 max_results: int32 256
        0x2A, 0x06, 0x0A, 0x01, b'k', 0x12, 0x01, b'v', // 5 secrets entry
    ];
    assert_wire(&req.encode_to_vec(), &expected);

    let resp = GetMetadataAllocatedResponse {
        block_metadata_type: BlockMetadataType::VariableLength.into(),
        volume_capacity_bytes: 1 << 30,
        block_metadata: vec![
            BlockMetadata {
                byte_offset: 0,
                size_bytes: 4096,
            },
            BlockMetadata {
                byte_offset: 8192,
                size_bytes: 4096,
            },
        ],
    };
    let expected = [
        0x08, 0x02, // 1 block_metadata_type: VARIABLE_LENGTH = 2
        0x10, 0x80, 0x80, 0x80, 0x80, 0x04, // 2 volume_capacity_bytes: 2^30
        0x1A, 0x03, 0x10, 0x80, 0x20, // 3 block_metadata[0]: offset 0 omitted, 2 size 4096
        0x1A, 0x06, 0x08, 0x80, 0x40, 0x10, 0x80, 0x20, // 3 [1]: 1 offset 8192, 2 size 4096
    ];
    assert_wire(&resp.encode_to_vec(), &expected);
}

#[test]
fn decode_hand_written_node_publish_request() {
    let bytes: Vec<u8> = [
        // 1 volume_id "vol-1"
        &[0x0A, 0x05][..],
        b"vol-1",
        // 2 publish_context entry "devicePath" -> "/dev/xvdba"
        &[0x12, 0x18, 0x0A, 0x0A],
        b"devicePath",
        &[0x12, 0x0A],
        b"/dev/xvdba",
        // 3 staging_target_path
        &[0x1A, 0x0C],
        b"/staging/pv1",
        // 4 target_path
        &[0x22, 0x0C],
        b"/pods/p1/vol",
        // 5 volume_capability: 2 mount {1 fs_type "ext4"}, 3 access_mode {mode 1}
        &[0x2A, 0x0C, 0x12, 0x06, 0x0A, 0x04],
        b"ext4",
        &[0x1A, 0x02, 0x08, 0x01],
        // 6 readonly true
        &[0x30, 0x01],
        // 7 secrets entry "k" -> "v"
        &[0x3A, 0x06, 0x0A, 0x01, b'k', 0x12, 0x01, b'v'],
        // 8 volume_context entry "a" -> "b"
        &[0x42, 0x06, 0x0A, 0x01, b'a', 0x12, 0x01, b'b'],
        // 99 an unknown field from a newer spec (varint 7): must be skipped, not rejected
        &[0x98, 0x06, 0x07],
    ]
    .concat();
    let req = NodePublishVolumeRequest::decode(bytes.as_slice()).unwrap();
    assert_eq!(req.volume_id, "vol-1");
    assert_eq!(req.publish_context, one("devicePath", "/dev/xvdba"));
    assert_eq!(req.staging_target_path, "/staging/pv1");
    assert_eq!(req.target_path, "/pods/p1/vol");
    let cap = req.volume_capability.as_ref().unwrap();
    assert_eq!(cap.mode(), Some(Mode::SingleNodeWriter));
    match &cap.access_type {
        Some(volume_capability::AccessType::Mount(m)) => {
            assert_eq!(m.fs_type, "ext4");
            assert!(m.mount_flags.is_empty());
        }
        other => panic!("expected a mount capability, got {other:?}"),
    }
    assert!(req.readonly);
    assert_eq!(req.secrets, one("k", "v"));
    assert_eq!(req.volume_context, one("a", "b"));

    let info = GetPluginInfoResponse::decode(
        [
            &[0x0A, 0x0F][..], // 1 name, len 15
            b"ebs.csi.aws.com",
            &[0x12, 0x03], // 2 vendor_version
            b"1.0",
            &[0x1A, 0x06, 0x0A, 0x01, b'k', 0x12, 0x01, b'v'], // 3 manifest entry
        ]
        .concat()
        .as_slice(),
    )
    .unwrap();
    assert_eq!(info.name, "ebs.csi.aws.com");
    assert_eq!(info.vendor_version, "1.0");
    assert_eq!(info.manifest, one("k", "v"));
}

#[test]
fn truncated_input_is_an_error_not_a_panic() {
    // 1 volume_id claims 5 bytes but only 2 follow.
    let err = NodeUnstageVolumeRequest::decode(&[0x0A, 0x05, b'v', b'o'][..]).unwrap_err();
    assert!(!err.to_string().is_empty());
}
