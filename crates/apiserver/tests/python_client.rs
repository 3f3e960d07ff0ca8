//! The Python `kubernetes` client (PyPI) lists and watches VolumeAttachments.
// Test code (helpers included): a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

fn venv_python() -> Option<PathBuf> {
    let venv = std::env::var_os("CSI_RS_VENV")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/csi-rs-venv"))
        })?;
    let py = venv.join("bin/python");
    let ok = std::process::Command::new(&py)
        .args(["-c", "import kubernetes"])
        .output()
        .is_ok_and(|o| o.status.success());
    ok.then_some(py)
}

fn va(name: &str) -> VolumeAttachment {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"attacher": "ebs.csi.aws.com", "nodeName": "node-1", "source": {"persistentVolumeName": format!("pv-{name}")}}
    }))
    .unwrap()
}

async fn next(lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>) -> Value {
    let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .expect("python answers within 60s")
        .unwrap()
        .expect("a line from python");
    serde_json::from_str(&line).unwrap()
}

#[tokio::test]
async fn python_client_lists_and_watches_volume_attachments() {
    let Some(python) = venv_python() else {
        test_support::skip_or_fail(
            "no Python venv with `kubernetes` (run scripts/setup, or set CSI_RS_VENV)",
        );
        return;
    };
    let server = common::start().await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = server.write_kubeconfig(dir.path()).unwrap();
    let vas: Api<VolumeAttachment> = Api::all(server.client());
    vas.create(&PostParams::default(), &va("va-a"))
        .await
        .unwrap();
    vas.create(&PostParams::default(), &va("va-b"))
        .await
        .unwrap();

    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/list_watch_va.py");
    let mut child = tokio::process::Command::new(python)
        .arg(script)
        .arg(&kubeconfig)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let listed = next(&mut lines).await;
    assert_eq!(listed["list"], json!(["va-a", "va-b"]));
    assert_eq!(listed["attachers"], json!(["ebs.csi.aws.com"]));

    // The watch starts from the list's version: these two changes are what it must see.
    vas.create(&PostParams::default(), &va("va-c"))
        .await
        .unwrap();
    vas.patch_status(
        "va-c",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"attached": true}})),
    )
    .await
    .unwrap();
    let watched = next(&mut lines).await;
    assert_eq!(
        watched["events"],
        json!([["ADDED", "va-c", false], ["MODIFIED", "va-c", true]])
    );
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success());
}
