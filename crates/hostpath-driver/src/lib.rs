//! hostpath-csi-driver: a node-local CSI driver with no attach step (the case Kubernetes'
//! skip-attach design is about: its CSIDriver says `attachRequired: false`). With
//! `--enable-attach` it offers ControllerPublish, which only checks the node, for a CSIDriver
//! with `attachRequired: true`.
//!
//! A mount volume is a directory `<state-dir>/volumes/<id>/`, a block volume a sparse file
//! `<state-dir>/volumes/<id>.img` that a loop device exposes while the volume is staged or
//! published. What the driver knows (volumes, snapshots, stage and publish records) lives in
//! `<state-dir>/state.json`, written atomically, so a restarted driver (even after SIGKILL)
//! carries on; mounts and loop devices are checked against the kernel before they are trusted.
//!
//! - `identity`: csi.v1.Identity; `controller`: CreateVolume/DeleteVolume, lists, capacity;
//!   `snapshots`: CreateSnapshot/DeleteSnapshot; `expand`: online expansion (controller and
//!   node); `node`: stage, publish, stats, ephemeral inline volumes;
//! - `state`: the state file; `backing`: the volume and snapshot files on disk; `loopdev`:
//!   loop devices found through sysfs before one is attached; `mounts`: whose mount a path is;
//!   `validate`: request checks shared by the services; `locks`: one operation per volume at a
//!   time.
//!
//! [`serve`] runs the three services on a bound [`csi_spec::UnixSocket`]; [`run`] binds
//! [`Config::endpoint`] first. See `docs/hostpath-driver.md`.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use csi_spec::UnixSocket;
use csi_spec::v1::controller_server::ControllerServer;
use csi_spec::v1::identity_server::IdentityServer;
use csi_spec::v1::node_server::NodeServer;
use tonic::transport::Server;

mod backing;
mod config;
mod controller;
mod driver;
mod expand;
pub mod flags;
mod identity;
mod locks;
mod loopdev;
mod mounts;
mod node;
mod publish;
mod snapshots;
mod state;
mod validate;

pub use config::{
    Config, DEFAULT_CAPACITY, DEFAULT_DRIVER_NAME, DEFAULT_VOLUME_SIZE, EPHEMERAL_CONTEXT_KEY,
    TOPOLOGY_KEY, parse_quantity,
};

/// What can go wrong in the driver. Each variant maps to one CSI code (see [`Error::code`]);
/// messages name the field, volume or path and say what was expected.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request field is missing or malformed: `volume_id is required`.
    #[error("{field} {reason}")]
    InvalidArgument { field: String, reason: String },

    /// The volume, snapshot or path a request names does not exist.
    #[error("{kind} {id} does not exist")]
    NotFound { kind: &'static str, id: String },

    /// ControllerPublishVolume to a node the volume is not on (a hostpath volume is reachable
    /// from its own node only).
    #[error(
        "node {node} does not exist for volume {volume}: a hostpath volume can be published only to its own node, {home}"
    )]
    NodeNotFound {
        node: String,
        volume: String,
        home: String,
    },

    /// The name is taken with other parameters, or a path is staged/published differently.
    #[error("{0}")]
    AlreadyExists(String),

    /// No room: capacity used up, or a topology this node is not part of.
    #[error("{0}")]
    ResourceExhausted(String),

    /// A capacity range the driver cannot satisfy at all.
    #[error("capacity_range: {0}")]
    OutOfRange(String),

    /// The volume is not in the state the call needs (in use on delete, ...).
    #[error("{0}")]
    FailedPrecondition(String),

    /// A pagination token the driver did not hand out.
    #[error("starting_token {0:?} is not valid (it must come from an earlier answer)")]
    BadToken(String),

    /// A call the driver was configured not to serve (stage with `--stage-unstage=false`).
    #[error("{0}")]
    Unimplemented(String),

    /// The configuration cannot work (missing node ID, ...).
    #[error("configuration: {0}")]
    Config(String),

    /// The state file cannot be read or understood.
    #[error("state file {path}: {reason}")]
    State { path: PathBuf, reason: String },

    /// A filesystem operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// mount, umount, losetup, mountinfo or statvfs failed.
    #[error(transparent)]
    Mount(#[from] mount_utils::Error),

    /// The CSI endpoint could not be bound or served.
    #[error(transparent)]
    Endpoint(#[from] csi_spec::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            op,
            path: path.into(),
            source,
        }
    }

    pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::InvalidArgument {
            field: field.into(),
            reason: reason.into(),
        }
    }

    pub(crate) fn required(field: &str) -> Self {
        Self::invalid(field, "is required")
    }

    pub(crate) fn volume_not_found(id: &str) -> Self {
        Self::NotFound {
            kind: "volume",
            id: id.to_string(),
        }
    }

    /// The CSI status code for this error.
    pub fn code(&self) -> tonic::Code {
        use tonic::Code;
        match self {
            Error::InvalidArgument { .. } | Error::Config(_) => Code::InvalidArgument,
            Error::NotFound { .. } | Error::NodeNotFound { .. } => Code::NotFound,
            Error::AlreadyExists(_) => Code::AlreadyExists,
            Error::ResourceExhausted(_) => Code::ResourceExhausted,
            Error::OutOfRange(_) => Code::OutOfRange,
            Error::FailedPrecondition(_) => Code::FailedPrecondition,
            // CSI: ListVolumes/ListSnapshots with a token the plugin did not hand out.
            Error::BadToken(_) => Code::Aborted,
            Error::Unimplemented(_) => Code::Unimplemented,
            Error::State { .. } | Error::Io { .. } | Error::Mount(_) | Error::Endpoint(_) => {
                Code::Internal
            }
        }
    }
}

impl From<Error> for tonic::Status {
    fn from(e: Error) -> Self {
        tonic::Status::new(e.code(), e.to_string())
    }
}

/// Binds [`Config::endpoint`], then serves until `shutdown` resolves; the socket file is
/// removed on the way out. A bad configuration or an unreadable state file fails before the
/// socket exists.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> Result<()> {
    let driver = driver::Driver::open(config).await?;
    let socket = UnixSocket::bind(&driver.config.endpoint)?;
    serve_driver(socket, driver, shutdown).await
}

/// Serves Identity, Controller and Node on an already bound socket until `shutdown` resolves
/// (tests and in-process users bind first, so they know when the socket is ready). The socket
/// file is removed on the way out.
pub async fn serve(
    socket: UnixSocket,
    config: Config,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    let driver = driver::Driver::open(config).await?;
    serve_driver(socket, driver, shutdown).await
}

async fn serve_driver(
    socket: UnixSocket,
    driver: Arc<driver::Driver>,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    tracing::info!(
        driver = %driver.config.driver_name,
        node_id = %driver.config.node_id,
        state_dir = %driver.config.state_dir.display(),
        endpoint = %socket.path().display(),
        "starting"
    );
    let router = Server::builder()
        .add_service(IdentityServer::new(identity::IdentitySvc::new(Arc::clone(
            &driver,
        ))))
        .add_service(ControllerServer::new(controller::ControllerSvc::new(
            Arc::clone(&driver),
        )))
        .add_service(NodeServer::new(node::NodeSvc::new(driver)));
    socket.serve(router, shutdown).await?;
    tracing::info!("stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use tonic::Code;

    #[test]
    fn errors_map_to_csi_codes_and_name_the_field() {
        let e = Error::required("volume_id");
        assert_eq!(e.to_string(), "volume_id is required");
        let s = tonic::Status::from(e);
        assert_eq!(s.code(), Code::InvalidArgument);
        assert_eq!(s.message(), "volume_id is required");
        assert_eq!(Error::volume_not_found("v1").code(), Code::NotFound);
        assert_eq!(
            Error::volume_not_found("v1").to_string(),
            "volume v1 does not exist"
        );
        assert_eq!(Error::BadToken("x".into()).code(), Code::Aborted);
        assert_eq!(Error::OutOfRange("too big".into()).code(), Code::OutOfRange);
        assert_eq!(
            Error::ResourceExhausted("full".into()).code(),
            Code::ResourceExhausted
        );
    }
}
