//! A driver that stops (cleanly, or by SIGKILL of the real binary) and starts again on the same
//! state directory knows its volumes, adopts the loop devices it attached instead of attaching
//! more, and can still unstage. Also the binary's flags and its SIGTERM shutdown.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use csi_spec::v1::controller_client::ControllerClient;
use csi_spec::v1::node_client::NodeClient;
use csi_spec::v1::*;

const BIN: &str = env!("CARGO_BIN_EXE_hostpath-csi-driver");

#[tokio::test]
async fn in_process_restart_keeps_volumes_and_loop_devices() {
    if !root_parts_or_skip("restart is checked against real mounts and loop devices") {
        return;
    }
    let s = Scratch::new();
    let d = Driver::start(config(&s)).await;
    let (mut c, mut n) = (d.controller(), d.node());
    let m = create(&mut c, "pvc-m", MIB, mount_cap()).await;
    let b = create(&mut c, "pvc-b", 8 * MIB, block_cap()).await;
    let image = s
        .state_dir()
        .join("volumes")
        .join(format!("{}.img", b.volume_id));
    let (sm, sb) = (s.path("stage-m"), s.path("stage-b"));
    let (tm, tb) = (s.path("pod/m"), s.path("pod/b"));
    n.node_stage_volume(stage_req(&m.volume_id, &sm, mount_cap()))
        .await
        .unwrap();
    n.node_stage_volume(stage_req(&b.volume_id, &sb, block_cap()))
        .await
        .unwrap();
    n.node_publish_volume(publish_req(
        &m.volume_id,
        Some(&sm),
        &tm,
        mount_cap(),
        false,
    ))
    .await
    .unwrap();
    n.node_publish_volume(publish_req(
        &b.volume_id,
        Some(&sb),
        &tb,
        block_cap(),
        false,
    ))
    .await
    .unwrap();
    let loops = loops_of(&image);
    assert_eq!(loops.len(), 1);
    let socket = PathBuf::from(d.endpoint.trim_start_matches("unix://"));
    drop((c, n));
    d.stop().await;
    assert!(!socket.exists(), "a clean stop removes the socket");

    let d = Driver::start(config(&s)).await;
    let (mut c, mut n) = (d.controller(), d.node());
    let mut ids = list_all(&mut c, 0).await;
    ids.sort();
    let mut want = vec![m.volume_id.clone(), b.volume_id.clone()];
    want.sort();
    assert_eq!(ids, want);
    // Repeats after the restart find the work done: same loop device, one mount each.
    n.node_stage_volume(stage_req(&b.volume_id, &sb, block_cap()))
        .await
        .unwrap();
    n.node_publish_volume(publish_req(
        &b.volume_id,
        Some(&sb),
        &tb,
        block_cap(),
        false,
    ))
    .await
    .unwrap();
    n.node_publish_volume(publish_req(
        &m.volume_id,
        Some(&sm),
        &tm,
        mount_cap(),
        false,
    ))
    .await
    .unwrap();
    assert_eq!(loops_of(&image), loops, "the loop device is adopted");
    assert_eq!(mounts_at(&tb), 1);
    assert_eq!(mounts_at(&tm), 1);
    // Deleting a volume the restarted driver knows is in use is refused.
    expect_code(
        c.delete_volume(DeleteVolumeRequest {
            volume_id: b.volume_id.clone(),
            ..Default::default()
        })
        .await,
        tonic::Code::FailedPrecondition,
        "in use",
    );
    teardown(&mut n, &m.volume_id, &sm, &tm).await;
    teardown(&mut n, &b.volume_id, &sb, &tb).await;
    assert!(loops_of(&image).is_empty());
    assert_eq!(mounts_at(&sm), 0);
    for v in [&m, &b] {
        c.delete_volume(DeleteVolumeRequest {
            volume_id: v.volume_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    }
}

async fn teardown(
    n: &mut NodeClient<tonic::transport::Channel>,
    id: &str,
    staging: &Path,
    target: &Path,
) {
    n.node_unpublish_volume(unpublish_req(id, target))
        .await
        .unwrap();
    n.node_unstage_volume(unstage_req(id, staging))
        .await
        .unwrap();
}

/// The real binary; SIGKILLed on drop if still running.
struct Proc(Child);

impl Proc {
    fn spawn(args: &[String]) -> Proc {
        Proc(
            Command::new(BIN)
                .args(args)
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .unwrap(),
        )
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.0.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig}");
    }

    async fn wait(&mut self) -> std::process::ExitStatus {
        test_support::eventually("the driver process exits", Duration::from_secs(30), || {
            let r = self.0.try_wait().unwrap();
            async move { r }
        })
        .await
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn connect(endpoint: &str) -> tonic::transport::Channel {
    let endpoint = endpoint.to_string();
    test_support::eventually("the driver serves", Duration::from_secs(30), || {
        let e = endpoint.clone();
        async move { csi_spec::connect_unix(&e).await.ok() }
    })
    .await
}

#[tokio::test]
async fn sigkill_of_the_binary_then_restart_adopts_the_loop_device() {
    if !root_parts_or_skip("the binary attaches loop devices") {
        return;
    }
    let s = Scratch::new();
    let socket = s.path("sock/csi.sock");
    let endpoint = format!("unix://{}", socket.display());
    let state = s.state_dir().display().to_string();
    // Go-style flags, single dash, as the upstream manifests pass them.
    let mut p = Proc::spawn(&[
        format!("-endpoint={endpoint}"),
        format!("-nodeid={NODE}"),
        format!("-statedir={state}"),
        "-capacity=1Gi".into(),
        "-v=5".into(),
    ]);
    let ch = connect(&endpoint).await;
    let (mut c, mut n) = (ControllerClient::new(ch.clone()), NodeClient::new(ch));
    let info = n
        .node_get_info(NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.node_id, NODE);
    let b = create(&mut c, "pvc-killed", 8 * MIB, block_cap()).await;
    let image = s
        .state_dir()
        .join("volumes")
        .join(format!("{}.img", b.volume_id));
    let staging = s.path("staging");
    n.node_stage_volume(stage_req(&b.volume_id, &staging, block_cap()))
        .await
        .unwrap();
    let loops = loops_of(&image);
    assert_eq!(loops.len(), 1);
    drop((c, n));

    p.signal("-KILL");
    p.wait().await;
    assert!(socket.exists(), "SIGKILL leaves the socket file behind");

    // Dashed spellings this time; the stale socket is replaced.
    let mut p = Proc::spawn(&[
        "--endpoint".into(),
        endpoint.clone(),
        "--node-id".into(),
        NODE.into(),
        "--state-dir".into(),
        state.clone(),
        "--capacity".into(),
        "1Gi".into(),
    ]);
    let ch = connect(&endpoint).await;
    let (mut c, mut n) = (ControllerClient::new(ch.clone()), NodeClient::new(ch));
    assert_eq!(list_all(&mut c, 0).await, vec![b.volume_id.clone()]);
    let available = c
        .get_capacity(GetCapacityRequest::default())
        .await
        .unwrap()
        .into_inner()
        .available_capacity;
    assert_eq!(
        available,
        (1 << 30) - 8 * MIB,
        "the volume's bytes stay taken"
    );
    n.node_stage_volume(stage_req(&b.volume_id, &staging, block_cap()))
        .await
        .unwrap();
    assert_eq!(loops_of(&image), loops, "adopted, not attached again");
    n.node_unstage_volume(unstage_req(&b.volume_id, &staging))
        .await
        .unwrap();
    assert!(
        loops_of(&image).is_empty(),
        "unstage after restart detaches"
    );
    c.delete_volume(DeleteVolumeRequest {
        volume_id: b.volume_id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    drop((c, n));

    p.signal("-TERM");
    let status = p.wait().await;
    assert!(status.success(), "SIGTERM is a clean exit: {status:?}");
    assert!(!socket.exists(), "a clean shutdown removes the socket");
}

#[test]
fn help_names_the_flags() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--endpoint",
        "--node-id",
        "--drivername",
        "--state-dir",
        "--max-volumes-per-node",
        "--capacity",
        "--stage-unstage",
        "--v",
    ] {
        assert!(text.contains(flag), "--help lacks {flag}:\n{text}");
    }
    // A bad quantity is refused before anything starts.
    let bad = Command::new(BIN)
        .args(["--node-id", "n", "--capacity", "lots"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("lots"),
        "{bad:?}"
    );
}
