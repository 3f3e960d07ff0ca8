//! What the CSI plumbing costs per call: protobuf encode/decode of a full CreateVolumeRequest,
//! and a GetPluginInfo round trip over a real unix socket (tonic client and server, HTTP/2).
//!
//! Run: `cargo bench -p csi-spec`

// A benchmark that cannot set up has nothing to measure: failing loudly with the reason is right.
#![allow(clippy::expect_used)]

use std::collections::HashMap;

use criterion::{Criterion, criterion_group, criterion_main};
use csi_spec::v1::identity_client::IdentityClient;
use csi_spec::v1::identity_server::{Identity, IdentityServer};
use csi_spec::v1::volume_capability::access_mode::Mode;
use csi_spec::v1::*;
use csi_spec::{UnixSocket, connect_unix};
use prost::Message;
use tonic::{Request, Response, Status};

fn create_volume_request() -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: "pvc-6f1c1a3e-3b1f-4a7e-9d7e-0c1d2e3f4a5b".into(),
        capacity_range: Some(CapacityRange {
            required_bytes: 10 << 30,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![VolumeCapability::mount(
            "ext4",
            vec![],
            Mode::SingleNodeWriter,
        )],
        parameters: HashMap::from([
            ("type".into(), "gp3".into()),
            ("iops".into(), "3000".into()),
            ("csi.storage.k8s.io/pvc/name".into(), "data".into()),
        ]),
        secrets: HashMap::new(),
        volume_content_source: None,
        accessibility_requirements: Some(TopologyRequirement {
            requisite: vec![Topology::from_segments([(
                "topology.ebs.csi.aws.com/zone",
                "us-east-1a",
            )])],
            preferred: vec![],
        }),
        mutable_parameters: HashMap::new(),
    }
}

fn codec(c: &mut Criterion) {
    let req = create_volume_request();
    let bytes = req.encode_to_vec();
    c.bench_function("encode CreateVolumeRequest", |b| {
        b.iter(|| std::hint::black_box(&req).encode_to_vec())
    });
    c.bench_function("decode CreateVolumeRequest", |b| {
        b.iter(|| CreateVolumeRequest::decode(std::hint::black_box(bytes.as_slice())))
    });
}

struct Plugin;

#[tonic::async_trait]
impl Identity for Plugin {
    async fn get_plugin_info(
        &self,
        _request: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: "bench.csi.example.com".into(),
            vendor_version: "0.1.0".into(),
            manifest: HashMap::new(),
        }))
    }
}

fn unix_round_trip(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    let dir = tempfile::tempdir().expect("temp dir");
    let endpoint = format!("unix://{}", dir.path().join("csi.sock").display());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let socket = {
        let _runtime = rt.enter();
        UnixSocket::bind(&endpoint).expect("bind")
    };
    let router = tonic::transport::Server::builder().add_service(IdentityServer::new(Plugin));
    let server = rt.spawn(socket.serve(router, async {
        let _ = stopped.await;
    }));
    let client =
        rt.block_on(async { IdentityClient::new(connect_unix(&endpoint).await.expect("connect")) });

    c.bench_function("GetPluginInfo over unix socket", |b| {
        b.to_async(&rt).iter(|| {
            let mut client = client.clone();
            async move {
                client
                    .get_plugin_info(GetPluginInfoRequest {})
                    .await
                    .expect("GetPluginInfo")
            }
        })
    });

    drop(client);
    let _ = stop.send(());
    let _ = rt.block_on(server);
}

criterion_group!(benches, codec, unix_round_trip);
criterion_main!(benches);
