//! The CSI plugin's attach side against the embedded API server, with the real external
//! attacher (the `attacher` library, in-process) fulfilling its VolumeAttachments through
//! csi-mock: skip attach in both modes (the skip-attach design, docs/design/skip-attach.md), reuse,
//! attach errors, the late CSIDriver, the stale VolumeAttachment deleted on detach, inline sources.
//! VolumeAttachment writes are counted in the API server's audit trail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::time::{Duration, Instant};

use attacher::{Capabilities, Controller, Driver, Options};
use component_runtime::ObjectCache;
use csi_mock::{Method, MockConfig, MockDriver, Step};
use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, PersistentVolume, PersistentVolumeSpec,
};
use k8s_openapi::api::storage::v1::{CSIDriver, CSINode, VolumeAttachment};
use kube::api::PostParams;
use kube::runtime::watcher;
use kube::{Api, Client};
use test_support::objects;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use volume_plugins::names::volume_attachment_name;
use volume_plugins::{AttachPath, AttachSource, CsiPlugin, CsiVolume, Error, SkipAttachMode};

const DRIVER: &str = "mock.csi.rs";
const NODE: &str = "node-1";
const NODE_ID: &str = "mock-node-1";
const FINALIZER: &str = "external-attacher/mock-csi-rs";
/// How long anything may take before a test gives up (loaded 2-core CI machines).
const PATIENCE: Duration = Duration::from_secs(60);
const MODES: [SkipAttachMode; 2] = [SkipAttachMode::BypassAdc, SkipAttachMode::ThroughAdc];

/// The CSIDriver object of the mock driver, if any.
#[derive(Debug, Clone, Copy)]
enum CsiDriverObject {
    Missing,
    AttachRequired(bool),
}

struct Attacher {
    stop: CancellationToken,
    task: JoinHandle<Result<(), attacher::Error>>,
}

struct Env {
    server: apiserver::RunningApiServer,
    client: Client,
    mock: Option<MockDriver>,
    _dir: tempfile::TempDir,
    attacher: Option<Attacher>,
    /// Stops the plugin's caches.
    caches: CancellationToken,
}

impl Env {
    /// API server, csi-mock, the CSINode of node-1 registering the mock, and the CSIDriver.
    async fn new(driver: CsiDriverObject) -> Self {
        let server = apiserver::ApiServer::start(apiserver::Config::default())
            .await
            .expect("api server");
        let client = server.client();
        let dir = tempfile::tempdir().expect("tempdir");
        let mock = csi_mock::start(dir.path(), MockConfig::default())
            .await
            .expect("csi-mock");
        let env = Self {
            server,
            client,
            mock: Some(mock),
            _dir: dir,
            attacher: None,
            caches: CancellationToken::new(),
        };
        let csinode = objects::csinode(NODE, &[(DRIVER, NODE_ID)]);
        Api::<CSINode>::all(env.client.clone())
            .create(&PostParams::default(), &csinode)
            .await
            .expect("create CSINode");
        if let CsiDriverObject::AttachRequired(required) = driver {
            env.create_csidriver(required).await;
        }
        env
    }

    fn mock(&self) -> &MockDriver {
        self.mock.as_ref().expect("mock")
    }

    /// The real external attacher for the mock, in-process.
    async fn start_attacher(&mut self) {
        let channel = csi_spec::connect_unix(&self.mock().endpoint())
            .await
            .expect("dial csi-mock");
        let driver = Driver::Csi {
            name: DRIVER.into(),
            channel,
            capabilities: Capabilities {
                publish_unpublish: true,
                publish_readonly: true,
                list_published_nodes: false,
                single_node_multi_writer: false,
            },
        };
        let options = Options {
            timeout: Duration::from_secs(5),
            workers: 4,
            retry_interval_start: Duration::from_millis(50),
            retry_interval_max: Duration::from_secs(1),
            resync: Duration::ZERO,
            reconcile_sync: Duration::ZERO,
            max_entries: 0,
            default_fstype: String::new(),
        };
        let mut registry = prometheus_client::registry::Registry::default();
        let controller = Controller::new(self.client.clone(), driver, options, &mut registry, None);
        let stop = CancellationToken::new();
        let task = tokio::spawn(controller.run(stop.clone()));
        self.attacher = Some(Attacher { stop, task });
    }

    /// The plugin under test over fresh watch-fed caches, once they have listed.
    async fn plugin(&self, mode: SkipAttachMode) -> CsiPlugin {
        let drivers: ObjectCache<CSIDriver> = ObjectCache::spawn(
            Api::all(self.client.clone()),
            watcher::Config::default(),
            self.caches.clone(),
        );
        let vas: ObjectCache<VolumeAttachment> = ObjectCache::spawn(
            Api::all(self.client.clone()),
            watcher::Config::default(),
            self.caches.clone(),
        );
        assert!(drivers.wait_until_ready(PATIENCE).await, "CSIDriver cache");
        assert!(
            vas.wait_until_ready(PATIENCE).await,
            "VolumeAttachment cache"
        );
        CsiPlugin::new(self.client.clone(), drivers, vas, mode)
    }

    async fn create_csidriver(&self, attach_required: bool) {
        Api::<CSIDriver>::all(self.client.clone())
            .create(
                &PostParams::default(),
                &objects::csidriver(DRIVER, attach_required),
            )
            .await
            .expect("create CSIDriver");
    }

    async fn create_pv(&self, name: &str, handle: &str) {
        let mut pv = objects::csi_pv(name, DRIVER, handle);
        if let Some(spec) = pv.spec.as_mut() {
            spec.csi = Some(csi_source(handle));
        }
        Api::<PersistentVolume>::all(self.client.clone())
            .create(&PostParams::default(), &pv)
            .await
            .expect("create PV");
    }

    fn vas(&self) -> Api<VolumeAttachment> {
        Api::all(self.client.clone())
    }

    async fn get_va(&self, name: &str) -> Option<VolumeAttachment> {
        self.vas().get_opt(name).await.expect("get VA")
    }

    /// VolumeAttachment requests with this verb, as (HTTP code) in order.
    fn va_requests(&self, verb: &str) -> Vec<u16> {
        self.server
            .audit()
            .into_iter()
            .filter(|r| r.resource == "volumeattachments" && r.verb == verb)
            .map(|r| r.code)
            .collect()
    }

    /// VolumeAttachments created (successfully) so far.
    fn va_creates(&self) -> usize {
        self.va_requests("create")
            .iter()
            .filter(|c| (200..300).contains(*c))
            .count()
    }

    async fn shutdown(mut self) {
        self.caches.cancel();
        if let Some(a) = self.attacher.take() {
            a.stop.cancel();
            tokio::time::timeout(PATIENCE, a.task)
                .await
                .expect("attacher stops in time")
                .expect("attacher task")
                .expect("attacher ends without error");
        }
        if let Some(mock) = self.mock.take() {
            mock.shutdown().await;
        }
        self.server.shutdown().await.expect("api server shutdown");
    }
}

fn csi_source(handle: &str) -> CSIPersistentVolumeSource {
    CSIPersistentVolumeSource {
        driver: DRIVER.into(),
        volume_handle: handle.into(),
        fs_type: Some("ext4".into()),
        ..Default::default()
    }
}

fn pv_volume(pv: &str, handle: &str) -> CsiVolume {
    CsiVolume {
        driver: DRIVER.into(),
        volume_handle: handle.into(),
        source: AttachSource::PersistentVolume(pv.into()),
    }
}

/// Polls `check` every 20 ms until it returns `Some`, or panics after [`PATIENCE`].
async fn eventually<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    test_support::eventually(what, PATIENCE, check).await
}

/// attachRequired true, and no CSIDriver at all (attachable as Kubernetes assumes), in both
/// modes: the VolumeAttachment Kubernetes would make, fulfilled by the attacher; a repeat
/// reuses it; the kubelet's wait and the periodic check see it; detach removes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attachable_volumes_get_one_volume_attachment_that_the_attacher_fulfils() {
    for driver in [
        CsiDriverObject::AttachRequired(true),
        CsiDriverObject::Missing,
    ] {
        for mode in MODES {
            let case = format!("{driver:?} in {mode}");
            let mut env = Env::new(driver).await;
            env.start_attacher().await;
            env.create_pv("pv-1", "vol-1").await;
            let plugin = env.plugin(mode).await;
            assert_eq!(
                plugin.attach_path(DRIVER),
                AttachPath::VolumeAttachment,
                "{case}"
            );
            assert!(plugin.can_attach(DRIVER), "{case}");
            let volume = pv_volume("pv-1", "vol-1");
            let name = volume_attachment_name("vol-1", DRIVER, NODE);

            let attached = plugin.attach(&volume, NODE, PATIENCE).await.unwrap();
            assert_eq!(
                attached.volume_attachment.as_deref(),
                Some(name.as_str()),
                "{case}"
            );
            assert_eq!(attached.device_path, "", "{case}: CSI has no device path");
            assert_eq!(
                attached
                    .attachment_metadata
                    .get(csi_mock::DEVICE_PATH_KEY)
                    .map(String::as_str),
                Some("/dev/mock/vol-1"),
                "{case}: the driver's publish context"
            );
            let va = env.get_va(&name).await.expect("VolumeAttachment");
            assert_eq!(va.spec.attacher, DRIVER, "{case}");
            assert_eq!(va.spec.node_name, NODE, "{case}");
            assert_eq!(
                va.spec.source.persistent_volume_name.as_deref(),
                Some("pv-1"),
                "{case}"
            );
            assert!(va.spec.source.inline_volume_spec.is_none(), "{case}");
            assert!(va.status.as_ref().is_some_and(|s| s.attached), "{case}");
            assert_eq!(
                va.metadata.finalizers.as_deref(),
                Some(&[FINALIZER.to_string()][..]),
                "{case}"
            );
            assert_eq!(env.va_creates(), 1, "{case}");

            // Again (a retry, a restarted controller): the same VolumeAttachment, no new one,
            // no second ControllerPublish.
            let again = plugin.attach(&volume, NODE, PATIENCE).await.unwrap();
            assert_eq!(again, attached, "{case}");
            assert_eq!(env.va_creates(), 1, "{case}");
            assert_eq!(env.va_requests("create"), [201, 409], "{case}");
            assert_eq!(
                env.mock().calls_of(Method::ControllerPublishVolume).len(),
                1,
                "{case}"
            );

            // The kubelet's wait and the controller's periodic check.
            let waited = plugin
                .wait_for_attach(DRIVER, "vol-1", NODE, PATIENCE)
                .await
                .unwrap();
            assert_eq!(waited, attached, "{case}");
            let volumes = [
                (DRIVER.to_string(), "vol-1".to_string()),
                (DRIVER.to_string(), "vol-never-attached".to_string()),
            ];
            assert_eq!(
                plugin.volumes_are_attached(&volumes, NODE),
                [true, false],
                "{case}"
            );
            assert_eq!(
                plugin.volumes_are_attached(&volumes, "node-2"),
                [false, false]
            );

            // Detach: deleted, the attacher unpublishes and lets go, the wait sees it gone.
            assert!(
                plugin
                    .detach(DRIVER, "vol-1", NODE, PATIENCE)
                    .await
                    .unwrap(),
                "{case}"
            );
            assert!(env.get_va(&name).await.is_none(), "{case}");
            assert_eq!(
                env.mock().calls_of(Method::ControllerUnpublishVolume).len(),
                1,
                "{case}"
            );
            assert!(
                env.mock().published().values().all(|n| n.is_empty()),
                "{case}"
            );
            assert_eq!(plugin.volumes_are_attached(&volumes, NODE), [false, false]);
            assert!(
                !plugin
                    .detach(DRIVER, "vol-1", NODE, PATIENCE)
                    .await
                    .unwrap(),
                "{case}"
            );
            env.shutdown().await;
        }
    }
}

/// attachRequired false: nothing is written at all. Bypass mode leaves the volume out of the
/// attach/detach controller (can_attach false); the design's own mode (through-adc) attaches with a
/// no-op.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_required_false_writes_no_volume_attachment() {
    for mode in MODES {
        let mut env = Env::new(CsiDriverObject::AttachRequired(false)).await;
        env.start_attacher().await;
        env.create_pv("pv-1", "vol-1").await;
        let plugin = env.plugin(mode).await;
        let want = match mode {
            SkipAttachMode::BypassAdc => AttachPath::NotAttached,
            SkipAttachMode::ThroughAdc => AttachPath::NoOpThroughAdc,
        };
        assert_eq!(plugin.attach_path(DRIVER), want, "{mode}");
        assert_eq!(
            plugin.can_attach(DRIVER),
            mode == SkipAttachMode::ThroughAdc,
            "{mode}"
        );
        let attached = plugin
            .attach(&pv_volume("pv-1", "vol-1"), NODE, PATIENCE)
            .await
            .unwrap();
        assert_eq!(attached.volume_attachment, None, "{mode}");
        assert_eq!(attached.device_path, "", "{mode}");
        assert!(attached.attachment_metadata.is_empty(), "{mode}");
        let started = Instant::now();
        let waited = plugin
            .wait_for_attach(DRIVER, "vol-1", NODE, PATIENCE)
            .await
            .unwrap();
        assert_eq!(waited.volume_attachment, None, "{mode}");
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{mode}: no wait"
        );
        assert_eq!(
            plugin.volumes_are_attached(&[(DRIVER.to_string(), "vol-1".to_string())], NODE),
            [true],
            "{mode}"
        );
        // Detach finds no VolumeAttachment: success, nothing deleted.
        assert!(
            !plugin
                .detach(DRIVER, "vol-1", NODE, PATIENCE)
                .await
                .unwrap(),
            "{mode}"
        );
        assert!(
            env.va_requests("create").is_empty(),
            "{mode}: no VolumeAttachment create at all"
        );
        assert_eq!(env.va_requests("delete"), [404], "{mode}");
        assert!(
            env.vas()
                .list(&Default::default())
                .await
                .unwrap()
                .items
                .is_empty()
        );
        assert!(env.mock().calls().is_empty(), "{mode}: no CSI call");
        env.shutdown().await;
    }
}

/// ControllerPublish fails: the attacher records attachError, and the attach fails at once
/// with its message instead of waiting for its timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attach_error_fails_the_attach_fast_with_the_attachers_message() {
    for mode in MODES {
        let mut env = Env::new(CsiDriverObject::AttachRequired(true)).await;
        env.mock().script(
            Method::ControllerPublishVolume,
            "vol-1",
            vec![Step::Fail(tonic::Code::Internal, "the disk is on fire".into()); 100],
        );
        env.start_attacher().await;
        env.create_pv("pv-1", "vol-1").await;
        let plugin = env.plugin(mode).await;
        let started = Instant::now();
        let err = plugin
            .attach(&pv_volume("pv-1", "vol-1"), NODE, PATIENCE)
            .await
            .unwrap_err();
        let took = started.elapsed();
        let name = volume_attachment_name("vol-1", DRIVER, NODE);
        match &err {
            Error::AttachFailed {
                volume_attachment,
                message,
            } => {
                assert_eq!(volume_attachment, &name, "{mode}");
                // The attacher's attachError as it wrote it: Go's gRPC error text.
                assert!(
                    message.starts_with("rpc error: code = ")
                        && message.ends_with("desc = the disk is on fire"),
                    "{mode}: {message}"
                );
                // Shown as is, as Kubernetes' CSI plugin does (it ends up in the pod Event).
                assert_eq!(&err.to_string(), message);
            }
            other => panic!("{mode}: want AttachFailed, got {other:?}"),
        }
        assert!(
            took < PATIENCE / 2,
            "{mode}: failed after {took:?}, not at once"
        );
        // The kubelet's wait reports the same.
        let err = plugin
            .wait_for_attach(DRIVER, "vol-1", NODE, PATIENCE)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::AttachFailed { .. }), "{mode}: {err}");
        assert_eq!(
            plugin.volumes_are_attached(&[(DRIVER.to_string(), "vol-1".to_string())], NODE),
            [false]
        );
        assert_eq!(env.va_creates(), 1, "{mode}");
        env.shutdown().await;
    }
}

/// No CSIDriver and no attacher: the attach makes a VolumeAttachment and waits. The CSIDriver
/// then appears with attachRequired false: the wait ends, attached, though nobody ever
/// attached the VolumeAttachment (it stays until a detach deletes it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_csidriver_without_attach_ends_the_wait() {
    for mode in MODES {
        let env = Env::new(CsiDriverObject::Missing).await;
        env.create_pv("pv-1", "vol-1").await;
        let plugin = env.plugin(mode).await;
        let name = volume_attachment_name("vol-1", DRIVER, NODE);
        let attaching = {
            let plugin = plugin.clone();
            tokio::spawn(async move {
                plugin
                    .attach(&pv_volume("pv-1", "vol-1"), NODE, PATIENCE)
                    .await
            })
        };
        let vas = env.vas();
        eventually("the VolumeAttachment is created", || {
            let vas = vas.clone();
            let name = name.clone();
            async move { vas.get_opt(&name).await.ok().flatten() }
        })
        .await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!attaching.is_finished(), "{mode}: waits for the attacher");

        let created = Instant::now();
        env.create_csidriver(false).await;
        let attached = tokio::time::timeout(PATIENCE, attaching)
            .await
            .expect("the attach ends")
            .unwrap()
            .unwrap();
        assert!(
            created.elapsed() < PATIENCE / 2,
            "{mode}: ended by the CSIDriver, not by the timeout"
        );
        assert_eq!(attached.volume_attachment, None, "{mode}");
        let va = env.get_va(&name).await.expect("the VolumeAttachment stays");
        assert!(!va.status.is_some_and(|s| s.attached), "{mode}");
        assert_eq!(env.va_creates(), 1, "{mode}");
        env.shutdown().await;
    }
}

/// A VolumeAttachment made while the CSIDriver was missing is deleted by the detach even
/// though the CSIDriver now says attachRequired false, and the detach waits until the
/// attacher has detached it and it is gone. No VolumeAttachment: Ok(false).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detach_deletes_a_stale_volume_attachment_whatever_the_csidriver_says() {
    for mode in MODES {
        let mut env = Env::new(CsiDriverObject::Missing).await;
        env.start_attacher().await;
        env.create_pv("pv-1", "vol-1").await;
        let plugin = env.plugin(mode).await;
        let name = volume_attachment_name("vol-1", DRIVER, NODE);
        plugin
            .attach(&pv_volume("pv-1", "vol-1"), NODE, PATIENCE)
            .await
            .unwrap();
        let va = env.get_va(&name).await.unwrap();
        assert!(va.status.is_some_and(|s| s.attached), "{mode}");

        env.create_csidriver(false).await;
        eventually("the plugin sees the CSIDriver", || async {
            (!plugin.attach_path(DRIVER).creates_volume_attachment()).then_some(())
        })
        .await;
        // The volume now counts as attached whatever the VA says; the VA is stale.
        assert_eq!(
            plugin.volumes_are_attached(&[(DRIVER.to_string(), "vol-1".to_string())], NODE),
            [true]
        );

        assert!(
            plugin
                .detach(DRIVER, "vol-1", NODE, PATIENCE)
                .await
                .unwrap(),
            "{mode}"
        );
        assert!(
            env.get_va(&name).await.is_none(),
            "{mode}: gone when detach returns"
        );
        let unpublished = env.mock().calls_of(Method::ControllerUnpublishVolume);
        assert_eq!(unpublished.len(), 1, "{mode}");
        assert_eq!(unpublished[0].volume_id, "vol-1");
        assert_eq!(unpublished[0].node_id, NODE_ID);

        assert!(
            !plugin
                .detach(DRIVER, "vol-1", NODE, PATIENCE)
                .await
                .unwrap(),
            "{mode}"
        );
        assert_eq!(env.va_requests("delete"), [200, 404], "{mode}");
        env.shutdown().await;
    }
}

/// ControllerUnpublish fails: the detach fails with the attacher's detachError, an attach
/// meanwhile is told the VolumeAttachment is being deleted, and a retried detach ends once the
/// attacher succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detach_error_fails_the_detach_with_the_attachers_message() {
    let mut env = Env::new(CsiDriverObject::AttachRequired(true)).await;
    env.mock().script(
        Method::ControllerUnpublishVolume,
        "vol-1",
        vec![Step::Fail(tonic::Code::Internal, "the disk is stuck".into()); 6],
    );
    env.start_attacher().await;
    env.create_pv("pv-1", "vol-1").await;
    let plugin = env.plugin(SkipAttachMode::default()).await;
    let volume = pv_volume("pv-1", "vol-1");
    let name = volume_attachment_name("vol-1", DRIVER, NODE);
    plugin.attach(&volume, NODE, PATIENCE).await.unwrap();

    let err = plugin
        .detach(DRIVER, "vol-1", NODE, PATIENCE)
        .await
        .unwrap_err();
    match &err {
        Error::DetachFailed {
            volume_attachment,
            message,
        } => {
            assert_eq!(volume_attachment, &name);
            assert!(message.contains("the disk is stuck"), "{message}");
        }
        other => panic!("want DetachFailed, got {other:?}"),
    }
    // The attacher keeps retrying (the failures take over a second): an attach now must not
    // reuse the VolumeAttachment on its way out.
    let err = plugin.attach(&volume, NODE, PATIENCE).await.unwrap_err();
    assert!(
        matches!(&err, Error::BeingDeleted { volume_attachment } if *volume_attachment == name),
        "{err}"
    );
    // The attach/detach controller retries the detach until it succeeds.
    eventually("a retried detach succeeds", || async {
        plugin.detach(DRIVER, "vol-1", NODE, PATIENCE).await.ok()
    })
    .await;
    assert!(env.get_va(&name).await.is_none());
    assert_eq!(
        env.mock().calls_of(Method::ControllerUnpublishVolume).len(),
        7,
        "six failures, one success"
    );
    env.shutdown().await;
}

/// A migrated inline volume: the VolumeAttachment carries the translated PV spec.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inline_source_goes_into_inline_volume_spec() {
    let mut env = Env::new(CsiDriverObject::Missing).await;
    env.start_attacher().await;
    let plugin = env.plugin(SkipAttachMode::default()).await;
    let spec = PersistentVolumeSpec {
        access_modes: Some(vec!["ReadWriteOnce".into()]),
        csi: Some(csi_source("vol-inline")),
        ..Default::default()
    };
    let volume = CsiVolume {
        driver: DRIVER.into(),
        volume_handle: "vol-inline".into(),
        source: AttachSource::Inline(Box::new(spec.clone())),
    };
    let attached = plugin.attach(&volume, NODE, PATIENCE).await.unwrap();
    let name = volume_attachment_name("vol-inline", DRIVER, NODE);
    assert_eq!(attached.volume_attachment.as_deref(), Some(name.as_str()));
    let va = env.get_va(&name).await.unwrap();
    assert_eq!(va.spec.source.persistent_volume_name, None);
    assert_eq!(va.spec.source.inline_volume_spec.as_ref(), Some(&spec));
    let publishes = env.mock().calls_of(Method::ControllerPublishVolume);
    assert_eq!(publishes.len(), 1);
    assert_eq!(publishes[0].volume_id, "vol-inline");
    assert_eq!(publishes[0].node_id, NODE_ID);
    assert!(
        plugin
            .detach(DRIVER, "vol-inline", NODE, PATIENCE)
            .await
            .unwrap()
    );
    assert!(env.get_va(&name).await.is_none());
    // No PersistentVolume exists, so none was written.
    let pv_requests = env
        .server
        .audit()
        .iter()
        .filter(|r| r.resource == "persistentvolumes" && r.verb != "list" && r.verb != "watch")
        .count();
    assert_eq!(pv_requests, 0);
    env.shutdown().await;
}

/// No attacher runs for the driver: the attach times out saying what to look at, having
/// written nothing but the one VolumeAttachment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_attacher_the_attach_times_out_saying_so() {
    let env = Env::new(CsiDriverObject::Missing).await;
    env.create_pv("pv-1", "vol-1").await;
    let plugin = env.plugin(SkipAttachMode::default()).await;
    let err = plugin
        .attach(
            &pv_volume("pv-1", "vol-1"),
            NODE,
            Duration::from_millis(300),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err}");
    assert!(err.to_string().contains("csi-attacher"), "{err}");
    let writes: Vec<String> = env
        .server
        .audit()
        .iter()
        .filter(|r| r.resource == "volumeattachments")
        .filter(|r| !matches!(r.verb.as_str(), "get" | "list" | "watch"))
        .map(|r| r.verb.to_string())
        .collect();
    assert_eq!(writes, ["create"]);
    env.shutdown().await;
}

/// A node agent's VolumeAttachments come from a scoped cache, whose copy may be seconds old.
/// A VolumeAttachment that was attached and is now being deleted (its detach is underway and
/// cannot be taken back) must not be mounted on: the wait for attach reads it fresh. `csi-cluster
/// chaos` found a volume detached under a new pod's mount when the stale copy was trusted.
#[tokio::test]
async fn the_wait_for_attach_reads_a_volume_attachment_fresh_from_a_scoped_cache() {
    use component_runtime::{ObjectCache, ScopedPolicy};
    use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};
    use kube::Api;
    use kube::api::PostParams;
    use kube::api::{Patch, PatchParams};
    use tokio_util::sync::CancellationToken;
    use volume_plugins::{CsiPlugin, SkipAttachMode, names::volume_attachment_name};

    let server = apiserver::ApiServer::start(apiserver::Config::default())
        .await
        .expect("api server");
    let client = server.client();
    let (driver, handle, node) = ("ebs.csi.aws.com", "vol-1", "node-1");
    let name = volume_attachment_name(handle, driver, node);
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let va: VolumeAttachment = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "finalizers": ["external-attacher/ebs-csi-aws-com"]},
        "spec": {"attacher": driver, "nodeName": node, "source": {"persistentVolumeName": "pv-1"}}
    }))
    .unwrap();
    vas.create(&PostParams::default(), &va).await.unwrap();
    vas.patch_status(
        &name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"status": {"attached": true}})),
    )
    .await
    .unwrap();

    // Refetched only every 30 s on its own: without a fresh read the copy stays stale.
    let stop = CancellationToken::new();
    let c = client.clone();
    let attachments: ObjectCache<VolumeAttachment> = ObjectCache::spawn_scoped(
        move |_| Api::all(c.clone()),
        ScopedPolicy {
            fast: Duration::from_secs(30),
            slow: Duration::from_secs(30),
            idle: Duration::from_secs(300),
            parallel: 4,
        },
        stop.clone(),
    );
    let csidriver: CSIDriver = serde_json::from_value(serde_json::json!({
        "metadata": {"name": driver}, "spec": {"attachRequired": true}
    }))
    .unwrap();
    let plugin = CsiPlugin::new(
        client.clone(),
        ObjectCache::from_objects([csidriver]),
        attachments.clone(),
        SkipAttachMode::default(),
    );
    let attached = plugin
        .wait_for_attach(driver, handle, node, Duration::from_secs(5))
        .await
        .expect("attached");
    assert_eq!(attached.volume_attachment.as_deref(), Some(name.as_str()));
    assert!(attachments.get(&name).is_some(), "now in the scoped cache");

    // The attach/detach controller deletes it; the attacher's finalizer keeps it while it
    // detaches. The next wait must see that, not the cached attached copy.
    vas.delete(&name, &kube::api::DeleteParams::default())
        .await
        .unwrap();
    let e = plugin
        .wait_for_attach(driver, handle, node, Duration::from_secs(5))
        .await
        .expect_err("a VolumeAttachment being deleted is not attached");
    assert!(e.to_string().contains("being deleted"), "{e}");
    stop.cancel();
}
