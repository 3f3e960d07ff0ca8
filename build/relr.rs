//! The one build script of every crate with a binary (`build = "../../build/relr.rs"`): link
//! flags for the binaries only (`rustc-link-arg-bins`, so no library and nothing downstream is
//! rebuilt for it).
//!
//! `-z pack-relative-relocs` stores a binary's relative relocations as RELR (a bitmap) instead of
//! 24-byte RELA entries. The dynamic loader applies every relocation at start-up, so a RELA
//! table (vtables and static tables of aws-sdk-ec2, kube, hyper, rustls, tonic) costs its size
//! in resident pages in every process: ~1.4 MiB for the EBS driver's node plugin, ~0.8 MiB for
//! csi-attacher; as RELR it is a few KiB (docs/benchmarks.md). It needs GNU ld ≥ 2.38 or lld
//! and glibc ≥ 2.36 at run time (Debian 12, Ubuntu 22.04); `CSI_RS_NO_RELR=1` turns it off for
//! older systems.
// Also a module of build scripts that have more to do (`#[path = "../../build/relr.rs"] mod
// relr;`, e.g. crates/registrar's, which compiles a proto): they call `link_args` and leave
// `main` unused.
#[allow(dead_code)]
fn main() {
    link_args();
}

/// Prints the RELR link argument for the package's binaries.
pub fn link_args() {
    println!("cargo:rerun-if-env-changed=CSI_RS_NO_RELR");
    let linux_gnu = std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux")
        && std::env::var("CARGO_CFG_TARGET_ENV").as_deref() == Ok("gnu");
    if linux_gnu && std::env::var_os("CSI_RS_NO_RELR").is_none() {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}
