//! Non-Rust gRPC clients on our unix sockets. Python's grpcio (grpc-core, PyPI) stands in for
//! every client that does not send `localhost` as `:authority`: by default it sends the
//! percent-encoded socket path, and with `grpc.default_authority` it sends the raw path, byte for
//! byte what the kubelet v1.26's grpc-go plugin-registration client sends. tonic alone refuses
//! both with RST_STREAM(PROTOCOL_ERROR); `csi_spec::UnixSocket::serve` must answer them.
// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use csi_spec::UnixSocket;
use csi_spec::v1::identity_server::{Identity, IdentityServer};
use csi_spec::v1::{GetPluginInfoRequest, GetPluginInfoResponse};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Server;
use tonic::{Request, Response, Status};

struct Plugin;

#[tonic::async_trait]
impl Identity for Plugin {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: "authority.test.csi.example.com".into(),
            vendor_version: "1.2.3".into(),
            manifest: Default::default(),
        }))
    }
}

/// The venv's python when it has grpcio (scripts/setup installs it).
fn grpc_python() -> Option<PathBuf> {
    let venv = std::env::var_os("CSI_RS_VENV")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/csi-rs-venv"))
        })?;
    let py = venv.join("bin/python");
    Command::new(&py)
        .args(["-c", "import grpc"])
        .output()
        .is_ok_and(|o| o.status.success())
        .then_some(py)
}

/// Calls GetPluginInfo twice on one channel (the second request reuses the client's HPACK
/// table) and prints the plugin name of each answer, or `ERROR <code> <details>`.
const CLIENT: &str = r#"
import sys, grpc
sock, authority = sys.argv[1], sys.argv[2]
options = [] if authority == "-" else [("grpc.default_authority", authority)]
with grpc.insecure_channel("unix:" + sock, options=options) as ch:
    call = ch.unary_unary("/csi.v1.Identity/GetPluginInfo",
                          request_serializer=lambda b: b, response_deserializer=lambda b: b)
    for _ in range(2):
        try:
            resp = call(b"", timeout=10)
        except grpc.RpcError as e:
            print("ERROR", e.code().name, e.details())
            continue
        # GetPluginInfoResponse.name is field 1 (tag 0x0a), a short string.
        assert resp[0] == 0x0A, resp
        print(resp[2:2 + resp[1]].decode())
"#;

fn call(python: &Path, sock: &Path, authority: &str) -> Vec<String> {
    let out = Command::new(python)
        .args(["-c", CLIENT, sock.to_str().unwrap(), authority])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "python client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcio_clients_sending_a_socket_path_as_authority_are_served() {
    let Some(python) = grpc_python() else {
        test_support::skip_or_fail(
            "no Python venv with grpcio (run scripts/setup, or set CSI_RS_VENV)",
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("plugins_registry/authority.test-reg.sock");
    let socket = UnixSocket::bind(&format!("unix://{}", sock.display())).unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(socket.serve(
        Server::builder().add_service(IdentityServer::new(Plugin)),
        async {
            let _ = stopped.await;
        },
    ));

    let want = vec!["authority.test.csi.example.com".to_owned(); 2];
    for authority in [
        // What the kubelet v1.26 sends: the raw path.
        sock.to_str().unwrap(),
        // grpc-core's default for a unix target: the percent-encoded path.
        "-",
        // What grpc-go sends for unix:// targets and Kubernetes >= 1.27 sends.
        "localhost",
    ] {
        let py = python.clone();
        let s = sock.clone();
        let a = authority.to_owned();
        let got = tokio::task::spawn_blocking(move || call(&py, &s, &a))
            .await
            .unwrap();
        assert_eq!(got, want, "authority {authority:?}");
    }

    let _ = stop.send(());
    server.await.unwrap().unwrap();
    assert!(!sock.exists(), "socket file removed on shutdown");
}

/// The reason for `AuthorityFix`: the same router served by tonic on a bare unix listener
/// refuses the kubelet's request. If this ever passes, h2 learned to accept such authorities.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bare_tonic_refuses_a_socket_path_authority() {
    let Some(python) = grpc_python() else {
        test_support::skip_or_fail(
            "no Python venv with grpcio (run scripts/setup, or set CSI_RS_VENV)",
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("bare.sock");
    let listener = tokio::net::UnixListener::bind(&sock).unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        Server::builder()
            .add_service(IdentityServer::new(Plugin))
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                let _ = stopped.await;
            }),
    );
    // The raw path (the kubelet's) and grpc-core's percent-encoded path.
    for authority in [sock.to_str().unwrap(), "-"] {
        let (py, s, a) = (python.clone(), sock.clone(), authority.to_owned());
        let got = tokio::task::spawn_blocking(move || call(&py, &s, &a))
            .await
            .unwrap();
        assert_eq!(got.len(), 2);
        for line in &got {
            // grpc-core words PROTOCOL_ERROR as "RST_STREAM with error code 1".
            assert!(
                line.starts_with("ERROR INTERNAL") && line.contains("error code 1"),
                "bare tonic answered {line:?} for authority {authority:?}"
            );
        }
    }
    // And with `localhost` the bare server answers: the authority is the only difference.
    let (py, s) = (python, sock.clone());
    let got = tokio::task::spawn_blocking(move || call(&py, &s, "localhost"))
        .await
        .unwrap();
    assert_eq!(got, vec!["authority.test.csi.example.com".to_owned(); 2]);
    let _ = stop.send(());
    server.await.unwrap().unwrap();
}
