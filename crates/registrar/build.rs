//! Compiles `proto/pluginregistration.proto` with tonic-prost-build (protoc from
//! `protoc-bin-vendored`, as in `csi-spec`), then sets the RELR link flags of every binary crate
//! (`../../build/relr.rs`, included as a module: a package has one build script).

use std::io;
use std::path::PathBuf;

#[path = "../../build/relr.rs"]
mod relr;

fn main() -> io::Result<()> {
    let protoc = protoc_bin_vendored::protoc_bin_path().map_err(io::Error::other)?;
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc);
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_with_config(
            config,
            &[PathBuf::from("proto/pluginregistration.proto")],
            &[PathBuf::from("proto")],
        )?;
    println!("cargo:rerun-if-changed=proto/pluginregistration.proto");
    relr::link_args();
    Ok(())
}
