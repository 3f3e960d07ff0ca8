//! The `csi-mock-driver` process: flags, serving, clean exit on SIGTERM.
// Test code (helpers included): a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use csi_spec::v1::controller_client::ControllerClient;
use csi_spec::v1::identity_client::IdentityClient;
use csi_spec::v1::{ControllerGetCapabilitiesRequest, GetPluginInfoRequest};

/// Kills the process if the test fails before it exits.
struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn signal(child: &Child, sig: &str) {
    let status = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

async fn wait_for_exit(child: &mut Child) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "csi-mock-driver did not exit");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn run_and_stop(sig: &str) {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("plugin/csi.sock");
    let endpoint = format!("unix://{}", sock.display());
    let mut child = Kill(
        Command::new(env!("CARGO_BIN_EXE_csi-mock-driver"))
            .args([
                "--endpoint",
                &endpoint,
                "--name=bin.mock.csi",
                "--no-publish-readonly",
                "--no-list-published-nodes",
                "--delay",
                "1ms",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );

    let deadline = Instant::now() + Duration::from_secs(30);
    let channel = loop {
        if let Ok(c) = csi_spec::connect_unix(&endpoint).await {
            break c;
        }
        assert!(
            child.0.try_wait().unwrap().is_none(),
            "csi-mock-driver exited early"
        );
        assert!(Instant::now() < deadline, "socket never came up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let info = IdentityClient::new(channel.clone())
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "bin.mock.csi");
    let caps = ControllerClient::new(channel.clone())
        .controller_get_capabilities(ControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities;
    assert_eq!(caps.len(), 1, "only PUBLISH_UNPUBLISH_VOLUME: {caps:?}");
    drop(channel);

    signal(&child.0, sig);
    let status = wait_for_exit(&mut child.0).await;
    assert!(status.success(), "{status:?}");
    assert!(!sock.exists(), "the socket is removed on {sig}");
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.0.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(stderr.contains("listening"), "{stderr}");
    assert!(stderr.contains("shutting down"), "{stderr}");
}

#[tokio::test]
async fn serves_and_exits_cleanly_on_sigterm() {
    run_and_stop("-TERM").await;
}

#[tokio::test]
async fn serves_and_exits_cleanly_on_sigint() {
    run_and_stop("-INT").await;
}

#[test]
fn bad_delay_is_refused_with_the_flag_name() {
    let out = Command::new(env!("CARGO_BIN_EXE_csi-mock-driver"))
        .args(["--endpoint", "/nonexistent/x.sock", "--delay", "10"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--delay"), "{stderr}");
}
