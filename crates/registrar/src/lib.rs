//! `csi-node-driver-registrar`: tells the kubelet that a CSI driver runs on this node.
//!
//! The kubelet watches its plugin registry directory (`/var/lib/kubelet/plugins_registry`,
//! mounted into the registrar as `--plugin-registration-path`) for sockets. For each it calls
//! [`pluginregistration`]'s `GetInfo` to learn the plugin's type, name and endpoint, then
//! `NotifyRegistrationStatus` with the outcome. The registrar learns the driver name from the
//! driver's `GetPluginInfo`, serves that API on `<plugin-registration-path>/<driver>-reg.sock`
//! and removes the socket when it stops. See `docs/registrar.md`.

mod flags;
mod health;
mod registration_status;
mod server;

use std::path::{Path, PathBuf};
use std::time::Duration;

use csi_spec::v1::GetPluginInfoRequest;
use csi_spec::v1::identity_client::IdentityClient;
use tokio_util::sync::CancellationToken;

pub use flags::{Config, Mode};
pub use server::Running;

/// The kubelet plugin registration API, generated from our `proto/pluginregistration.proto`
/// (package `pluginregistration`, so gRPC paths are `/pluginregistration.Registration/<Method>`).
pub mod pluginregistration {
    #![allow(missing_docs, clippy::all)]
    tonic::include_proto!("pluginregistration");
}

/// `PluginInfo.type` of a CSI driver, as the kubelet expects it.
pub const CSI_PLUGIN_TYPE: &str = "CSIPlugin";
/// The CSI versions the kubelet is told the driver speaks.
pub const SUPPORTED_VERSIONS: &[&str] = &["1.0.0"];

/// How long the registrar waits for the driver's socket: as the Go sidecar, it keeps trying
/// (a day stands for "until stopped"; SIGTERM ends the wait at any time).
const CONNECT_WAIT: Duration = Duration::from_secs(24 * 60 * 60);

/// Errors of the registrar.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The driver socket could not be dialled.
    #[error("connecting to the CSI driver: {0}")]
    Connect(#[source] component_runtime::Error),
    /// GetPluginInfo failed.
    #[error("GetPluginInfo on the CSI driver at {address:?} failed: {status}")]
    PluginInfo {
        address: String,
        #[source]
        status: Box<tonic::Status>,
    },
    /// GetPluginInfo answered without a name.
    #[error(
        "GetPluginInfo on the CSI driver at {address:?} returned an empty name (the spec requires one)"
    )]
    EmptyName { address: String },
    /// `--kubelet-registration-path` is empty.
    #[error(
        "--kubelet-registration-path is required: the driver socket's path as the kubelet sees it"
    )]
    NoKubeletRegistrationPath,
    /// The registration socket could not be created or served.
    #[error("registration socket {path}: {source}")]
    Socket {
        path: PathBuf,
        #[source]
        source: csi_spec::Error,
    },
    /// A stale registration socket could not be removed.
    #[error("removing the old registration socket {path}: {source}")]
    RemoveStale {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The health server could not start.
    #[error("--http-endpoint {addr:?}: {reason}")]
    Http { addr: String, reason: String },
    /// The kubelet reported that registration failed (the Go sidecar exits then too; the
    /// kubelet restarts the container and tries again).
    #[error("the kubelet did not register plugin {driver:?}: {error}")]
    RegistrationFailed { driver: String, error: String },
    /// `--mode=kubelet-registration-probe`: the registration socket is not there.
    #[error(
        "registration socket {path} does not exist: the driver is not registered with the kubelet"
    )]
    NotRegistered { path: PathBuf },
}

/// `<plugin-registration-path>/<driver>-reg.sock`, where the kubelet looks for the driver.
pub fn registration_socket_path(dir: &Path, driver: &str) -> PathBuf {
    dir.join(format!("{driver}-reg.sock"))
}

/// Dials the driver (waiting up to `wait` for its socket) and returns GetPluginInfo's name;
/// the call itself gets `call_timeout`.
pub async fn driver_name(
    address: &str,
    wait: Duration,
    call_timeout: Duration,
) -> Result<String, Error> {
    let channel = component_runtime::connect(address, wait)
        .await
        .map_err(Error::Connect)?;
    let mut request = tonic::Request::new(GetPluginInfoRequest {});
    request.set_timeout(call_timeout);
    let status = |status| Error::PluginInfo {
        address: address.to_owned(),
        status: Box::new(status),
    };
    let info = tokio::time::timeout(
        call_timeout,
        IdentityClient::new(channel).get_plugin_info(request),
    )
    .await
    .map_err(|_| {
        status(tonic::Status::deadline_exceeded(format!(
            "no answer within --timeout {call_timeout:?}"
        )))
    })?
    .map_err(status)?
    .into_inner();
    if info.name.is_empty() {
        return Err(Error::EmptyName {
            address: address.to_owned(),
        });
    }
    Ok(info.name)
}

/// The binary's work: in `registration` mode, register the driver and serve until `shutdown`
/// (or until the kubelet reports a failed registration, which is an error); in
/// `kubelet-registration-probe` mode, check that the registration socket exists.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<(), Error> {
    match config.mode {
        Mode::KubeletRegistrationProbe => probe(&config).await,
        Mode::Registration => {
            let driver = tokio::select! {
                name = driver_name(&config.csi_address, CONNECT_WAIT, config.timeout) => name?,
                () = shutdown.cancelled() => return Ok(()),
            };
            start(&config, driver).await?.wait(shutdown).await
        }
    }
}

/// Creates the registration socket for `driver` and serves the registration API (and
/// `--http-endpoint`'s `/healthz`). The socket accepts connections when this returns.
pub async fn start(config: &Config, driver: String) -> Result<Running, Error> {
    if config.kubelet_registration_path.is_empty() {
        return Err(Error::NoKubeletRegistrationPath);
    }
    server::start(config, driver).await
}

/// `--mode=kubelet-registration-probe`: asks the driver for its name (within `--timeout`)
/// and succeeds if `<plugin-registration-path>/<driver>-reg.sock` is a socket.
pub async fn probe(config: &Config) -> Result<(), Error> {
    let driver = driver_name(&config.csi_address, config.timeout, config.timeout).await?;
    let path = registration_socket_path(&config.plugin_registration_path, &driver);
    if is_socket(&path) {
        Ok(())
    } else {
        Err(Error::NotRegistered { path })
    }
}

fn is_socket(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket())
}
