//! ec2-sim only: the AWS behaviour moto does not have at all (timing, faults, limits that need
//! state moto never reaches), driven through aws-sdk-ec2.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../common/mod.rs"]
mod common;

mod auth;
mod faults;
mod rules;
mod timing;
