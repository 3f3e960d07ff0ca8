//! The registrar against a real CSI driver (csi-mock on a unix socket), with the test acting
//! as the kubelet: a gRPC client on `<dir>/<driver>-reg.sock` and HTTP GETs on `/healthz`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;
use std::time::Duration;
use test_support::net::http_get;

use clap::Parser;
use csi_mock::{MockConfig, MockDriver};
use registrar::pluginregistration::registration_client::RegistrationClient;
use registrar::pluginregistration::{InfoRequest, RegistrationStatus};
use registrar::{Config, Error};
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

const KUBELET_PATH: &str = "/var/lib/kubelet/plugins/mock.csi.rs/csi.sock";
const BIN: &str = env!("CARGO_BIN_EXE_csi-node-driver-registrar");

fn config(driver: &MockDriver, reg_dir: &Path, extra: &[&str]) -> Config {
    let mut args = vec![
        "csi-node-driver-registrar".to_owned(),
        format!("-csi-address={}", driver.endpoint()),
        format!("-kubelet-registration-path={KUBELET_PATH}"),
        format!("-plugin-registration-path={}", reg_dir.display()),
    ];
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    Config::parse_from(telemetry::normalize_go_args(
        args.into_iter().map(Into::into),
    ))
}

async fn kubelet(socket: &Path) -> RegistrationClient<Channel> {
    RegistrationClient::new(
        csi_spec::connect_unix(&socket.display().to_string())
            .await
            .unwrap(),
    )
}

async fn notify(socket: &Path, registered: bool, error: &str) {
    kubelet(socket)
        .await
        .notify_registration_status(RegistrationStatus {
            plugin_registered: registered,
            error: error.to_owned(),
        })
        .await
        .unwrap();
}

async fn mock(dir: &Path) -> MockDriver {
    csi_mock::start(dir, MockConfig::default()).await.unwrap()
}

#[tokio::test]
async fn registers_with_the_kubelet_and_removes_the_socket_on_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let driver = mock(dir.path()).await;
    assert_eq!(driver.config().name, "mock.csi.rs");
    let reg_dir = dir.path().join("plugins_registry");
    let config = config(&driver, &reg_dir, &["--http-endpoint=127.0.0.1:0"]);
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(registrar::run(config.clone(), shutdown.clone()));

    // run() dials the driver itself; the kubelet only sees the socket once it exists, so
    // wait for it as the kubelet's plugin watcher does (bounded, then fail).
    let socket = reg_dir.join("mock.csi.rs-reg.sock");
    tokio::time::timeout(Duration::from_secs(30), async {
        while !socket.exists() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the registration socket appears");

    let info = kubelet(&socket)
        .await
        .get_info(InfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.r#type, "CSIPlugin");
    assert_eq!(info.name, "mock.csi.rs");
    assert_eq!(info.endpoint, KUBELET_PATH);
    assert_eq!(info.supported_versions, vec!["1.0.0".to_owned()]);

    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(!socket.exists(), "shutdown removes the registration socket");
    driver.shutdown().await;
}

#[tokio::test]
async fn healthz_follows_the_kubelets_status_and_a_stale_socket_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let driver = mock(dir.path()).await;
    let reg_dir = dir.path().join("registry");
    std::fs::create_dir_all(&reg_dir).unwrap();
    let socket = registrar::registration_socket_path(&reg_dir, "mock.csi.rs");
    // A socket left by a crashed registrar: bound, then nobody listens.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    assert!(socket.exists());

    let config = config(&driver, &reg_dir, &["--http-endpoint=127.0.0.1:0"]);
    let name = registrar::driver_name(&driver.endpoint(), Duration::from_secs(30), config.timeout)
        .await
        .unwrap();
    assert_eq!(name, "mock.csi.rs");
    let running = registrar::start(&config, name).await.unwrap();
    assert_eq!(running.socket_path(), socket.as_path());
    let addr = running.http_addr().unwrap();
    assert_ne!(addr.port(), 0);

    // The old socket is gone and the new one answers.
    let info = kubelet(&socket)
        .await
        .get_info(InfoRequest {})
        .await
        .unwrap();
    assert_eq!(info.into_inner().name, "mock.csi.rs");

    let (status, body) = http_get(addr, "/healthz").await;
    assert_eq!(status, 500, "not registered yet: {body}");
    notify(&socket, true, "").await;
    let (status, body) = http_get(addr, "/healthz").await;
    assert_eq!((status, body.as_str()), (200, "ok\n"));

    // Someone removes the socket: unhealthy, so the kubelet restarts the container.
    std::fs::remove_file(&socket).unwrap();
    let (status, body) = http_get(addr, "/healthz").await;
    assert_eq!(status, 500);
    assert!(body.contains("does not exist"), "{body}");

    let shutdown = CancellationToken::new();
    shutdown.cancel();
    running.wait(shutdown).await.unwrap();
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "health server stopped"
    );
    driver.shutdown().await;
}

#[tokio::test]
async fn a_failed_registration_ends_the_registrar_with_the_kubelets_error() {
    let dir = tempfile::tempdir().unwrap();
    let driver = mock(dir.path()).await;
    let reg_dir = dir.path().join("registry");
    let config = config(&driver, &reg_dir, &[]);
    let running = registrar::start(&config, "mock.csi.rs".to_owned())
        .await
        .unwrap();
    let socket = running.socket_path().to_path_buf();
    notify(&socket, false, "boom").await;

    // Nobody cancels this token: the failure alone must end wait().
    let err = tokio::time::timeout(
        Duration::from_secs(30),
        running.wait(CancellationToken::new()),
    )
    .await
    .expect("a failed registration stops the registrar")
    .unwrap_err();
    assert!(matches!(err, Error::RegistrationFailed { .. }), "{err:?}");
    assert!(err.to_string().contains("boom"), "{err}");
    assert!(!socket.exists(), "the socket is removed on the way out");
    driver.shutdown().await;
}

#[tokio::test]
async fn an_empty_kubelet_registration_path_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let driver = mock(dir.path()).await;
    let mut config = config(&driver, &dir.path().join("registry"), &[]);
    config.kubelet_registration_path.clear();
    let err = registrar::start(&config, "mock.csi.rs".to_owned())
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("--kubelet-registration-path"),
        "{err}"
    );
    driver.shutdown().await;
}

#[test]
fn help_names_the_flags() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let help = String::from_utf8(out.stdout).unwrap();
    for flag in [
        "--csi-address",
        "--kubelet-registration-path",
        "--plugin-registration-path",
        "--timeout",
        "--http-endpoint",
        "--mode",
        "kubelet-registration-probe",
    ] {
        assert!(help.contains(flag), "{flag} missing from:\n{help}");
    }
    let out = Command::new(BIN).output().unwrap();
    assert!(
        !out.status.success(),
        "--kubelet-registration-path is required"
    );
}

#[tokio::test]
async fn the_probe_mode_exits_by_whether_the_socket_exists() {
    let dir = tempfile::tempdir().unwrap();
    let driver = mock(dir.path()).await;
    let reg_dir = dir.path().join("registry");
    let probe = || {
        let mut cmd = tokio::process::Command::new(BIN);
        cmd.args([
            format!("-csi-address={}", driver.endpoint()),
            format!("-kubelet-registration-path={KUBELET_PATH}"),
            format!("-plugin-registration-path={}", reg_dir.display()),
            "--timeout=10s".to_owned(),
            "--mode=kubelet-registration-probe".to_owned(),
        ]);
        cmd.output()
    };

    let out = probe().await.unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("mock.csi.rs-reg.sock"), "{stderr}");

    let config = config(&driver, &reg_dir, &[]);
    let running = registrar::start(&config, "mock.csi.rs".to_owned())
        .await
        .unwrap();
    let out = probe().await.unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");

    let shutdown = CancellationToken::new();
    shutdown.cancel();
    running.wait(shutdown).await.unwrap();
    let out = probe().await.unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    driver.shutdown().await;
}
