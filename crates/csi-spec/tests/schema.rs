//! Pins the CSI v1.12 schema beyond single messages: every enum value's number and name, the
//! package, services, methods and streaming flags (the HTTP/2 paths), and the option extensions.

use csi_spec::v1::volume_capability::access_mode::Mode;
use csi_spec::v1::*;
use prost::Message;

/// Every enum value's number and proto name, as the spec defines them.
#[test]
fn enum_numbers_and_names() {
    use controller_service_capability::rpc::Type as C;
    let controller = [
        (C::Unknown, 0, "UNKNOWN"),
        (C::CreateDeleteVolume, 1, "CREATE_DELETE_VOLUME"),
        (C::PublishUnpublishVolume, 2, "PUBLISH_UNPUBLISH_VOLUME"),
        (C::ListVolumes, 3, "LIST_VOLUMES"),
        (C::GetCapacity, 4, "GET_CAPACITY"),
        (C::CreateDeleteSnapshot, 5, "CREATE_DELETE_SNAPSHOT"),
        (C::ListSnapshots, 6, "LIST_SNAPSHOTS"),
        (C::CloneVolume, 7, "CLONE_VOLUME"),
        (C::PublishReadonly, 8, "PUBLISH_READONLY"),
        (C::ExpandVolume, 9, "EXPAND_VOLUME"),
        (
            C::ListVolumesPublishedNodes,
            10,
            "LIST_VOLUMES_PUBLISHED_NODES",
        ),
        (C::VolumeCondition, 11, "VOLUME_CONDITION"),
        (C::GetVolume, 12, "GET_VOLUME"),
        (C::SingleNodeMultiWriter, 13, "SINGLE_NODE_MULTI_WRITER"),
        (C::ModifyVolume, 14, "MODIFY_VOLUME"),
        (C::GetSnapshot, 15, "GET_SNAPSHOT"),
    ];
    for (v, n, name) in controller {
        assert_eq!((v as i32, v.as_str_name()), (n, name));
    }

    use node_service_capability::rpc::Type as N;
    let node = [
        (N::Unknown, 0, "UNKNOWN"),
        (N::StageUnstageVolume, 1, "STAGE_UNSTAGE_VOLUME"),
        (N::GetVolumeStats, 2, "GET_VOLUME_STATS"),
        (N::ExpandVolume, 3, "EXPAND_VOLUME"),
        (N::VolumeCondition, 4, "VOLUME_CONDITION"),
        (N::SingleNodeMultiWriter, 5, "SINGLE_NODE_MULTI_WRITER"),
        (N::VolumeMountGroup, 6, "VOLUME_MOUNT_GROUP"),
    ];
    for (v, n, name) in node {
        assert_eq!((v as i32, v.as_str_name()), (n, name));
    }

    let modes = [
        (Mode::Unknown, 0, "UNKNOWN"),
        (Mode::SingleNodeWriter, 1, "SINGLE_NODE_WRITER"),
        (Mode::SingleNodeReaderOnly, 2, "SINGLE_NODE_READER_ONLY"),
        (Mode::MultiNodeReaderOnly, 3, "MULTI_NODE_READER_ONLY"),
        (Mode::MultiNodeSingleWriter, 4, "MULTI_NODE_SINGLE_WRITER"),
        (Mode::MultiNodeMultiWriter, 5, "MULTI_NODE_MULTI_WRITER"),
        (Mode::SingleNodeSingleWriter, 6, "SINGLE_NODE_SINGLE_WRITER"),
        (Mode::SingleNodeMultiWriter, 7, "SINGLE_NODE_MULTI_WRITER"),
    ];
    for (v, n, name) in modes {
        assert_eq!((v as i32, v.as_str_name()), (n, name));
    }

    use plugin_capability::service::Type as P;
    let plugin = [
        (P::Unknown, 0, "UNKNOWN"),
        (P::ControllerService, 1, "CONTROLLER_SERVICE"),
        (
            P::VolumeAccessibilityConstraints,
            2,
            "VOLUME_ACCESSIBILITY_CONSTRAINTS",
        ),
        (P::GroupControllerService, 3, "GROUP_CONTROLLER_SERVICE"),
        (P::SnapshotMetadataService, 4, "SNAPSHOT_METADATA_SERVICE"),
    ];
    for (v, n, name) in plugin {
        assert_eq!((v as i32, v.as_str_name()), (n, name));
    }

    use plugin_capability::volume_expansion::Type as E;
    assert_eq!((E::Online as i32, E::Offline as i32), (1, 2));
    use volume_usage::Unit;
    assert_eq!((Unit::Bytes as i32, Unit::Inodes as i32), (1, 2));
    use group_controller_service_capability::rpc::Type as G;
    assert_eq!(G::CreateDeleteGetVolumeGroupSnapshot as i32, 1);
    assert_eq!(
        (
            BlockMetadataType::FixedLength as i32,
            BlockMetadataType::VariableLength as i32
        ),
        (1, 2)
    );
}

/// The gRPC surface: package, services, method names and streaming flags, from the compiled
/// descriptor (these make the HTTP/2 paths `/csi.v1.<Service>/<Method>`).
#[test]
fn services_and_methods() {
    let fds = prost_types::FileDescriptorSet::decode(csi_spec::FILE_DESCRIPTOR_SET).unwrap();
    let csi = fds
        .file
        .iter()
        .find(|f| f.name() == "csi.proto")
        .expect("csi.proto in the descriptor set");
    assert_eq!(csi.package(), "csi.v1");
    assert_eq!(
        csi.options.as_ref().map(|o| o.go_package()),
        Some("github.com/container-storage-interface/spec/lib/go/csi")
    );
    let services: Vec<(&str, Vec<(&str, bool)>)> = csi
        .service
        .iter()
        .map(|s| {
            (
                s.name(),
                s.method
                    .iter()
                    .map(|m| (m.name(), m.server_streaming()))
                    .collect(),
            )
        })
        .collect();
    let unary = |names: &[&'static str]| names.iter().map(|n| (*n, false)).collect::<Vec<_>>();
    assert_eq!(
        services,
        vec![
            (
                "Identity",
                unary(&["GetPluginInfo", "GetPluginCapabilities", "Probe"])
            ),
            (
                "Controller",
                unary(&[
                    "CreateVolume",
                    "DeleteVolume",
                    "ControllerPublishVolume",
                    "ControllerUnpublishVolume",
                    "ValidateVolumeCapabilities",
                    "ListVolumes",
                    "GetCapacity",
                    "ControllerGetCapabilities",
                    "CreateSnapshot",
                    "DeleteSnapshot",
                    "ListSnapshots",
                    "GetSnapshot",
                    "ControllerExpandVolume",
                    "ControllerGetVolume",
                    "ControllerModifyVolume",
                ])
            ),
            (
                "GroupController",
                unary(&[
                    "GroupControllerGetCapabilities",
                    "CreateVolumeGroupSnapshot",
                    "DeleteVolumeGroupSnapshot",
                    "GetVolumeGroupSnapshot",
                ])
            ),
            (
                "SnapshotMetadata",
                vec![("GetMetadataAllocated", true), ("GetMetadataDelta", true)]
            ),
            (
                "Node",
                unary(&[
                    "NodeStageVolume",
                    "NodeUnstageVolume",
                    "NodePublishVolume",
                    "NodeUnpublishVolume",
                    "NodeGetVolumeStats",
                    "NodeExpandVolume",
                    "NodeGetCapabilities",
                    "NodeGetInfo",
                ])
            ),
        ]
    );
    assert_eq!(
        csi_spec::v1::identity_server::SERVICE_NAME,
        "csi.v1.Identity"
    );
    assert_eq!(csi_spec::v1::node_server::SERVICE_NAME, "csi.v1.Node");
    assert_eq!(
        csi_spec::v1::controller_server::SERVICE_NAME,
        "csi.v1.Controller"
    );
}

/// The option extensions are declared with the spec's numbers (1059 secret, 1060 alpha).
#[test]
fn option_extensions() {
    let fds = prost_types::FileDescriptorSet::decode(csi_spec::FILE_DESCRIPTOR_SET).unwrap();
    let csi = fds.file.iter().find(|f| f.name() == "csi.proto").unwrap();
    let mut ext: Vec<(&str, &str, i32)> = csi
        .extension
        .iter()
        .map(|e| (e.extendee(), e.name(), e.number()))
        .collect();
    ext.sort_unstable();
    assert_eq!(
        ext,
        vec![
            (".google.protobuf.EnumOptions", "alpha_enum", 1060),
            (
                ".google.protobuf.EnumValueOptions",
                "alpha_enum_value",
                1060
            ),
            (".google.protobuf.FieldOptions", "alpha_field", 1060),
            (".google.protobuf.FieldOptions", "csi_secret", 1059),
            (".google.protobuf.MessageOptions", "alpha_message", 1060),
            (".google.protobuf.MethodOptions", "alpha_method", 1060),
            (".google.protobuf.ServiceOptions", "alpha_service", 1060),
        ]
    );
}
