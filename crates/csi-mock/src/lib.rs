//! A scriptable CSI driver on a real unix socket, for testing and loading CSI sidecars.
//!
//! It serves the Identity service and the Controller RPCs an attacher uses
//! (ControllerGetCapabilities, ControllerPublishVolume, ControllerUnpublishVolume, ListVolumes);
//! every other Controller RPC answers `UNIMPLEMENTED`. Default behaviour follows the CSI spec:
//!
//! - **Publish** validates `volume_id`, `node_id` and `volume_capability` (access mode and access
//!   type), answering `INVALID_ARGUMENT` with a message that starts with the field name; refuses
//!   `readonly` without PUBLISH_READONLY; records the (volume, node) pair and answers
//!   `publish_context {"devicePath": "/dev/mock/<volume_id>"}`. A repeat on the same node
//!   answers the same (idempotent); a different readonly flag or capability there is
//!   `ALREADY_EXISTS`; a second node for a single-node access mode is `FAILED_PRECONDITION`.
//! - **Unpublish** removes the pair (an empty `node_id` removes every node); unknown volumes
//!   and nodes succeed (idempotent).
//! - **ListVolumes** pages through every volume the mock has seen (published once or named by
//!   [`MockDriver::set_published`]) in volume ID order with `published_node_ids` in `status`;
//!   `max_entries` 0 means all; a token not handed out is `ABORTED`.
//! - **CreateVolume** (with [`MockConfig::create_delete_volume`]) validates `name` and
//!   `volume_capabilities`, answers volume ID `<volume_id_prefix><name>` with capacity
//!   `required_bytes` (else `limit_bytes`, else 1 GiB); a repeat of a name answers the same
//!   volume, or `ALREADY_EXISTS` when the capacity range no longer fits it. **DeleteVolume**
//!   forgets the volume; an unknown ID succeeds (idempotent).
//! - The capabilities come from [`MockConfig`]; a turned-off capability's RPCs answer
//!   `UNIMPLEMENTED`.
//!
//! Tests script failures per method and volume with [`MockDriver::script`] and read every call
//! with [`MockDriver::calls`].
//!
//! ```no_run
//! # async fn demo() -> Result<(), csi_mock::Error> {
//! use csi_mock::{Method, MockConfig, Step};
//! let dir = tempfile::tempdir().map_err(|e| csi_mock::Error::Io { op: "tempdir", source: e })?;
//! let driver = csi_mock::start(dir.path(), MockConfig::default()).await?;
//! driver.script(
//!     Method::ControllerPublishVolume,
//!     "vol-1",
//!     vec![Step::Fail(tonic::Code::Unavailable, "try again".into()), Step::Hang],
//! );
//! // ... point the sidecar at driver.endpoint() ...
//! driver.shutdown().await;
//! # Ok(())
//! # }
//! ```

mod service;
mod state;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use csi_spec::v1::controller_server::ControllerServer;
use csi_spec::v1::identity_server::IdentityServer;
use tokio::task::JoinHandle;

pub use service::DEVICE_PATH_KEY;
pub use state::{ANY_VOLUME, Call, CreatedVolume, Method, Step};

use crate::service::MockService;
use crate::state::{Publication, Shared};

/// How long [`MockDriver::shutdown`] waits for open connections to finish before it stops the
/// server the hard way.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Errors starting the mock.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Binding the socket failed (bad endpoint, in use, not a socket, ...).
    #[error(transparent)]
    Socket(#[from] csi_spec::Error),
    /// A filesystem call failed.
    #[error("{op}: {source}")]
    Io {
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// What the mock advertises and how fast it answers.
#[derive(Debug, Clone)]
pub struct MockConfig {
    /// The driver name GetPluginInfo answers.
    pub name: String,
    /// PUBLISH_UNPUBLISH_VOLUME; off → Publish/Unpublish answer UNIMPLEMENTED.
    pub publish_unpublish: bool,
    /// PUBLISH_READONLY; off → a readonly Publish is INVALID_ARGUMENT.
    pub publish_readonly: bool,
    /// LIST_VOLUMES + LIST_VOLUMES_PUBLISHED_NODES; off → ListVolumes answers UNIMPLEMENTED.
    pub list_published_nodes: bool,
    /// The CONTROLLER_SERVICE plugin capability; off → every Controller RPC answers
    /// UNIMPLEMENTED.
    pub controller_service: bool,
    /// Added to every Publish and Unpublish (after any scripted step).
    pub delay: Duration,
    /// CREATE_DELETE_VOLUME (off by default: the attacher's mock has none); off →
    /// CreateVolume/DeleteVolume answer UNIMPLEMENTED.
    pub create_delete_volume: bool,
    /// CLONE_VOLUME (a PVC data source).
    pub clone_volume: bool,
    /// The VOLUME_ACCESSIBILITY_CONSTRAINTS plugin capability: CreateVolume then answers the
    /// first preferred (else requisite) topology segment as the volume's accessible topology.
    pub accessibility_constraints: bool,
    /// Prepended to the request name to make the volume ID (`vol-` gives EBS-like IDs).
    pub volume_id_prefix: String,
}

impl Default for MockConfig {
    fn default() -> Self {
        Self {
            name: "mock.csi.rs".to_owned(),
            publish_unpublish: true,
            publish_readonly: true,
            list_published_nodes: true,
            controller_service: true,
            delay: Duration::ZERO,
            create_delete_volume: false,
            clone_volume: false,
            accessibility_constraints: false,
            volume_id_prefix: String::new(),
        }
    }
}

/// Starts the mock on `dir/csi.sock`. The socket accepts connections when this returns.
pub async fn start(dir: &Path, config: MockConfig) -> Result<MockDriver, Error> {
    let endpoint = format!("unix://{}", dir.join("csi.sock").display());
    start_at(&endpoint, config).await
}

/// Starts the mock on any endpoint (`unix:///path` or a plain path).
pub async fn start_at(endpoint: &str, config: MockConfig) -> Result<MockDriver, Error> {
    let socket = csi_spec::UnixSocket::bind(endpoint)?;
    let socket_path = socket.path().to_path_buf();
    let shared = Shared::new(config);
    let svc = MockService {
        shared: Arc::clone(&shared),
    };
    let router = tonic::transport::Server::builder()
        .add_service(IdentityServer::new(svc.clone()))
        .add_service(ControllerServer::new(svc));
    let stop = shared.stop.clone();
    let server = tokio::spawn(async move {
        let result = socket
            .serve(router, async move { stop.cancelled().await })
            .await;
        if let Err(e) = &result {
            tracing::error!(error = %e, "mock CSI server failed");
        }
        result
    });
    tracing::info!(
        endpoint = %format!("unix://{}", socket_path.display()),
        name = %shared.config.name,
        "mock CSI driver listening"
    );
    Ok(MockDriver {
        shared,
        socket_path,
        server: Some(server),
    })
}

/// A running mock. Dropping it stops the server too (without waiting); prefer
/// [`MockDriver::shutdown`].
#[derive(Debug)]
pub struct MockDriver {
    shared: Arc<Shared>,
    socket_path: PathBuf,
    server: Option<JoinHandle<Result<(), csi_spec::Error>>>,
}

impl MockDriver {
    /// The socket file.
    pub fn socket_path(&self) -> &Path {
        &self.socket_path
    }

    /// `unix:///…/csi.sock`.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket_path.display())
    }

    /// The configuration it was started with.
    pub fn config(&self) -> &MockConfig {
        &self.shared.config
    }

    /// Every recorded RPC, in arrival order.
    pub fn calls(&self) -> Vec<Call> {
        self.shared.lock().calls.clone()
    }

    /// The recorded RPCs of one method, in arrival order.
    pub fn calls_of(&self, method: Method) -> Vec<Call> {
        self.shared
            .lock()
            .calls
            .iter()
            .filter(|c| c.method == method)
            .cloned()
            .collect()
    }

    /// Forgets the recorded calls (not the scripts or the published volumes).
    pub fn clear_calls(&self) {
        self.shared.lock().calls.clear();
    }

    /// Queues steps for calls of `method` on `volume_id`; each call consumes one, in order,
    /// then the default behaviour resumes. Methods without a volume (Probe, GetPluginInfo,
    /// ListVolumes, ...) use `""`. [`ANY_VOLUME`] (`"*"`) matches every call of the method
    /// when no step for its own volume is queued. Calling again appends.
    pub fn script(&self, method: Method, volume_id: &str, steps: Vec<Step>) {
        self.shared.script(method, volume_id, steps);
    }

    /// Volume → the nodes it is published on (volumes published nowhere are left out).
    pub fn published(&self) -> BTreeMap<String, BTreeSet<String>> {
        state::published(&self.shared.lock())
    }

    /// Overwrites where a volume is published, as if the storage backend changed behind the
    /// CO's back. The nodes accept any later Publish (the capability is unknown), and the
    /// volume shows up in ListVolumes from now on.
    pub fn set_published(&self, volume_id: &str, nodes: &[&str]) {
        let publications = nodes
            .iter()
            .map(|n| {
                (
                    (*n).to_owned(),
                    Publication {
                        readonly: false,
                        capability: None,
                    },
                )
            })
            .collect();
        self.shared
            .lock()
            .volumes
            .insert(volume_id.to_owned(), publications);
    }

    /// Volumes CreateVolume made and DeleteVolume did not remove yet, by request name.
    pub fn created_volumes(&self) -> BTreeMap<String, CreatedVolume> {
        self.shared.lock().created.clone()
    }

    /// Stops serving (hanging and delayed calls answer UNAVAILABLE) and removes the socket.
    pub async fn shutdown(mut self) {
        self.shared.stop.cancel();
        if let Some(mut server) = self.server.take() {
            // Open client connections get a GOAWAY; one that never closes must not block us.
            if tokio::time::timeout(SHUTDOWN_GRACE, &mut server)
                .await
                .is_err()
            {
                tracing::warn!("mock CSI server did not stop in time; aborting it");
                server.abort();
                let _ = server.await;
            }
        }
        remove_socket(&self.socket_path);
    }
}

impl Drop for MockDriver {
    fn drop(&mut self) {
        // The serve task removes the socket when it ends.
        self.shared.stop.cancel();
    }
}

fn remove_socket(path: &Path) {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(path = %path.display(), error = %e, "could not remove socket"),
    }
}
