//! The fault proxy between a real client and a real tonic driver on unix sockets: calls pass
//! unchanged, a `before` fault never reaches the driver, an `after` fault lets the driver do
//! the work and still fails the call, and a stopped driver reads as Unavailable.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use csi_spec::faults::{Fault, FaultPlan, When, serve_proxy};
use csi_spec::v1::identity_client::IdentityClient;
use csi_spec::v1::identity_server::{Identity, IdentityServer};
use csi_spec::v1::{GetPluginInfoRequest, GetPluginInfoResponse, ProbeRequest, ProbeResponse};
use csi_spec::{UnixSocket, connect_unix};
use tokio_util::sync::CancellationToken;
use tonic::transport::Server;
use tonic::{Code, Request, Response, Status};

/// Counts the Probes it served: the driver's side of the story.
struct Counting(Arc<AtomicU32>);

#[tonic::async_trait]
impl Identity for Counting {
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

    async fn probe(
        &self,
        _request: Request<ProbeRequest>,
    ) -> Result<Response<ProbeResponse>, Status> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(Response::new(ProbeResponse { ready: Some(true) }))
    }
}

#[tokio::test]
async fn faults_fire_before_or_after_the_driver_and_calls_otherwise_pass() {
    let dir = tempfile::tempdir().unwrap();
    let driver = format!("unix://{}", dir.path().join("driver.sock").display());
    let proxy = format!("unix://{}", dir.path().join("proxy.sock").display());
    let probes = Arc::new(AtomicU32::new(0));
    let stop_driver = CancellationToken::new();
    let driver_task = {
        let router =
            Server::builder().add_service(IdentityServer::new(Counting(Arc::clone(&probes))));
        let socket = UnixSocket::bind(&driver).unwrap();
        let stop = stop_driver.clone();
        tokio::spawn(async move { socket.serve(router, stop.cancelled_owned()).await })
    };
    let plan = FaultPlan::new();
    let stop_proxy = CancellationToken::new();
    let proxy_task = {
        let socket = UnixSocket::bind(&proxy).unwrap();
        let (plan, driver, stop) = (plan.clone(), driver.clone(), stop_proxy.clone());
        tokio::spawn(
            async move { serve_proxy(socket, &driver, plan, stop.cancelled_owned()).await },
        )
    };
    let mut client = IdentityClient::new(connect_unix(&proxy).await.unwrap());

    // Untouched: the driver's answer comes back as it was.
    let info = client
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "test.csi.example.com");
    assert!(client.probe(ProbeRequest {}).await.is_ok());
    assert_eq!(probes.load(Ordering::SeqCst), 1);

    // Before: the caller gets the code, the driver never sees the call.
    plan.add(Fault {
        method: "Probe".into(),
        code: Code::DeadlineExceeded,
        when: When::Before,
        count: 1,
    });
    let e = client.probe(ProbeRequest {}).await.unwrap_err();
    assert_eq!(e.code(), Code::DeadlineExceeded, "{e:?}");
    assert!(e.message().contains("before Probe"), "{}", e.message());
    assert_eq!(
        probes.load(Ordering::SeqCst),
        1,
        "a before fault reached the driver"
    );

    // After: the driver did the work, the caller still sees the error.
    plan.add(Fault {
        method: "Probe".into(),
        code: Code::Unavailable,
        when: When::After,
        count: 1,
    });
    let e = client.probe(ProbeRequest {}).await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert_eq!(
        probes.load(Ordering::SeqCst),
        2,
        "an after fault did not reach the driver"
    );

    // Rules count down: the next call passes; other methods were never affected.
    assert!(client.probe(ProbeRequest {}).await.is_ok());
    assert_eq!(probes.load(Ordering::SeqCst), 3);
    assert_eq!((plan.injected(), plan.calls()), (2, 5));

    // A delay holds the call back before the driver sees it.
    plan.set_delay("Probe", Duration::from_millis(300));
    let t = Instant::now();
    assert!(client.probe(ProbeRequest {}).await.is_ok());
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
    plan.clear();

    // The driver gone: Unavailable, as a caller dialing it directly would see.
    stop_driver.cancel();
    driver_task.await.unwrap().unwrap();
    let e = client.probe(ProbeRequest {}).await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");

    stop_proxy.cancel();
    proxy_task.await.unwrap().unwrap();
    assert!(
        !dir.path().join("proxy.sock").exists(),
        "the proxy's socket is left"
    );
}
