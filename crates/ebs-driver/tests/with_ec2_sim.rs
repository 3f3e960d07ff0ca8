//! The node side against ec2-sim's real attachments: the simulator attaches a volume as a loop
//! device and creates the links an EC2 attach creates (`/dev/xvdba`, the NVMe by-id link) in its
//! device dir; the node service, pointed at that dir, stages and publishes it. Detach and
//! re-attach under another name keep the data, and nothing is reformatted.

// The Ec2 helper is not a #[test]; a failed call in it is a test failure, so unwrap is right.
#![allow(clippy::unwrap_used)]
mod common;

use std::time::{Duration, Instant};

use common::MIB;
use ebs_driver::{
    AccessType, PublishRequest, StageRequest, UnpublishRequest, UnstageRequest, VolumeStats,
};
use ec2_sim::{Backing, SimConfig, Simulator, Timing};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A minimal EC2 query-protocol client: one HTTP/1.1 POST per call, the XML searched by tag.
struct Ec2 {
    addr: std::net::SocketAddr,
}

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The text of the first `<tag>...</tag>`.
fn tag(xml: &str, name: &str) -> String {
    let open = format!("<{name}>");
    let start = xml.find(&open).map(|i| i + open.len());
    let end = start.and_then(|s| xml[s..].find(&format!("</{name}>")).map(|e| s + e));
    match (start, end) {
        (Some(s), Some(e)) => xml[s..e].to_string(),
        _ => String::new(),
    }
}

impl Ec2 {
    async fn call(&self, action: &str, params: &[(&str, &str)]) -> String {
        let mut body = format!("Action={action}&Version=2016-11-15");
        for (k, v) in params {
            body.push_str(&format!("&{}={}", encode(k), encode(v)));
        }
        let mut s = tokio::net::TcpStream::connect(self.addr).await.unwrap();
        // Signed with the sim's default test pair, as the SDK would.
        let [(date_name, date), (auth_name, auth)] = ec2_sim::sign_post(
            &self.addr.to_string(),
            body.as_bytes(),
            "us-east-1",
            ec2_sim::DEFAULT_ACCESS_KEY_ID,
            ec2_sim::DEFAULT_SECRET_ACCESS_KEY,
            std::time::SystemTime::now(),
        );
        let req = format!(
            "POST / HTTP/1.1\r\nHost: {}\r\n{date_name}: {date}\r\n{auth_name}: {auth}\r\nContent-Type: application/x-www-form-urlencoded; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.addr,
            body.len()
        );
        s.write_all(req.as_bytes()).await.unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).await.unwrap();
        assert!(
            resp.starts_with("HTTP/1.1 200"),
            "{action} {params:?}: {resp}"
        );
        resp
    }

    async fn wait_for(&self, volume_id: &str, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let xml = self
                .call("DescribeVolumes", &[("VolumeId.1", volume_id)])
                .await;
            if xml.contains(&format!("<status>{what}</status>")) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{volume_id} never became {what}: {xml}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn attach(&self, volume_id: &str, instance_id: &str, device: &str) {
        self.call(
            "AttachVolume",
            &[
                ("VolumeId", volume_id),
                ("InstanceId", instance_id),
                ("Device", device),
            ],
        )
        .await;
        self.wait_for(volume_id, "attached").await;
    }

    async fn detach(&self, volume_id: &str) {
        self.call("DetachVolume", &[("VolumeId", volume_id)]).await;
        self.wait_for(volume_id, "available").await;
    }
}

fn stage(volume_id: &str, device: Option<&str>, staging: &std::path::Path) -> StageRequest {
    StageRequest {
        volume_id: volume_id.into(),
        device_path: device.map(str::to_string),
        staging_path: staging.to_path_buf(),
        access: AccessType::Mount {
            fs_type: "ext4".into(),
            mount_flags: vec![],
        },
    }
}

#[tokio::test]
async fn stage_publish_detach_reattach_restage_on_ec2_sim() {
    let Some(fx) = fixture!() else { return };
    let config = SimConfig {
        state_dir: fx.path("sim-state"),
        device_dir: Some(fx.dev_root.clone()),
        backing: Backing::Loop,
        timing: Timing::Fast,
        ..SimConfig::default()
    };
    let zone = config
        .zones
        .first()
        .cloned()
        .unwrap_or_else(|| "us-east-1a".into());
    let sim = Simulator::start(config, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let ec2 = Ec2 {
        addr: sim.local_addr(),
    };

    let run = ec2
        .call(
            "RunInstances",
            &[
                ("ImageId", "ami-12345678"),
                ("MinCount", "1"),
                ("MaxCount", "1"),
                ("Placement.AvailabilityZone", &zone),
            ],
        )
        .await;
    let instance = tag(&run, "instanceId");
    let created = ec2
        .call(
            "CreateVolume",
            &[
                ("AvailabilityZone", &zone),
                ("Size", "1"),
                ("VolumeType", "gp3"),
            ],
        )
        .await;
    let vol = tag(&created, "volumeId");
    assert!(
        vol.starts_with("vol-") && instance.starts_with("i-"),
        "{vol} {instance}"
    );
    ec2.wait_for(&vol, "available").await;
    ec2.attach(&vol, &instance, "/dev/xvdba").await;

    let svc = fx.service();
    let staging = fx.path("staging");
    let target = fx.path("pods/p/mount");
    svc.stage(stage(&vol, Some("/dev/xvdba"), &staging))
        .await
        .unwrap();
    let publish = PublishRequest {
        volume_id: vol.clone(),
        device_path: Some("/dev/xvdba".into()),
        staging_path: staging.clone(),
        target_path: target.clone(),
        access: AccessType::Mount {
            fs_type: "ext4".into(),
            mount_flags: vec![],
        },
        read_only: false,
    };
    svc.publish(publish).await.unwrap();
    std::fs::write(target.join("hello.txt"), b"written through NodePublish").unwrap();
    let VolumeStats::Filesystem { bytes, .. } = svc.volume_stats(&vol, &target).await.unwrap()
    else {
        panic!("filesystem stats expected");
    };
    assert!(
        bytes.total > 900 * MIB && bytes.total <= 1024 * MIB,
        "{bytes:?}"
    );
    svc.unpublish(UnpublishRequest {
        volume_id: vol.clone(),
        target_path: target.clone(),
    })
    .await
    .unwrap();
    svc.unstage(UnstageRequest {
        volume_id: vol.clone(),
        staging_path: staging.clone(),
    })
    .await
    .unwrap();

    // Detach, attach under another name, stage through the NVMe by-id link only.
    ec2.detach(&vol).await;
    ec2.attach(&vol, &instance, "/dev/xvdbc").await;
    svc.stage(stage(&vol, None, &staging)).await.unwrap();
    assert_eq!(
        std::fs::read(staging.join("hello.txt")).unwrap(),
        b"written through NodePublish"
    );
    svc.unstage(UnstageRequest {
        volume_id: vol.clone(),
        staging_path: staging.clone(),
    })
    .await
    .unwrap();

    // A second volume attached under the first one's old name: staging the first volume through
    // that (now stale) name is refused, naming the volume the device belongs to.
    let other = tag(
        &ec2.call(
            "CreateVolume",
            &[
                ("AvailabilityZone", &zone),
                ("Size", "1"),
                ("VolumeType", "gp3"),
            ],
        )
        .await,
        "volumeId",
    );
    ec2.wait_for(&other, "available").await;
    ec2.attach(&other, &instance, "/dev/xvdba").await;
    let mut cfg = fx.config();
    cfg.device_wait = Duration::from_millis(300);
    // Only the stale name: leave the by-id link out of it by asking for a volume whose by-id
    // link does not exist (the first volume, detached again).
    ec2.detach(&vol).await;
    let err = ebs_driver::NodeService::new(cfg)
        .unwrap()
        .stage(stage(&vol, Some("/dev/xvdba"), &staging))
        .await
        .unwrap_err();
    assert!(
        matches!(err, ebs_driver::Error::WrongVolume { .. }),
        "{err}"
    );
    assert!(err.to_string().contains(&other), "{err}");

    ec2.detach(&other).await;
    sim.shutdown().await.unwrap();
}
