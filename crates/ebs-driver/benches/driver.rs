//! `cargo bench -p ebs-driver --bench driver`: the issue-4 measurements, printed as the tables of
//! docs/benchmarks.md. Not criterion: each number is one scenario run end to end against the
//! driver binary as a separate process (RSS is per process) and ec2-sim in this one.
//!
//! - describe calls for 100 concurrent ControllerPublish, batching on vs off;
//! - ControllerPublish p50/p99 with the sim's realistic timing, batching on vs off;
//! - controller RSS (peak) under those 100 publishes.
//!
//! Node-mode RSS is `scripts/bench-node-rss` (it measures the release binary a user runs).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use csi_spec::v1::controller_client::ControllerClient;
use csi_spec::v1::volume_capability::access_mode::Mode;
use csi_spec::v1::*;
use ebs_cloud::{Cloud, CloudMetrics, DiskOptions};
use ebs_cloud_aws::{AwsCloud, AwsConfig};
use ec2_sim::{Backing, SimConfig, Simulator, Timing};
use tonic::transport::Channel;

struct Proc(Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

async fn start_driver(args: &[&str], socket: &str) -> (Proc, Channel) {
    let child = Command::new(env!("CARGO_BIN_EXE_ebs-csi-driver"))
        .args(args)
        .args(["--endpoint", socket])
        .env("AWS_ACCESS_KEY_ID", "AKIDBENCH")
        .env("AWS_SECRET_ACCESS_KEY", "secret")
        .env("RUST_LOG", "error")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let p = Proc(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(ch) = csi_spec::connect_unix(socket).await {
            return (p, ch);
        }
        assert!(Instant::now() < deadline, "driver did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn aws(endpoint: &str) -> AwsConfig {
    AwsConfig {
        region: Some("us-east-1".into()),
        endpoint: Some(endpoint.into()),
        static_credentials: Some(("AKIDBENCH".into(), "secret".into())),
        ..AwsConfig::default()
    }
}

fn cap() -> VolumeCapability {
    VolumeCapability::mount("ext4", vec![], Mode::SingleNodeWriter)
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

struct PublishRun {
    describe_volumes: u64,
    describe_instances: u64,
    p50: Duration,
    p99: Duration,
    peak_rss_kib: u64,
}

async fn publish_run(batching: bool, n: usize) -> PublishRun {
    let dir = tempfile::tempdir().unwrap();
    let sim = Simulator::start(
        SimConfig {
            state_dir: dir.path().join("ec2"),
            timing: Timing::Realistic,
            backing: Backing::File,
            max_attachments_per_instance: 128,
            credentials: ec2_sim::Credentials::single("AKIDBENCH", "secret"),
            ..SimConfig::default()
        },
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap();
    let cloud = AwsCloud::new(aws(&sim.endpoint()), CloudMetrics::new())
        .await
        .unwrap();
    let node = cloud
        .run_instance("bench-node", None)
        .await
        .unwrap()
        .instance_id;
    // Volumes made directly (fast path of the sim is not what is measured).
    let mut vols = Vec::new();
    let mut tasks = Vec::new();
    let cloud = Arc::new(cloud);
    for i in 0..n {
        let c = cloud.clone();
        tasks.push(tokio::spawn(async move {
            c.create_disk(
                &format!("bench-{i}"),
                &DiskOptions {
                    size_gib: 1,
                    volume_type: "gp3".into(),
                    zone: "us-east-1a".into(),
                    ..DiskOptions::default()
                },
            )
            .await
            .unwrap()
            .volume_id
        }));
    }
    for t in tasks {
        vols.push(t.await.unwrap());
    }
    let socket = format!("unix://{}", dir.path().join("csi.sock").display());
    let endpoint = sim.endpoint();
    let batching_flag = format!("--batching={batching}");
    let (proc_, ch) = start_driver(
        &[
            "--mode",
            "controller",
            "--ec2-endpoint",
            &endpoint,
            "--region",
            "us-east-1",
            &batching_flag,
            "--volume-attach-limit",
            "128",
        ],
        &socket,
    )
    .await;
    let pid = proc_.0.id();
    let peak = Arc::new(AtomicU64::new(rss_kib(pid)));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, done) = (peak.clone(), done.clone());
        tokio::spawn(async move {
            while !done.load(Ordering::Relaxed) {
                peak.fetch_max(rss_kib(pid), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    sim.reset_call_counts();
    let mut tasks = Vec::new();
    for v in vols.clone() {
        let mut c = ControllerClient::new(ch.clone());
        let node = node.clone();
        tasks.push(tokio::spawn(async move {
            let t = Instant::now();
            c.controller_publish_volume(ControllerPublishVolumeRequest {
                volume_id: v,
                node_id: node,
                volume_capability: Some(cap()),
                ..Default::default()
            })
            .await
            .unwrap();
            t.elapsed()
        }));
    }
    let mut lat = Vec::new();
    for t in tasks {
        lat.push(t.await.unwrap());
    }
    done.store(true, Ordering::Relaxed);
    let _ = sampler.await;
    let counts = sim.call_counts();
    lat.sort();
    drop(proc_);
    let _ = sim.shutdown().await;
    PublishRun {
        describe_volumes: counts.get("DescribeVolumes").copied().unwrap_or(0),
        describe_instances: counts.get("DescribeInstances").copied().unwrap_or(0),
        p50: pct(&lat, 0.5),
        p99: pct(&lat, 0.99),
        peak_rss_kib: peak.load(Ordering::Relaxed),
    }
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` passes nothing we need.
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let n = 100;
        let on = publish_run(true, n).await;
        let off = publish_run(false, n).await;
        println!(
            "| {n} concurrent ControllerPublish (sim: realistic) | batching on | batching off |"
        );
        println!("|---|---|---|");
        println!(
            "| DescribeVolumes calls | {} | {} |",
            on.describe_volumes, off.describe_volumes
        );
        println!(
            "| DescribeInstances calls | {} | {} |",
            on.describe_instances, off.describe_instances
        );
        println!(
            "| describe calls total (ratio off/on) | {} | {} ({:.1}x) |",
            on.describe_volumes + on.describe_instances,
            off.describe_volumes + off.describe_instances,
            (off.describe_volumes + off.describe_instances) as f64
                / (on.describe_volumes + on.describe_instances).max(1) as f64
        );
        println!(
            "| ControllerPublish p50 | {:.2} s | {:.2} s |",
            on.p50.as_secs_f64(),
            off.p50.as_secs_f64()
        );
        println!(
            "| ControllerPublish p99 | {:.2} s | {:.2} s |",
            on.p99.as_secs_f64(),
            off.p99.as_secs_f64()
        );
        println!(
            "| controller RSS, peak | {:.1} MiB | {:.1} MiB |",
            on.peak_rss_kib as f64 / 1024.0,
            off.peak_rss_kib as f64 / 1024.0
        );
    });
}
