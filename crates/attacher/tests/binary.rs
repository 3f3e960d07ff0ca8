//! The real `csi-attacher` binary: Go-style flags, a driver that starts later, attach/detach,
//! metrics, dummy mode, leader failover on SIGTERM.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};
use test_support::net::free_port;

use common::*;
use csi_mock::{Method, MockConfig};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// GET over plain HTTP/1.0; returns (status line, body).
async fn http_get(port: u16, path: &str) -> (String, String) {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    (
        head.lines().next().unwrap_or_default().to_string(),
        body.to_string(),
    )
}

async fn wait_metrics(port: u16, needle: &str) -> String {
    eventually(&format!("metrics containing {needle}"), || async {
        let conn = tokio::net::TcpStream::connect(("127.0.0.1", port)).await;
        conn.ok()?;
        let (_, body) = http_get(port, "/metrics").await;
        body.contains(needle).then_some(body)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_attaches_and_detaches_with_go_style_flags_and_serves_metrics() {
    let env = Env::new(MockConfig::default()).await;
    let kubeconfig = env.kubeconfig_file();
    let port = free_port();
    let endpoint = env.mock().endpoint();
    let mut attacher = spawn_attacher(
        env.dir.path(),
        "main",
        &[
            format!("-kubeconfig={}", kubeconfig.display()),
            "-csi-address".into(),
            endpoint,
            "--timeout=5s".into(),
            "-retry-interval-start=50ms".into(),
            "--retry-interval-max".into(),
            "1s".into(),
            format!("--http-endpoint=127.0.0.1:{port}"),
            "-v=5".into(),
        ],
    );
    env.create_pair("bin").await;
    let va = env.wait_attached("va-bin").await;
    assert_eq!(finalizers_of(&va), [FINALIZER]);

    let body = wait_metrics(port, "csi_sidecar_operations_seconds").await;
    assert!(
        body.contains("method_name=\"/csi.v1.Controller/ControllerPublishVolume\""),
        "{body}"
    );
    assert!(body.contains("grpc_status_code=\"OK\""), "{body}");
    assert!(body.contains("driver_name=\"mock.csi.rs\""), "{body}");
    assert!(
        body.contains("workqueue_depth{name=\"csi-attacher-va-attach\"}"),
        "{body}"
    );
    assert!(body.contains("workqueue_oldest_item_age_seconds"), "{body}");
    let (status, _) = http_get(port, "/healthz").await;
    assert!(status.contains("200"), "{status}");

    env.delete_va("va-bin").await;
    env.wait_va_gone("va-bin").await;
    assert_eq!(
        env.mock().calls_of(Method::ControllerUnpublishVolume).len(),
        1
    );

    let exit = terminate(&mut attacher).await;
    assert!(
        exit.success(),
        "clean exit on SIGTERM: {exit:?}\n{}",
        attacher_log(env.dir.path(), "main")
    );
    // The controller's requests carry the binary's User-Agent, and are only the calls
    // docs/attacher.md lists (and deploy/kubernetes/rbac/attacher/rbac-attacher.yaml grants).
    let calls: std::collections::BTreeSet<String> = env
        .server
        .audit()
        .iter()
        .filter(|r| r.user_agent.starts_with("csi-attacher/"))
        .map(|r| {
            let sub = r
                .subresource
                .as_deref()
                .map(|s| format!("/{s}"))
                .unwrap_or_default();
            format!("{} {}{sub}", r.verb, r.resource)
        })
        .collect();
    assert!(!calls.is_empty());
    let allowed = [
        "list volumeattachments",
        "watch volumeattachments",
        "patch volumeattachments",
        "patch volumeattachments/status",
        "list persistentvolumes",
        "watch persistentvolumes",
        "get persistentvolumes",
        "patch persistentvolumes",
        "list csinodes",
        "watch csinodes",
        "get secrets",
        "create events",
        "patch events",
    ];
    let unexpected: Vec<&String> = calls
        .iter()
        .filter(|c| !allowed.contains(&c.as_str()))
        .collect();
    assert!(unexpected.is_empty(), "{unexpected:?} (all: {calls:?})");
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_waits_for_a_driver_that_starts_later() {
    let mut env = Env::without_driver().await;
    let kubeconfig = env.kubeconfig_file();
    let sock_dir = tempfile::tempdir().unwrap();
    let endpoint = format!("unix://{}/csi.sock", sock_dir.path().display());
    let mut attacher = spawn_attacher(
        env.dir.path(),
        "late",
        &[
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--csi-address={endpoint}"),
            "--connection-timeout=60s".into(),
            "--retry-interval-start=50ms".into(),
        ],
    );
    // The attacher is already dialling; the driver comes up a little later.
    let log_dir = env.dir.path().to_path_buf();
    eventually("the attacher is running", || async {
        (!attacher_log(&log_dir, "late").is_empty()).then_some(())
    })
    .await;
    env.mock = Some(
        csi_mock::start(sock_dir.path(), MockConfig::default())
            .await
            .unwrap(),
    );
    env.create_csinode(NODE, &[(DRIVER, NODE_ID)]).await;
    env.create_pair("late").await;
    env.wait_attached("va-late").await;
    assert!(terminate(&mut attacher).await.success());
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_in_dummy_mode_needs_no_driver() {
    let env = Env::without_driver().await;
    let kubeconfig = env.kubeconfig_file();
    let mut attacher = spawn_attacher(
        env.dir.path(),
        "dummy",
        &[
            "-dummy".into(),
            format!("-kubeconfig={}", kubeconfig.display()),
            "-csi-address=/nonexistent/csi.sock".into(),
        ],
    );
    env.create_pv(&csi_pv("pv-dummy", "vol-dummy")).await;
    // `csi/dummy` itself is refused by today's API servers (spec.attacher must be a DNS
    // subdomain); dummy mode also answers to `csi-dummy`.
    env.create_va(&va_of("va-dummy", "csi-dummy", "pv-dummy", NODE))
        .await;
    let va = env.wait_attached("va-dummy").await;
    assert!(finalizers_of(&va).is_empty());
    assert!(terminate(&mut attacher).await.success());
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_flags_are_refused_with_the_flag_named() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_csi-attacher"))
        .args(["--worker-threads=0", "--dummy", "--kubeconfig=/nonexistent"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--worker-threads"), "{stderr}");

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_csi-attacher"))
        .args(["--timeout=fast"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--timeout"));

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_csi-attacher"))
        .arg("--version")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("csi-attacher"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_takes_over_in_under_two_seconds_when_the_leader_gets_sigterm() {
    let env = Env::new(MockConfig::default()).await;
    let kubeconfig = env.kubeconfig_file();
    let args = || -> Vec<String> {
        vec![
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--csi-address={}", env.mock().endpoint()),
            "--leader-election".into(),
            "--leader-election-namespace=default".into(),
            "--retry-interval-start=50ms".into(),
            format!("--http-endpoint=127.0.0.1:{}", free_port()),
            "-v=4".into(),
        ]
    };
    let leases: Api<Lease> = Api::namespaced(env.kube.clone(), "default");
    let lease_name = "external-attacher-leader-mock-csi-rs";
    let holder = || async {
        leases
            .get_opt(lease_name)
            .await
            .ok()
            .flatten()
            .and_then(|l| l.spec?.holder_identity)
            .filter(|h| !h.is_empty())
    };

    let mut a = spawn_attacher(env.dir.path(), "a", &args());
    let first = eventually("the first attacher leads", &holder).await;
    env.create_pair("before").await;
    env.wait_attached("va-before").await;

    // The standby is known to wait once its watch on the held Lease is in the audit trail (the
    // leader never watches it); the log line alone comes before its first look at the Lease.
    let lease_watches = || {
        env.server
            .audit()
            .iter()
            .filter(|r| {
                r.user_agent.starts_with("csi-attacher/")
                    && r.resource == "leases"
                    && r.verb == "watch"
            })
            .count()
    };
    let watches_before = lease_watches();
    let mut b = spawn_attacher(env.dir.path(), "b", &args());
    let dir = env.dir.path().to_path_buf();
    eventually("the second attacher waits for the lease", || async {
        attacher_log(&dir, "b")
            .contains("waiting to acquire the leader lease")
            .then_some(())
    })
    .await;
    eventually("the second attacher watches the held lease", || async {
        (lease_watches() > watches_before).then_some(())
    })
    .await;
    assert_eq!(
        holder().await,
        Some(first.clone()),
        "the leader keeps the lease"
    );

    let sent = Instant::now();
    let exit = terminate(&mut a).await;
    assert!(exit.success(), "{exit:?}");
    let second = eventually("the standby takes over", || async {
        holder().await.filter(|h| *h != first)
    })
    .await;
    let took = sent.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "failover took {took:?} (leader {first} -> {second})"
    );

    env.create_pair("after").await;
    env.wait_attached("va-after").await;
    assert!(terminate(&mut b).await.success());
    env.shutdown().await;
}
