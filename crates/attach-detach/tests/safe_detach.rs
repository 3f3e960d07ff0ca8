//! The checks before a detach (storage safety: never detach a volume in use): a volume the node
//! reports in `status.volumesInUse` is not detached, whatever the controller's watch cache says.
//! Right before the detach the node is read from the API server (Kubernetes'
//! `verifyVolumeIsSafeToDetach`); an uncertain attachment (an attach that failed and may have left
//! the volume attached) waits for the node like a confirmed one.
//!
//! The cache lag is made honestly: a layer on the controller's own client holds back the body
//! of its Node watch while the test says so, as a slow watch connection would; everything else
//! (the GET of the node, status patches, the other watches) goes through untouched.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use futures::StreamExt;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, BodyStream, StreamBody};
use kube::client::{Body, ClientBuilder, DynBody};
use tokio::sync::watch;
use volume_plugins::SkipAttachMode::BypassAdc;

const A: &str = "node-a";

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Holds back the frames of Node watch responses while the gate is closed (false).
#[derive(Clone)]
struct NodeWatchGate {
    open: watch::Receiver<bool>,
}

struct GatedService<S> {
    inner: S,
    open: watch::Receiver<bool>,
}

impl<S> tower::Layer<S> for NodeWatchGate {
    type Service = GatedService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        GatedService {
            inner,
            open: self.open.clone(),
        }
    }
}

fn is_node_watch<B>(req: &http::Request<B>) -> bool {
    req.uri().path() == "/api/v1/nodes"
        && req
            .uri()
            .query()
            .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true"))
}

impl<S> tower::Service<http::Request<Body>> for GatedService<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Box<DynBody>>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<UnsyncBoxBody<Bytes, BoxError>>;
    type Error = S::Error;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let gated = is_node_watch(&req);
        let open = self.open.clone();
        let response = self.inner.call(req);
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|body| {
                if !gated {
                    return body.boxed_unsync();
                }
                let frames = BodyStream::new(body).then(move |frame| {
                    let mut open = open.clone();
                    async move {
                        // Err: the test dropped the sender; let everything through.
                        let _ = open.wait_for(|o| *o).await;
                        frame
                    }
                });
                StreamBody::new(frames).boxed_unsync()
            }))
        })
    }
}

async fn one_attached_volume(env: &mut Env, handle: &str) -> String {
    env.start_attacher(DRIVER).await;
    env.create_node(A, &[DRIVER], None).await;
    env.create_csi_pv("pv-1", "c1", DRIVER, handle, "ReadWriteOnce")
        .await;
    env.create_pod("pod-1", A, "c1").await;
    csi_name(DRIVER, handle)
}

/// The VolumeAttachment deletes the controller sent.
fn va_deletes(env: &Env) -> usize {
    env.adc_requests("delete", "volumeattachments").len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_the_node_uses_is_not_detached_while_the_controllers_cache_lags() {
    let mut env = Env::new().await;
    let name = one_attached_volume(&mut env, "h-lag").await;
    let (gate, open) = watch::channel(true);
    let client = ClientBuilder::try_from(env.adc_config().await)
        .unwrap()
        .with_layer(&NodeWatchGate { open })
        .build();
    env.start_adc_on(client, fast_options(BypassAdc));
    env.wait_va_attached("h-lag", DRIVER, A).await;
    env.wait_volumes_attached(A, &[&name]).await;

    // The controller's Node watch stalls; meanwhile the kubelet mounts the volume and says so,
    // and the pod is deleted. The cache still has the node without status.volumesInUse.
    gate.send_replace(false);
    env.set_volumes_in_use(A, &[&name]).await;
    let gets_before = env.adc_requests("get", "nodes").len();
    env.delete_pod("pod-1").await;
    stays(
        "the node uses the volume: no detach",
        Duration::from_secs(3),
        || async { va_deletes(&env) == 0 && env.va_exists("h-lag", DRIVER, A).await },
    )
    .await;
    let gets = env.adc_requests("get", "nodes").len() - gets_before;
    assert!(
        gets >= 2,
        "the detach was tried and refused after reading the node from the API server, with retries ({gets} GETs)"
    );
    // Refused detaches put the volume back into status.volumesAttached.
    env.wait_volumes_attached(A, &[&name]).await;

    // The kubelet unmounts; the controller's cache still has not seen any of it.
    env.set_volumes_in_use(A, &[]).await;
    env.wait_va_gone("h-lag", DRIVER, A).await;
    env.wait_volumes_attached(A, &[]).await;
    assert_eq!(va_deletes(&env), 1);
    gate.send_replace(true);
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncertain_attachment_the_node_uses_waits_for_the_node_like_an_attached_one() {
    let mut env = Env::new().await;
    // The driver's ControllerPublish outlasts the attacher's 5 s timeout and the controller's
    // attach timeout: the attach fails, and the volume may be attached (uncertain).
    env.start_attacher_with_delay(DRIVER, Duration::from_secs(10))
        .await;
    env.create_node(A, &[DRIVER], None).await;
    env.create_csi_pv("pv-u", "cu", DRIVER, "h-u", "ReadWriteOnce")
        .await;
    let name = csi_name(DRIVER, "h-u");
    // The kubelet lists a volume in use as soon as a pod wants it, before it is attached.
    env.set_volumes_in_use(A, &[&name]).await;
    env.create_pod("pod-u", A, "cu").await;
    let mut options = fast_options(BypassAdc);
    options.attach_timeout = Duration::from_millis(300);
    env.start_adc(options);
    env.wait_pod_event("pod-u", "FailedAttachVolume", "").await;
    assert!(env.va_exists("h-u", DRIVER, A).await);

    env.delete_pod("pod-u").await;
    stays(
        "the node lists the volume in use: the uncertain attachment is not detached",
        Duration::from_secs(3),
        || async { va_deletes(&env) == 0 && env.va_exists("h-u", DRIVER, A).await },
    )
    .await;
    assert!(
        env.volumes_attached(A).await.is_empty(),
        "an uncertain attachment is never reported attached"
    );

    env.set_volumes_in_use(A, &[]).await;
    eventually("the controller deletes the VolumeAttachment", || async {
        (va_deletes(&env) >= 1).then_some(())
    })
    .await;
    env.shutdown().await;
}
