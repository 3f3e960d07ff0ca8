//! The `apiserver-lite` binary: flags, kubeconfig output, serving, persistence across restarts.
// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use serde_json::json;

/// Kills the server process when the test ends, also on failure.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(kubeconfig: &Path, data: &Path) -> Guard {
    let _ = std::fs::remove_file(kubeconfig);
    let child = Command::new(env!("CARGO_BIN_EXE_apiserver-lite"))
        .args(["--listen", "127.0.0.1:0", "--kubeconfig-out"])
        .arg(kubeconfig)
        .arg("--data-dir")
        .arg(data)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let guard = Guard(child);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !kubeconfig.exists() {
        assert!(
            Instant::now() < deadline,
            "no kubeconfig written within 20s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    guard
}

async fn client(kubeconfig: &Path) -> kube::Client {
    let text = std::fs::read_to_string(kubeconfig).unwrap();
    let kc = kube::config::Kubeconfig::from_yaml(&text).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    apiserver::install_crypto_provider();
    kube::Client::try_from(cfg).unwrap()
}

#[test]
fn help_describes_the_flags() {
    let out = Command::new(env!("CARGO_BIN_EXE_apiserver-lite"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--listen",
        "--kubeconfig-out",
        "--data-dir",
        "--event-window",
        "--watcher-buffer",
    ] {
        assert!(text.contains(flag), "--help lacks {flag}:\n{text}");
    }
    let bad = Command::new(env!("CARGO_BIN_EXE_apiserver-lite"))
        .args(["--listen", "not-an-address"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--listen"));
}

#[tokio::test]
async fn binary_serves_and_keeps_data_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let data = dir.path().join("data");
    {
        let _server = spawn(&kubeconfig, &data);
        let nodes: Api<Node> = Api::all(client(&kubeconfig).await);
        let node: Node = serde_json::from_value(
            json!({"metadata": {"name": "node-1", "labels": {"zone": "a"}}}),
        )
        .unwrap();
        nodes.create(&PostParams::default(), &node).await.unwrap();
        // The log is written by a background thread: wait until the write reached the file.
        let log = data.join("log.jsonl");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("node-1")
        {
            assert!(Instant::now() < deadline, "write not persisted within 10s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let _server = spawn(&kubeconfig, &data);
    let nodes: Api<Node> = Api::all(client(&kubeconfig).await);
    let node = nodes.get("node-1").await.unwrap();
    assert_eq!(node.metadata.labels.unwrap()["zone"], "a");
}

#[tokio::test]
async fn metrics_count_requests() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let _server = spawn(&kubeconfig, &dir.path().join("data"));
    let client = client(&kubeconfig).await;
    let nodes: Api<Node> = Api::all(client.clone());
    nodes.list(&Default::default()).await.unwrap();
    let _ = nodes.get("missing").await;
    let req = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = client.request_text(req).await.unwrap();
    assert!(
        text.contains(r#"apiserver_request_total{verb="GET",resource="nodes",code="200"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"apiserver_request_total{verb="GET",resource="nodes",code="404"} 1"#),
        "{text}"
    );
    assert!(text.contains("apiserver_resource_version"), "{text}");
}
