//! Errors: recorded on the VolumeAttachment (status + Event), retried with growing backoff,
//! cleared by success; malformed objects never crash the controller; 409s are retried.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use csi_mock::{Method, MockConfig, Step};
use kube::Client;
use kube::api::{Patch, PatchParams};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_csi_error_is_saved_retried_with_growing_delays_then_cleared() {
    let mut env = Env::new(MockConfig::default()).await;
    let fail = || Step::Fail(tonic::Code::Internal, "disk is busy".into());
    env.mock().script(
        Method::ControllerPublishVolume,
        "vol-e",
        vec![fail(), fail(), fail(), fail()],
    );
    env.start(fast_options()).await;
    env.create_pair("e").await;

    let va = env.wait_attach_error("va-e", "disk is busy").await;
    let err = va.status.unwrap().attach_error.unwrap();
    let msg = err.message.unwrap();
    // As the Go external-attacher writes it (Go's gRPC error text).
    assert_eq!(msg, "rpc error: code = Internal desc = disk is busy");
    assert_eq!(err.error_code, Some(tonic::Code::Internal as i32));
    assert!(err.time.is_some());

    let va = env.wait_attached("va-e").await;
    let status = va.status.unwrap();
    assert!(status.attach_error.is_none(), "success clears attachError");
    assert!(status.attachment_metadata.is_some());

    let calls = env.mock().calls_of(Method::ControllerPublishVolume);
    assert_eq!(calls.len(), 5, "four failures, one success");
    let gaps: Vec<Duration> = calls.windows(2).map(|w| w[1].at - w[0].at).collect();
    // --retry-interval-start 50ms, doubling: 50, 100, 200, 400 ms at least.
    for (i, gap) in gaps.iter().enumerate() {
        let want = Duration::from_millis(50 << i);
        assert!(
            *gap >= want,
            "retry {i} after {gap:?}, want >= {want:?}: {gaps:?}"
        );
    }

    // One Event for the repeated failure, counted, not one per retry.
    let events = env.events_for("va-e").await;
    assert_eq!(events.len(), 1, "{events:?}");
    let event = &events[0];
    assert_eq!(event.reason.as_deref(), Some("FailedAttach"));
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(event.count, Some(4));
    assert!(
        event
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("disk is busy")
    );
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_driver_is_cut_off_at_the_timeout_as_deadline_exceeded() {
    let mut env = Env::new(MockConfig::default()).await;
    env.mock().script(
        Method::ControllerPublishVolume,
        "vol-h",
        vec![Step::Hang, Step::Hang],
    );
    let mut options = fast_options();
    options.timeout = Duration::from_millis(300);
    env.start(options).await;
    env.create_pair("h").await;
    // The status shows the error between the first timeout and the success; the Event stays.
    let va = env.wait_attach_error("va-h", "DeadlineExceeded").await;
    assert_eq!(
        va.status.unwrap().attach_error.unwrap().error_code,
        Some(tonic::Code::DeadlineExceeded as i32)
    );
    env.wait_attached("va-h").await;
    env.stop().await;
    assert_eq!(
        env.mock().calls_of(Method::ControllerPublishVolume).len(),
        3
    );
    let events = env.events_for("va-h").await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].count, Some(2));
    assert!(
        events[0]
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("DeadlineExceeded")
    );
    let codes: Vec<tonic::Code> = env
        .observed
        .lock()
        .unwrap()
        .iter()
        .map(|(_, code, _)| *code)
        .collect();
    assert_eq!(
        codes,
        [
            tonic::Code::DeadlineExceeded,
            tonic::Code::DeadlineExceeded,
            tonic::Code::Ok
        ]
    );
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_pv_is_an_error_until_it_appears() {
    let mut env = Env::new(MockConfig::default()).await;
    env.start(fast_options()).await;
    env.create_va(&va_for_pv("va-nopv", "pv-nopv", NODE)).await;
    let va = env
        .wait_attach_error("va-nopv", "PersistentVolume pv-nopv not found")
        .await;
    assert!(
        finalizers_of(&va).is_empty(),
        "no finalizer before the checks pass"
    );
    env.create_pv(&csi_pv("pv-nopv", "vol-nopv")).await;
    env.wait_attached("va-nopv").await;
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pv_being_deleted_is_never_attached() {
    let mut env = Env::new(MockConfig::default()).await;
    let mut pv = csi_pv("pv-dying", "vol-dying");
    pv.metadata.finalizers = Some(vec!["example.com/keep".into()]);
    env.create_pv(&pv).await;
    env.delete_pv("pv-dying").await;
    env.start(fast_options()).await;
    env.create_va(&va_for_pv("va-dying", "pv-dying", NODE))
        .await;
    let va = env
        .wait_attach_error("va-dying", "marked for deletion")
        .await;
    assert!(finalizers_of(&va).is_empty());
    // Still failing after a few retries, and never published.
    let vas = env.vas();
    eventually("a few retries", || async {
        let events = env.events_for("va-dying").await;
        (events.first()?.count? >= 3).then_some(())
    })
    .await;
    let va = vas.get_opt("va-dying").await.unwrap().unwrap();
    assert!(!va.status.unwrap().attached);
    assert!(
        env.mock()
            .calls_of(Method::ControllerPublishVolume)
            .is_empty()
    );
    let pv = env.get_pv("pv-dying").await.unwrap();
    assert_eq!(
        finalizers_of(&pv),
        ["example.com/keep"],
        "no finalizer added to a dying PV"
    );
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_csinode_or_driver_entry_is_an_error_until_the_node_registers() {
    let mut env = Env::new(MockConfig::default()).await;
    env.start(fast_options()).await;
    env.create_pv(&csi_pv("pv-n2", "vol-n2")).await;
    env.create_va(&va_for_pv("va-n2", "pv-n2", "node-2")).await;
    env.wait_attach_error("va-n2", "CSINode node-2 not found")
        .await;

    env.create_pv(&csi_pv("pv-n3", "vol-n3")).await;
    env.create_csinode("node-3", &[("other.csi.io", "x")]).await;
    env.create_va(&va_for_pv("va-n3", "pv-n3", "node-3")).await;
    env.wait_attach_error(
        "va-n3",
        "CSINode node-3 has no entry for driver mock.csi.rs",
    )
    .await;

    env.create_csinode("node-2", &[(DRIVER, "mock-node-2")])
        .await;
    env.wait_attached("va-n2").await;
    let calls = env.mock().calls_of(Method::ControllerPublishVolume);
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].node_id, "mock-node-2");
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impossible_access_modes_are_an_error_without_side_effects() {
    let mut env = Env::new(MockConfig::default()).await;
    let mut pv = csi_pv("pv-modes", "vol-modes");
    pv.spec.as_mut().unwrap().access_modes =
        Some(vec!["ReadOnlyMany".into(), "ReadWriteOnce".into()]);
    env.create_pv(&pv).await;
    env.create_va(&va_for_pv("va-modes", "pv-modes", NODE))
        .await;
    env.start(fast_options()).await;
    let va = env.wait_attach_error("va-modes", "spec.accessModes").await;
    assert!(finalizers_of(&va).is_empty());
    assert!(finalizers_of(&env.get_pv("pv-modes").await.unwrap()).is_empty());
    assert!(
        env.mock()
            .calls_of(Method::ControllerPublishVolume)
            .is_empty()
    );
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pv_of_another_driver_is_refused() {
    let mut env = Env::new(MockConfig::default()).await;
    env.create_pv(&csi_pv_of("pv-foreign", "vol-foreign", "other.csi.io"))
        .await;
    env.create_va(&va_for_pv("va-foreign", "pv-foreign", NODE))
        .await;
    env.start(fast_options()).await;
    env.wait_attach_error("va-foreign", "other.csi.io").await;
    assert!(
        env.mock()
            .calls_of(Method::ControllerPublishVolume)
            .is_empty()
    );
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_refuses_neither_and_both_sources_so_the_controller_never_sees_them() {
    // The controller's own checks are unit tests (handler::csi::tests); here: such objects
    // cannot even be created, so a running controller never has to survive them via the API.
    let env = Env::new(MockConfig::default()).await;
    let mut neither = va_for_pv("va-neither", "x", NODE);
    neither.spec.source.persistent_volume_name = None;
    assert!(
        env.vas()
            .create(&Default::default(), &neither)
            .await
            .is_err()
    );
    env.shutdown().await;
}

/// A layer on the controller's client that, before the first PATCH of pv-c and of va-c (bits 1
/// and 2 of `armed`), changes the object through another client: the controller's patch then
/// carries a stale resourceVersion and gets 409 Conflict.
#[derive(Clone)]
struct ConflictLayer {
    side: Client,
    armed: Arc<AtomicUsize>,
}

struct ConflictService<S> {
    inner: S,
    side: Client,
    armed: Arc<AtomicUsize>,
}

impl<S> tower::Layer<S> for ConflictLayer {
    type Service = ConflictService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        ConflictService {
            inner,
            side: self.side.clone(),
            armed: self.armed.clone(),
        }
    }
}

impl<S> tower::Service<http::Request<kube::client::Body>> for ConflictService<S>
where
    S: tower::Service<http::Request<kube::client::Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<kube::client::Body>) -> Self::Future {
        let path = req.uri().path().to_string();
        let target = if path.ends_with("/volumeattachments/va-c") {
            Some("va")
        } else if path.ends_with("/persistentvolumes/pv-c") {
            Some("pv")
        } else {
            None
        };
        // Once per object: the PV's first patch, then the VolumeAttachment's first patch.
        let bit = match target {
            Some("pv") => 1,
            Some(_) => 2,
            None => 0,
        };
        let take = req.method() == http::Method::PATCH
            && bit != 0
            && self.armed.fetch_and(!bit, Ordering::SeqCst) & bit != 0;
        if let (true, Some(kind)) = (take, target) {
            let side = self.side.clone();
            let patch = serde_json::json!({"metadata": {"labels": {"touched-by": "test"}}});
            tokio::task::block_in_place(|| {
                tokio::runtime::Handle::current().block_on(async move {
                    let pp = PatchParams::default();
                    if kind == "va" {
                        kube::Api::<k8s_openapi::api::storage::v1::VolumeAttachment>::all(side)
                            .patch("va-c", &pp, &Patch::Merge(&patch))
                            .await
                            .map(|_| ())
                    } else {
                        kube::Api::<k8s_openapi::api::core::v1::PersistentVolume>::all(side)
                            .patch("pv-c", &pp, &Patch::Merge(&patch))
                            .await
                            .map(|_| ())
                    }
                    .expect("concurrent update");
                });
            });
        }
        self.inner.call(req)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicting_finalizer_writes_are_retried_without_losing_the_other_change() {
    let mut env = Env::new(MockConfig::default()).await;
    let mut config = env.server.kube_config().unwrap();
    config
        .headers
        .push((http::header::USER_AGENT, http::HeaderValue::from_static(UA)));
    let armed = Arc::new(AtomicUsize::new(1 | 2));
    apiserver::install_crypto_provider();
    let client = kube::client::ClientBuilder::try_from(config)
        .unwrap()
        .with_layer(&ConflictLayer {
            side: env.kube.clone(),
            armed: armed.clone(),
        })
        .build();
    let driver = env.driver().await;
    env.start_on(client, driver, fast_options());
    env.create_pair("c").await;

    let va = env.wait_attached("va-c").await;
    env.stop().await;
    assert_eq!(
        armed.load(Ordering::SeqCst),
        0,
        "both conflicts were provoked"
    );
    assert_eq!(finalizers_of(&va), [FINALIZER]);
    let label = |labels: Option<&std::collections::BTreeMap<String, String>>| {
        labels.and_then(|l| l.get("touched-by")).cloned()
    };
    assert_eq!(label(va.metadata.labels.as_ref()), Some("test".into()));
    let pv = env.get_pv("pv-c").await.unwrap();
    assert_eq!(finalizers_of(&pv), [FINALIZER]);
    assert_eq!(label(pv.metadata.labels.as_ref()), Some("test".into()));

    let writes: Vec<(String, u16)> = env
        .controller_writes()
        .iter()
        .map(|r| (describe(r), r.code))
        .collect();
    assert_eq!(
        writes,
        [
            ("patch persistentvolumes/pv-c".to_string(), 409),
            ("patch persistentvolumes/pv-c".to_string(), 200),
            ("patch volumeattachments/va-c".to_string(), 409),
            ("patch volumeattachments/va-c".to_string(), 200),
            ("patch volumeattachments/va-c/status".to_string(), 200),
        ]
    );
    assert_eq!(
        env.mock().calls_of(Method::ControllerPublishVolume).len(),
        1
    );
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pv_or_csinode_that_appears_ends_the_wait_at_once() {
    let mut env = Env::new(MockConfig::default()).await;
    let mut options = fast_options();
    // Far beyond PATIENCE: only the kick can attach these within the test.
    options.retry_interval_start = Duration::from_secs(600);
    options.retry_interval_max = Duration::from_secs(600);
    env.start(options).await;

    env.create_va(&va_for_pv("va-later", "pv-later", NODE))
        .await;
    env.wait_attach_error("va-later", "PersistentVolume pv-later not found")
        .await;
    env.create_pv(&csi_pv("pv-later", "vol-later")).await;
    env.wait_attached("va-later").await;

    env.create_pv(&csi_pv("pv-n9", "vol-n9")).await;
    env.create_va(&va_for_pv("va-n9", "pv-n9", "node-9")).await;
    env.wait_attach_error("va-n9", "CSINode node-9 not found")
        .await;
    env.create_csinode("node-9", &[(DRIVER, "mock-node-9")])
        .await;
    env.wait_attached("va-n9").await;
    env.shutdown().await;
}
