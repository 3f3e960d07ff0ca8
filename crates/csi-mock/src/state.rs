//! What the mock remembers: the call log, the scripted steps, and which volume is published
//! where. One mutex guards it all; no lock is held across an await.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use csi_spec::v1::VolumeCapability;
use tokio_util::sync::CancellationToken;
use tonic::{Code, Status};

use crate::MockConfig;

/// The RPCs the mock serves (every other Controller RPC answers `UNIMPLEMENTED` and is not
/// recorded).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Method {
    Probe,
    GetPluginInfo,
    GetPluginCapabilities,
    ControllerGetCapabilities,
    ControllerPublishVolume,
    ControllerUnpublishVolume,
    ListVolumes,
    CreateVolume,
    DeleteVolume,
}

impl Method {
    /// The gRPC method name, as in `/csi.v1.Controller/ControllerPublishVolume`.
    pub fn grpc_name(self) -> &'static str {
        match self {
            Method::Probe => "Probe",
            Method::GetPluginInfo => "GetPluginInfo",
            Method::GetPluginCapabilities => "GetPluginCapabilities",
            Method::ControllerGetCapabilities => "ControllerGetCapabilities",
            Method::ControllerPublishVolume => "ControllerPublishVolume",
            Method::ControllerUnpublishVolume => "ControllerUnpublishVolume",
            Method::ListVolumes => "ListVolumes",
            Method::CreateVolume => "CreateVolume",
            Method::DeleteVolume => "DeleteVolume",
        }
    }
}

/// One RPC the mock received.
///
/// `code` is what the mock answered. While the RPC is still in flight (a [`Step::Delay`], a
/// [`Step::Hang`], the configured delay) it reads `Code::Unknown`; a call the caller abandoned
/// (deadline passed, request cancelled) reads `Code::Cancelled`. Fields a method does not carry
/// are empty (`volume_id` of `Probe`, `capability` of `ControllerUnpublishVolume`, ...).
/// `CreateVolume` records the request's `name` as `volume_id` (scripts match on it) and the
/// whole request in `create_request`.
#[derive(Debug, Clone)]
pub struct Call {
    pub method: Method,
    pub volume_id: String,
    pub node_id: String,
    pub readonly: bool,
    pub capability: Option<VolumeCapability>,
    pub secrets: BTreeMap<String, String>,
    pub volume_context: BTreeMap<String, String>,
    /// The whole request of a `CreateVolume` call.
    pub create_request: Option<csi_spec::v1::CreateVolumeRequest>,
    /// When the request arrived.
    pub at: Instant,
    pub code: Code,
}

impl Call {
    /// A call with only the method set, arriving now.
    pub(crate) fn new(method: Method) -> Self {
        Self {
            method,
            volume_id: String::new(),
            node_id: String::new(),
            readonly: false,
            capability: None,
            secrets: BTreeMap::new(),
            volume_context: BTreeMap::new(),
            create_request: None,
            at: Instant::now(),
            code: Code::Unknown,
        }
    }
}

/// A scripted answer for one call. Each matching call consumes one step; when the steps run out
/// the mock goes back to its default behaviour.
#[derive(Debug, Clone)]
pub enum Step {
    /// Answer this gRPC status.
    Fail(Code, String),
    /// Wait, then behave as usual.
    Delay(Duration),
    /// Never answer: the call ends only when the caller's deadline passes (tonic's server then
    /// answers `CANCELLED` "Timeout expired"; a Go client reports `DEADLINE_EXCEEDED`), when the
    /// caller cancels, or when the mock shuts down (`UNAVAILABLE`).
    Hang,
}

/// Scripts registered for this volume ID match calls of any volume (and calls without one)
/// when no volume-specific step is queued.
pub const ANY_VOLUME: &str = "*";

/// What one node's publication of a volume looked like, to answer a repeat idempotently and
/// refuse an incompatible one. `None` capability: set by `set_published` (drift), compatible
/// with anything.
#[derive(Debug, Clone)]
pub(crate) struct Publication {
    pub(crate) readonly: bool,
    pub(crate) capability: Option<VolumeCapability>,
}

#[derive(Debug, Default)]
pub(crate) struct Inner {
    pub(crate) calls: Vec<Call>,
    scripts: HashMap<(Method, String), VecDeque<Step>>,
    /// Every volume the mock has heard of (published once, or named by `set_published`),
    /// mapped to the nodes it is published on. Volumes are never forgotten, so a ListVolumes
    /// token (a volume ID) stays valid.
    pub(crate) volumes: BTreeMap<String, BTreeMap<String, Publication>>,
    /// Volumes made by CreateVolume and not deleted yet, by request name.
    pub(crate) created: BTreeMap<String, CreatedVolume>,
}

/// A volume CreateVolume made: answered again for a repeat of the same name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreatedVolume {
    pub volume_id: String,
    pub capacity_bytes: i64,
    pub accessible_topology: Vec<BTreeMap<String, String>>,
}

/// State shared by the gRPC services and the [`crate::MockDriver`] handle.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) config: MockConfig,
    inner: Mutex<Inner>,
    /// Cancelled on shutdown: ends hanging and delayed calls so the server can stop.
    pub(crate) stop: CancellationToken,
}

impl Shared {
    pub(crate) fn new(config: MockConfig) -> Arc<Self> {
        Arc::new(Self {
            config,
            inner: Mutex::new(Inner::default()),
            stop: CancellationToken::new(),
        })
    }

    /// The state; a panic while holding the lock (a test assertion elsewhere) does not make the
    /// data unusable, so poisoning is ignored.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn script(&self, method: Method, volume_id: &str, steps: Vec<Step>) {
        self.lock()
            .scripts
            .entry((method, volume_id.to_owned()))
            .or_default()
            .extend(steps);
    }

    fn next_step(&self, method: Method, volume_id: &str) -> Option<Step> {
        let mut inner = self.lock();
        for key in [volume_id, ANY_VOLUME] {
            if let Some(step) = inner
                .scripts
                .get_mut(&(method, key.to_owned()))
                .and_then(VecDeque::pop_front)
            {
                return Some(step);
            }
        }
        None
    }

    /// Records the call and returns a guard that fills in its answer code.
    pub(crate) fn record(self: &Arc<Self>, call: Call) -> CallGuard {
        let mut inner = self.lock();
        inner.calls.push(call);
        CallGuard {
            shared: Arc::clone(self),
            index: inner.calls.len() - 1,
            done: false,
        }
    }

    /// Plays the next scripted step for this call, if any. `Ok` means: go on with the default
    /// behaviour.
    pub(crate) async fn play_script(&self, method: Method, volume_id: &str) -> Result<(), Status> {
        match self.next_step(method, volume_id) {
            None => Ok(()),
            Some(Step::Fail(code, message)) => Err(Status::new(code, message)),
            Some(Step::Delay(d)) => self.sleep(d).await,
            Some(Step::Hang) => {
                self.stop.cancelled().await;
                Err(shutting_down())
            }
        }
    }

    /// Sleeps, unless the mock shuts down first.
    pub(crate) async fn sleep(&self, d: Duration) -> Result<(), Status> {
        if d.is_zero() {
            return Ok(());
        }
        tokio::select! {
            () = tokio::time::sleep(d) => Ok(()),
            () = self.stop.cancelled() => Err(shutting_down()),
        }
    }
}

fn shutting_down() -> Status {
    Status::unavailable("mock CSI driver is shutting down")
}

/// Sets the recorded call's code when the answer is known; a call dropped before that (the
/// caller gave up, tonic's deadline fired) is recorded as `CANCELLED`.
pub(crate) struct CallGuard {
    shared: Arc<Shared>,
    index: usize,
    done: bool,
}

impl CallGuard {
    pub(crate) fn finish<T>(mut self, result: Result<T, Status>) -> Result<T, Status> {
        let code = match &result {
            Ok(_) => Code::Ok,
            Err(s) => s.code(),
        };
        self.set(code);
        self.done = true;
        result
    }

    fn set(&self, code: Code) {
        if let Some(call) = self.shared.lock().calls.get_mut(self.index) {
            call.code = code;
        }
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        if !self.done {
            self.set(Code::Cancelled);
        }
    }
}

/// Volume → nodes, leaving out volumes published nowhere.
pub(crate) fn published(inner: &Inner) -> BTreeMap<String, BTreeSet<String>> {
    inner
        .volumes
        .iter()
        .filter(|(_, nodes)| !nodes.is_empty())
        .map(|(v, nodes)| (v.clone(), nodes.keys().cloned().collect()))
        .collect()
}
