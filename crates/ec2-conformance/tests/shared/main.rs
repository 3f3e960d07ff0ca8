//! The shared scenarios: each runs once against ec2-sim (which must behave like AWS) and once
//! against moto_server (asserting what moto really does, so docs/ec2-moto-differences.md
//! stays true).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../common/mod.rs"]
mod common;

mod attach;
mod create;
mod describe;
mod instances;
mod snapshots;
mod volumes;
