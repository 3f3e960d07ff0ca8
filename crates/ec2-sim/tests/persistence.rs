//! A restarted simulator sees the same cloud: in-process restart, and the binary killed with
//! SIGKILL.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{Ec2, spawn_binary, start_with};
use ec2_sim::{SimConfig, Simulator, Timing};

#[tokio::test]
async fn restart_keeps_volumes_instances_snapshots_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let config = SimConfig {
        state_dir: dir.path().join("state"),
        timing: Timing::Instant,
        ..SimConfig::default()
    };
    let s = start_with(config.clone()).await;
    let token_params = [
        ("AvailabilityZone", "us-east-1a"),
        ("Size", "2"),
        ("ClientToken", "ct"),
    ];
    let v = s
        .ec2
        .ok("CreateVolume", &token_params)
        .await
        .get("volumeId");
    let i = s.ec2.run_instance("us-east-1a").await;
    s.ec2
        .ok(
            "AttachVolume",
            &[
                ("VolumeId", &v),
                ("InstanceId", &i),
                ("Device", "/dev/xvdba"),
            ],
        )
        .await;
    s.ec2
        .ok(
            "CreateTags",
            &[
                ("ResourceId.1", &v),
                ("Tag.1.Key", "k"),
                ("Tag.1.Value", "v"),
            ],
        )
        .await;
    let snap = s
        .ec2
        .ok("CreateSnapshot", &[("VolumeId", &v)])
        .await
        .get("snapshotId");
    let before = s.ec2.volume(&v).await;
    s.sim.shutdown().await.unwrap();
    assert!(dir.path().join("state/state.json").exists());
    assert!(!dir.path().join("state/state.json.tmp").exists());

    let sim = Simulator::start(config, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let ec2 = Ec2::new(sim.local_addr());
    let after = ec2.volume(&v).await;
    for field in [
        "volumeId",
        "size",
        "status",
        "createTime",
        "availabilityZone",
    ] {
        assert_eq!(before.get(field), after.get(field), "{field}");
    }
    assert_eq!(after.at("attachmentSet/item/instanceId"), i);
    assert_eq!(after.at("attachmentSet/item/status"), "attached");
    assert_eq!(after.at("tagSet/item/value"), "v");
    ec2.ok("DescribeSnapshots", &[("SnapshotId.1", &snap)])
        .await;
    // The client token survived too.
    assert_eq!(
        ec2.ok("CreateVolume", &token_params).await.get("volumeId"),
        v
    );
    // Call counts start over with the process.
    assert_eq!(sim.call_counts().get("CreateVolume"), Some(&1));
    sim.shutdown().await.unwrap();
}

#[tokio::test]
async fn corrupt_state_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("state.json"), "{]").unwrap();
    let err = Simulator::start(
        SimConfig {
            state_dir: dir.path().to_path_buf(),
            ..SimConfig::default()
        },
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("state.json"), "{err}");
}

#[tokio::test]
async fn binary_survives_sigkill_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().to_str().unwrap();
    let (mut child, addr, _log) = spawn_binary(&["--state-dir", state, "--timing", "instant"]);
    let ec2 = Ec2::new(addr);
    let v = ec2.create_volume("us-east-1a", "1", &[]).await;
    child.0.kill().unwrap(); // SIGKILL
    child.0.wait().unwrap();

    let (mut child, addr, _log) = spawn_binary(&["--state-dir", state, "--timing", "instant"]);
    let ec2 = Ec2::new(addr);
    assert_eq!(ec2.volume(&v).await.get("status"), "available");
    test_support::process::sigterm(&child.0);
    let mut status = None;
    for _ in 0..100 {
        if let Some(s) = child.0.try_wait().unwrap() {
            status = Some(s);
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(status.expect("exits after SIGTERM").success());
}

#[test]
fn binary_help_and_bad_flags() {
    let out = Command::new(env!("CARGO_BIN_EXE_ec2-sim"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--listen",
        "--state-dir",
        "--backing",
        "--timing",
        "--fault",
        "--max-attachments",
    ] {
        assert!(help.contains(flag), "{flag} missing in {help}");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_ec2-sim"))
        .args(["--state-dir", "/tmp/x", "--timing", "slow"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("timing"));
    let out = Command::new(env!("CARGO_BIN_EXE_ec2-sim"))
        .args(["--state-dir", "/tmp/x", "--fault", "{\"nope\":1}"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("nope"));
}
