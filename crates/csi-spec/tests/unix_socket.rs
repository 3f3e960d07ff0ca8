//! A real tonic Identity server on a real unix socket, dialed the way kubelet and the sidecars
//! dial a driver (`unix:///path`), with the HTTP/2 request paths recorded by a tower layer.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use csi_spec::v1::identity_client::IdentityClient;
use csi_spec::v1::identity_server::{self, Identity, IdentityServer};
use csi_spec::v1::node_client::NodeClient;
use csi_spec::v1::node_server::{Node, NodeServer};
use csi_spec::v1::{
    GetPluginInfoRequest, GetPluginInfoResponse, NodeGetInfoRequest, NodeGetInfoResponse,
    ProbeRequest, Topology,
};
use csi_spec::{UnixSocket, connect_unix, connect_unix_lazy, serve_unix};
use tonic::codegen::http;
use tonic::transport::Server;
use tonic::{Code, Request, Response, Status};
use tower::util::MapRequestLayer;

struct TestIdentity;

#[tonic::async_trait]
impl Identity for TestIdentity {
    async fn get_plugin_info(
        &self,
        _request: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: "test.csi.example.com".into(),
            vendor_version: "0.1.0".into(),
            manifest: Default::default(),
        }))
    }
    // GetPluginCapabilities and Probe are left to the generated default stubs.
}

struct TestNode;

#[tonic::async_trait]
impl Node for TestNode {
    async fn node_get_info(
        &self,
        _request: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        Ok(Response::new(NodeGetInfoResponse {
            node_id: "i-0123".into(),
            max_volumes_per_node: 25,
            accessible_topology: Some(Topology::from_segments([("zone", "az-a")])),
        }))
    }
}

#[tokio::test]
async fn get_plugin_info_over_a_unix_socket() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("plugin/csi.sock");
    let endpoint = format!("unix://{}", sock.display());

    let paths = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = Arc::clone(&paths);
    let router = Server::builder()
        .layer(MapRequestLayer::new(move |req: http::Request<_>| {
            seen.lock().unwrap().push(req.uri().path().to_owned());
            req
        }))
        .add_service(IdentityServer::new(TestIdentity))
        .add_service(NodeServer::new(TestNode));

    let socket = UnixSocket::bind(&endpoint).unwrap();
    assert_eq!(socket.path(), sock.as_path());
    assert!(
        sock.exists(),
        "bind creates the socket file (and its directory)"
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(socket.serve(router, async {
        let _ = stopped.await;
    }));

    let channel = connect_unix(&endpoint).await.unwrap();
    let mut identity = IdentityClient::new(channel.clone());
    let info = identity
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "test.csi.example.com");
    assert_eq!(info.vendor_version, "0.1.0");

    // An RPC the server does not implement answers UNIMPLEMENTED, as the spec asks.
    let err = identity.probe(ProbeRequest {}).await.unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented);

    // A plain path dials the same socket.
    let mut node = NodeClient::new(connect_unix(sock.to_str().unwrap()).await.unwrap());
    let node_info = node
        .node_get_info(NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(node_info.node_id, "i-0123");
    assert_eq!(
        node_info
            .accessible_topology
            .unwrap()
            .segments
            .get("zone")
            .map(String::as_str),
        Some("az-a")
    );

    assert_eq!(
        *paths.lock().unwrap(),
        vec![
            "/csi.v1.Identity/GetPluginInfo".to_owned(),
            "/csi.v1.Identity/Probe".to_owned(),
            "/csi.v1.Node/NodeGetInfo".to_owned(),
        ]
    );
    assert_eq!(
        format!("/{}/GetPluginInfo", identity_server::SERVICE_NAME),
        "/csi.v1.Identity/GetPluginInfo"
    );

    drop(identity);
    drop(node);
    drop(channel);
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("server stops after the shutdown signal")
        .unwrap()
        .unwrap();
    assert!(!sock.exists(), "the socket file is removed on shutdown");
}

/// A sidecar may start before the driver: a lazy channel made first connects once the driver
/// serves. `serve_unix` is the one-call form.
#[tokio::test]
async fn lazy_client_reaches_a_server_started_later() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("csi.sock");
    let endpoint = format!("unix://{}", sock.display());

    let channel = connect_unix_lazy(&endpoint).unwrap();

    let router = Server::builder().add_service(IdentityServer::new(TestIdentity));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serve_endpoint = endpoint.clone();
    let server = tokio::spawn(async move {
        serve_unix(router, &serve_endpoint, async {
            let _ = stopped.await;
        })
        .await
    });

    // serve_unix binds inside the task; wait for the socket to appear (bounded).
    let mut waited = Duration::ZERO;
    while !sock.exists() {
        assert!(
            waited < Duration::from_secs(10),
            "socket never appeared at {}",
            sock.display()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
        waited += Duration::from_millis(10);
    }

    let info = IdentityClient::new(channel)
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "test.csi.example.com");

    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("server stops after the shutdown signal")
        .unwrap()
        .unwrap();
    assert!(!sock.exists(), "the socket file is removed on shutdown");
}
