//! Compiles `proto/csi.proto` into Rust with tonic-prost-build.
//!
//! protoc comes from `protoc-bin-vendored`, so no system protoc is needed; its bundled include
//! directory supplies google/protobuf/{descriptor,timestamp,wrappers}.proto. The protoc path is
//! handed to prost through `Config::protoc_executable` (the programmatic form of `PROTOC`):
//! `std::env::set_var` is `unsafe` in edition 2024 and the workspace denies unsafe code.
//! A file descriptor set is written next to the generated code for gRPC reflection.

use std::env;
use std::io;
use std::path::PathBuf;

/// Messages with a `csi_secret` map: their `Debug` is hand-written in `src/redact.rs` so that
/// secret values never reach logs.
const SECRET_MESSAGES: &[&str] = &[
    "CreateVolumeRequest",
    "DeleteVolumeRequest",
    "ControllerPublishVolumeRequest",
    "ControllerUnpublishVolumeRequest",
    "ValidateVolumeCapabilitiesRequest",
    "ControllerModifyVolumeRequest",
    "CreateSnapshotRequest",
    "DeleteSnapshotRequest",
    "ListSnapshotsRequest",
    "GetSnapshotRequest",
    "ControllerExpandVolumeRequest",
    "NodeStageVolumeRequest",
    "NodePublishVolumeRequest",
    "NodeExpandVolumeRequest",
    "CreateVolumeGroupSnapshotRequest",
    "DeleteVolumeGroupSnapshotRequest",
    "GetVolumeGroupSnapshotRequest",
    "GetMetadataAllocatedRequest",
    "GetMetadataDeltaRequest",
];

fn main() -> io::Result<()> {
    let protoc = protoc_bin_vendored::protoc_bin_path().map_err(io::Error::other)?;
    let well_known = protoc_bin_vendored::include_path().map_err(io::Error::other)?;
    let out_dir = env::var_os("OUT_DIR")
        .map(PathBuf::from)
        .ok_or_else(|| io::Error::other("cargo did not set OUT_DIR"))?;

    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc);

    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // Servers implement only the RPCs they support; the rest answer UNIMPLEMENTED, which is
        // exactly what the spec asks of an RPC a plugin does not offer.
        .generate_default_stubs(true)
        .skip_debug(SECRET_MESSAGES.iter().map(|m| format!(".csi.v1.{m}")))
        .file_descriptor_set_path(out_dir.join("csi_descriptor.bin"))
        .compile_with_config(
            config,
            &[PathBuf::from("proto/csi.proto")],
            &[PathBuf::from("proto"), well_known],
        )?;
    println!("cargo:rerun-if-changed=proto/csi.proto");
    Ok(())
}
