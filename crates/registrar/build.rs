//! Compiles `proto/pluginregistration.proto` with tonic-prost-build (protoc from
//! `protoc-bin-vendored`, as in `csi-spec`), then sets the RELR link flags that
//! `../../build/relr.rs` sets for every other binary crate (a package has one build script, and
//! that one's `main` is private, so its three lines are repeated here; see it for the why).

use std::io;
use std::path::PathBuf;

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
    println!("cargo:rerun-if-env-changed=CSI_RS_NO_RELR");
    let linux_gnu = std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux")
        && std::env::var("CARGO_CFG_TARGET_ENV").as_deref() == Ok("gnu");
    if linux_gnu && std::env::var_os("CSI_RS_NO_RELR").is_none() {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
    Ok(())
}
