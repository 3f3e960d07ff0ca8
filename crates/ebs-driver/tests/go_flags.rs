//! The real `ebs-csi-driver` binary started with the argument lists the upstream Go driver's
//! Helm chart renders for its controller Deployment and node DaemonSet: it must start, serve
//! Identity on the socket and act on the flags it maps; an unknown flag must still fail clearly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod ctl;

use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use test_support::net::free_port;

use csi_spec::v1::identity_client::IdentityClient;
use csi_spec::v1::node_client::NodeClient;
use csi_spec::v1::*;
use ctl::{Env, GIB, create, create_req, delete_req};
use ebs_cloud::Cloud;
use ec2_sim::{Backing, Timing};

/// The driver as a child process; killed on drop, also when the test fails.
struct Process {
    child: Child,
}

impl Process {
    fn spawn(args: &[String], envs: &[(&str, &str)]) -> Process {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ebs-csi-driver"));
        cmd.args(args)
            .env_remove("RUST_LOG")
            .env_remove("AWS_PROFILE")
            .env_remove("CSI_NODE_ID")
            .env_remove("CSI_ENDPOINT")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in envs {
            cmd.env(k, v);
        }
        Process {
            child: cmd.spawn().unwrap(),
        }
    }

    /// Waits until Identity answers on the socket (or the process exits, which fails).
    async fn identity(&mut self, socket: &str) -> IdentityClient<tonic::transport::Channel> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                let mut err = String::new();
                if let Some(mut e) = self.child.stderr.take() {
                    let _ = e.read_to_string(&mut err);
                }
                panic!("the driver exited with {status}: {err}");
            }
            if let Ok(ch) = csi_spec::connect_unix(socket).await {
                let mut id = IdentityClient::new(ch);
                if id.get_plugin_info(GetPluginInfoRequest {}).await.is_ok() {
                    return id;
                }
            }
            assert!(Instant::now() < deadline, "the driver did not start");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops the process and returns what it logged.
    fn stop(mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        err
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// NodeGetInfo from the driver on `socket`.
async fn node_info(socket: &str) -> NodeGetInfoResponse {
    let ch = csi_spec::connect_unix(socket).await.unwrap();
    NodeClient::new(ch)
        .node_get_info(NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner()
}

fn http_get(port: u16, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_controller_arguments_start_and_take_effect() {
    let env = Env::start(Timing::Fast, Backing::File, 26).await;
    // The chart's CSI_ENDPOINT is Go's `unix:/path` form.
    let socket = format!("unix:{}", env.path("controller.sock").display());
    let port = free_port();
    let mut args = strings(&[
        "controller",
        &format!("--endpoint={socket}"),
        "--k8s-tag-cluster-id=test-cluster",
        "--extra-tags=team=storage,env=ci",
        "--batching=true",
        &format!("--http-endpoint=:{port}"),
        "--user-agent-extra=helm",
        "--logging-format=text",
        "--modify-volume-request-handler-timeout=2s",
        "--warn-on-invalid-tag=false",
        "--extra-volume-tags=legacy=yes",
        "--aws-sdk-debug-log=false",
        "--deprecated-metrics",
        "--kubeconfig=",
        "-v=2",
    ]);
    // Where the chart's pod would find AWS, the test points at ec2-sim.
    args.push(format!("--ec2-endpoint={}", env.sim.endpoint()));
    let mut p = Process::spawn(
        &args,
        &[
            ("AWS_REGION", "us-east-1"),
            ("AWS_ACCESS_KEY_ID", "AKIDTEST"),
            ("AWS_SECRET_ACCESS_KEY", "secret"),
        ],
    );
    let mut id = p.identity(&socket).await;
    let caps = id
        .get_plugin_capabilities(GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(!caps.capabilities.is_empty());

    let ch = csi_spec::connect_unix(&socket).await.unwrap();
    let mut c = csi_spec::v1::controller_client::ControllerClient::new(ch);
    let v = create(&mut c, create_req("pvc-helm", GIB)).await;
    let tags = env.cloud.get_disk_by_id(&v.volume_id).await.unwrap().tags;
    for (k, want) in [
        ("kubernetes.io/cluster/test-cluster", "owned"),
        ("KubernetesCluster", "test-cluster"),
        ("Name", "test-cluster-dynamic-pvc-helm"),
        ("team", "storage"),
        ("env", "ci"),
        ("legacy", "yes"),
        ("CSIVolumeName", "pvc-helm"),
    ] {
        assert_eq!(
            tags.get(k).map(String::as_str),
            Some(want),
            "{k} in {tags:?}"
        );
    }
    let metrics = http_get(port, "/metrics");
    assert!(
        metrics.contains("ebs_csi_rpc_requests_total{method=\"CreateVolume\",code=\"OK\"} 1"),
        "{metrics}"
    );
    c.controller_modify_volume(ControllerModifyVolumeRequest {
        volume_id: v.volume_id.clone(),
        mutable_parameters: ctl::params(&[("tagSpecification_1", "tier=gold")]),
        ..Default::default()
    })
    .await
    .unwrap();
    c.delete_volume(delete_req(&v.volume_id)).await.unwrap();
    // A failed RPC is logged at WARN inside its span, with its status.
    c.controller_publish_volume(ctl::publish_req(
        "vol-0123456789abcdef0",
        "i-0123456789abcdef0",
    ))
    .await
    .unwrap_err();
    let log = p.stop();
    assert!(log.contains("starting"), "{log}");
    let failed = log
        .lines()
        .find(|l| l.contains("ControllerPublishVolume{volume_id=vol-0123456789abcdef0"))
        .unwrap_or_else(|| panic!("no ControllerPublishVolume span in\n{log}"));
    assert!(
        failed.contains("WARN") && failed.contains("does not exist"),
        "{failed}"
    );
    // Every controller RPC logs inside a span that names its volume.
    for needle in [
        "CreateVolume{name=pvc-helm}".to_string(),
        format!("ControllerModifyVolume{{volume_id={}}}", v.volume_id),
        format!("DeleteVolume{{volume_id={}}}", v.volume_id),
    ] {
        assert!(log.contains(&needle), "no span {needle} in\n{log}");
    }
    let deleted = log
        .lines()
        .find(|l| l.contains("volume deleted"))
        .unwrap_or_else(|| panic!("DeleteVolume logged nothing at INFO:\n{log}"));
    assert!(deleted.contains("INFO"), "{deleted}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_node_arguments_start_without_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let socket = format!("unix:{}", dir.path().join("node.sock").display());
    let args = strings(&[
        "node",
        &format!("--endpoint={socket}"),
        "--csi-mount-point-prefix=/var/lib/kubelet/plugins/kubernetes.io/csi/ebs.csi.aws.com/",
        "--reserved-volume-attachments=3",
        "--logtostderr",
        "--legacy-xfs=false",
        "--windows-host-process=false",
        "--metadata-sources=imds",
        "--logging-format=json",
        "-v",
        "2",
    ]);
    // No AWS credentials or region at all: node mode makes no EC2 call.
    let mut p = Process::spawn(
        &args,
        &[
            ("CSI_NODE_ID", "i-0123456789abcdef0"),
            ("AWS_AVAILABILITY_ZONE", "us-east-1a"),
        ],
    );
    let mut id = p.identity(&socket).await;
    let info = id
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "ebs.csi.aws.com");
    let node = node_info(&socket).await;
    assert_eq!(node.node_id, "i-0123456789abcdef0");
    // 28 Nitro slots - 2 network interfaces - 3 reserved.
    assert_eq!(node.max_volumes_per_node, 23);
    let log = p.stop();
    let first = log.lines().next().unwrap_or_default();
    assert!(
        first.starts_with('{') && first.contains("\"level\":\"INFO\""),
        "--logging-format=json: {log}"
    );
}

#[test]
fn unknown_and_conflicting_flags_fail_clearly() {
    for (args, needle) in [
        (vec!["controller", "--no-such-flag=1"], "--no-such-flag"),
        (vec!["node", "-no-such-flag"], "--no-such-flag"),
        (vec!["bogus-mode"], "bogus-mode"),
        (
            vec![
                "node",
                "--volume-attach-limit=10",
                "--reserved-volume-attachments=2",
            ],
            "only one of --volume-attach-limit and --reserved-volume-attachments",
        ),
        (
            vec![
                "controller",
                "--metrics-cert-file=/tls/crt",
                "--metrics-key-file=/tls/key",
            ],
            "HTTPS metrics are not supported",
        ),
        (vec!["controller", "--logging-format=xml"], "xml"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_ebs-csi-driver"))
            .args(&args)
            .env_remove("RUST_LOG")
            .env_remove("CSI_NODE_ID")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} started");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}

#[test]
fn pre_stop_hook_returns_at_once() {
    let out = Command::new(env!("CARGO_BIN_EXE_ebs-csi-driver"))
        .arg("pre-stop-hook")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}

/// `--embedded-ec2` is in every build's help; a build without the `embedded-ec2` feature (the
/// images') refuses it with a clear error before it creates anything, one with the feature
/// takes it (and here refuses it in node mode, also before creating anything).
#[test]
fn embedded_ec2_flag_is_documented_and_refused_without_the_feature() {
    let help = Command::new(env!("CARGO_BIN_EXE_ebs-csi-driver"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(help.status.success());
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.contains("--embedded-ec2 <DIR>") && help.contains("embedded-ec2` feature"),
        "{help}"
    );
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path().join("ec2");
    let endpoint = format!("unix://{}", scratch.path().join("csi.sock").display());
    let out = Command::new(env!("CARGO_BIN_EXE_ebs-csi-driver"))
        .args(["--mode", "node", "--node-id", "i-0123456789abcdef0"])
        .args(["--endpoint", &endpoint, "--embedded-ec2"])
        .arg(&dir)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let needle = if cfg!(feature = "embedded-ec2") {
        "needs --mode all or controller"
    } else {
        "--embedded-ec2: this build has no embedded EC2 (built without the embedded-ec2 feature)"
    };
    assert!(stderr.contains(needle), "{stderr}");
    assert!(!dir.exists());
    assert!(!scratch.path().join("csi.sock").exists());
}

/// A fake instance metadata service (IMDSv2: a token first, then the paths with it).
async fn fake_imds(instance_id: &'static str, zone: &'static str) -> std::net::SocketAddr {
    use axum::http::{HeaderMap, StatusCode};
    use axum::routing::{get, put};
    let authorized = |h: &HeaderMap| h.get("x-aws-ec2-metadata-token").is_some();
    let app = axum::Router::new()
        .route(
            "/latest/api/token",
            put(|| async { ([("x-aws-ec2-metadata-token-ttl-seconds", "21600")], "tok") }),
        )
        .route(
            "/latest/meta-data/instance-id",
            get(move |h: HeaderMap| async move {
                if authorized(&h) {
                    (StatusCode::OK, instance_id)
                } else {
                    (StatusCode::UNAUTHORIZED, "")
                }
            }),
        )
        .route(
            "/latest/meta-data/placement/availability-zone",
            get(move |h: HeaderMap| async move {
                if authorized(&h) {
                    (StatusCode::OK, zone)
                } else {
                    (StatusCode::UNAUTHORIZED, "")
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_without_node_id_asks_instance_metadata_as_the_go_daemonset_does() {
    let imds = fake_imds("i-0fedcba9876543210", "us-east-1c").await;
    let dir = tempfile::tempdir().unwrap();
    let socket = format!("unix:{}", dir.path().join("node.sock").display());
    let args = strings(&[
        "node",
        &format!("--endpoint={socket}"),
        "--logging-format=text",
        "--v=2",
    ]);
    let url = format!("http://{imds}");
    let mut p = Process::spawn(&args, &[("AWS_EC2_METADATA_SERVICE_ENDPOINT", &url)]);
    p.identity(&socket).await;
    let node = node_info(&socket).await;
    assert_eq!(node.node_id, "i-0fedcba9876543210");
    let zones: Vec<&String> = node
        .accessible_topology
        .iter()
        .flat_map(|t| t.segments.values())
        .collect();
    assert!(
        zones.iter().all(|z| *z == "us-east-1c") && !zones.is_empty(),
        "{zones:?}"
    );
    p.stop();

    // No node ID and no instance metadata: a clear error, not a half-started driver.
    let closed = format!("http://127.0.0.1:{}", free_port());
    let out = Command::new(env!("CARGO_BIN_EXE_ebs-csi-driver"))
        .args([
            "node",
            &format!("--endpoint=unix:{}", dir.path().join("n2.sock").display()),
        ])
        .env_remove("CSI_NODE_ID")
        .env("AWS_EC2_METADATA_SERVICE_ENDPOINT", &closed)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("--node-id") && stderr.contains("instance metadata"),
        "{stderr}"
    );
}
