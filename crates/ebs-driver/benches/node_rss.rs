//! Memory of the node-mode driver (the target: ≤ 10 MiB RSS; the Go driver's chart
//! requests 40 MiB): the release binary is started on a unix socket, its RSS read from
//! /proc idle, then after 100 NodeStageVolume + NodeUnstageVolume cycles over gRPC on a real
//! loop device (the first stage formats ext4; the others fsck and mount).
//!
//! Run (as root, needs /dev/loop-control): `cargo bench -p ebs-driver --bench node_rss`

// A benchmark that cannot set up has nothing to measure: failing loudly is right.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use common::{MIB, VOL_A};
use csi_spec::v1::node_client::NodeClient;
use csi_spec::v1::volume_capability::access_mode::Mode;
use csi_spec::v1::{NodeStageVolumeRequest, NodeUnstageVolumeRequest, VolumeCapability};

const CYCLES: usize = 100;

/// Kills the driver on drop, also when the benchmark fails half-way.
struct Driver(Child);

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn status_kib(pid: u32, key: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("status field")
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo bench -- --list` and `cargo test --benches` probes: nothing to list.
    }
    if let Some(why) = common::missing_parts() {
        eprintln!("SKIPPED: {why}; the node RSS benchmark needs real loop devices");
        return;
    }
    let mut fx = common::Fixture::new();
    fx.attach_linked(VOL_A, 256 * MIB, "xvdba");
    let sock = fx.path("csi.sock");
    let endpoint = format!("unix://{}", sock.display());
    let child = Command::new(env!("CARGO_BIN_EXE_ebs-csi-driver"))
        .args(["--mode", "node"])
        .args(["--node-id", "i-0123456789abcdef0", "--zone", "us-east-1a"])
        .arg("--endpoint")
        .arg(&endpoint)
        .arg("--dev-root")
        .arg(&fx.dev_root)
        .env("RUST_LOG", "warn")
        .spawn()
        .expect("start ebs-csi-driver");
    let driver = Driver(child);
    let pid = driver.0.id();

    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    let staging = fx.path("staging").display().to_string();
    let (idle, after, peak, elapsed) = rt.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(10);
        let channel = loop {
            match csi_spec::connect_unix(&endpoint).await {
                Ok(c) => break c,
                Err(_) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("driver never came up: {e}"),
            }
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        let idle = status_kib(pid, "VmRSS:");
        let mut node = NodeClient::new(channel);
        let started = Instant::now();
        for _ in 0..CYCLES {
            node.node_stage_volume(NodeStageVolumeRequest {
                volume_id: VOL_A.into(),
                publish_context: HashMap::from([("devicePath".into(), "/dev/xvdba".into())]),
                staging_target_path: staging.clone(),
                volume_capability: Some(VolumeCapability::mount(
                    "ext4",
                    vec![],
                    Mode::SingleNodeWriter,
                )),
                ..Default::default()
            })
            .await
            .expect("stage");
            node.node_unstage_volume(NodeUnstageVolumeRequest {
                volume_id: VOL_A.into(),
                staging_target_path: staging.clone(),
            })
            .await
            .expect("unstage");
        }
        let elapsed = started.elapsed();
        (
            idle,
            status_kib(pid, "VmRSS:"),
            status_kib(pid, "VmHWM:"),
            elapsed,
        )
    });
    println!("| node-mode ebs-csi-driver (release) | RSS |");
    println!("|---|---|");
    println!("| idle, serving | {:.1} MiB |", idle as f64 / 1024.0);
    println!(
        "| after {CYCLES} stage/unstage cycles | {:.1} MiB |",
        after as f64 / 1024.0
    );
    println!("| peak (VmHWM) | {:.1} MiB |", peak as f64 / 1024.0);
    println!(
        "{CYCLES} cycles took {:.2} s ({:.1} ms per stage + unstage, ext4 256 MiB, e2fsck + mount + umount)",
        elapsed.as_secs_f64(),
        elapsed.as_secs_f64() * 1000.0 / CYCLES as f64
    );
    drop(driver);
    drop(fx);
}
