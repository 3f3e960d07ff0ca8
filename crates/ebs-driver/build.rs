//! Link flags for the binaries (not the library, so nothing else is rebuilt).
//!
//! `-z pack-relative-relocs` stores the binary's relative relocations as RELR (a bitmap)
//! instead of 24-byte RELA entries. The dynamic loader reads every relocation at start-up, so
//! the RELA table (~1.4 MiB for this binary, mostly aws-sdk-ec2's vtables) counted in the
//! node-mode RSS although node mode never runs that code: with RELR the node plugin idles at
//! 7.0 MiB instead of 8.5 MiB (docs/benchmarks.md). It needs GNU ld ≥ 2.38 or lld and glibc ≥ 2.36
//! at run time (Debian 12, Ubuntu 22.04); `CSI_RS_NO_RELR=1` turns it off for older systems.
fn main() {
    println!("cargo:rerun-if-env-changed=CSI_RS_NO_RELR");
    let linux_gnu = std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux")
        && std::env::var("CARGO_CFG_TARGET_ENV").as_deref() == Ok("gnu");
    if linux_gnu && std::env::var_os("CSI_RS_NO_RELR").is_none() {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}
