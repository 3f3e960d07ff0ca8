//! The driver process killed (SIGKILL) in the middle of CreateVolume and of
//! ControllerPublishVolume, started again, and the call repeated: one volume, one attachment,
//! the same device name. ec2-sim runs with AWS-like timing, so there is a middle to kill in.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod ctl;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use csi_spec::v1::controller_client::ControllerClient;
use ctl::{Env, GIB, create_req, publish_req};
use ebs_cloud::Cloud;
use ec2_sim::{Backing, Timing};

/// The driver binary as a child process; killed on drop.
struct Process {
    child: Child,
}

impl Process {
    async fn start(
        env: &Env,
        socket: &str,
    ) -> (Process, ControllerClient<tonic::transport::Channel>) {
        let child = Command::new(env!("CARGO_BIN_EXE_ebs-csi-driver"))
            .args([
                "--mode",
                "controller",
                "--endpoint",
                socket,
                "--ec2-endpoint",
                &env.sim.endpoint(),
                "--region",
                "us-east-1",
            ])
            .env("AWS_ACCESS_KEY_ID", "AKIDTEST")
            .env("AWS_SECRET_ACCESS_KEY", "secret")
            .env_remove("AWS_PROFILE")
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let p = Process { child };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(ch) = csi_spec::connect_unix(socket).await {
                return (p, ControllerClient::new(ch));
            }
            assert!(Instant::now() < deadline, "the driver did not start");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn wait_for_call(env: &Env, action: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while env.sim.call_counts().get(action).copied().unwrap_or(0) == 0 {
        assert!(Instant::now() < deadline, "{action} was never called");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_during_create_volume_then_repeated_gives_one_volume() {
    let env = Env::start(Timing::Realistic, Backing::File, 26).await;
    let socket = format!("unix://{}", env.path("csi.sock").display());
    let (p, mut c) = Process::start(&env, &socket).await;
    env.sim.reset_call_counts();
    let mut c1 = c.clone();
    let call = tokio::spawn(async move { c1.create_volume(create_req("pvc-crash", GIB)).await });
    wait_for_call(&env, "CreateVolume").await;
    // The volume is `creating` (about 1.5 s): kill the driver while it waits.
    p.kill();
    assert!(
        call.await.unwrap().is_err(),
        "the call cannot have finished"
    );
    drop(c);
    let (_p2, c2) = Process::start(&env, &socket).await;
    c = c2;
    let v = c
        .create_volume(create_req("pvc-crash", GIB))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    // Exactly one volume carries the name (two would be an "Ambiguous" error here).
    let disk = env
        .cloud
        .get_disk_by_name("pvc-crash")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(disk.volume_id, v.volume_id);
    assert_eq!(disk.state, "available");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_during_publish_then_repeated_gives_one_attachment_with_the_same_device() {
    let env = Env::start(Timing::Realistic, Backing::File, 26).await;
    let socket = format!("unix://{}", env.path("csi.sock").display());
    let (p, c) = Process::start(&env, &socket).await;
    let v = c
        .clone()
        .create_volume(create_req("pvc-crash-pub", GIB))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    env.sim.reset_call_counts();
    let mut c1 = c.clone();
    let (vid, node) = (v.volume_id.clone(), env.node_id.clone());
    let call =
        tokio::spawn(async move { c1.controller_publish_volume(publish_req(&vid, &node)).await });
    wait_for_call(&env, "AttachVolume").await;
    // The attachment is `attaching` (1-4 s): kill the driver now.
    p.kill();
    assert!(call.await.unwrap().is_err());
    let during = env.cloud.get_disk_by_id(&v.volume_id).await.unwrap();
    let device_before = during.attachments[0].device.clone();
    drop(c);
    let (_p2, mut c) = Process::start(&env, &socket).await;
    let r = c
        .controller_publish_volume(publish_req(&v.volume_id, &env.node_id))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.publish_context["devicePath"], device_before);
    let disk = env.cloud.get_disk_by_id(&v.volume_id).await.unwrap();
    assert_eq!(disk.attachments.len(), 1);
    assert_eq!(
        env.sim.call_counts().get("AttachVolume").copied(),
        Some(1),
        "attached once"
    );
}
