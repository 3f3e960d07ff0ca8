//! The registration socket: the `Registration` service the kubelet calls.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tonic::{Request, Response};

use crate::health::{self, HealthServer};
use crate::pluginregistration::registration_server::{Registration, RegistrationServer};
use crate::pluginregistration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use crate::registration_status::Status;
use crate::{CSI_PLUGIN_TYPE, Config, Error, SUPPORTED_VERSIONS};

struct Service {
    info: PluginInfo,
    status: Arc<Status>,
}

#[tonic::async_trait]
impl Registration for Service {
    async fn get_info(
        &self,
        _: Request<InfoRequest>,
    ) -> Result<Response<PluginInfo>, tonic::Status> {
        tracing::info!(driver = %self.info.name, "the kubelet asked for the plugin info");
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, tonic::Status> {
        let status = request.into_inner();
        if status.plugin_registered {
            tracing::info!(driver = %self.info.name, "the kubelet registered the plugin");
            self.status.set(Ok(()));
        } else {
            tracing::error!(
                driver = %self.info.name,
                error = %status.error,
                "the kubelet did not register the plugin; stopping"
            );
            self.status.set(Err(status.error));
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

/// A registrar serving its socket; [`Running::wait`] runs it to the end.
pub struct Running {
    driver: String,
    socket_path: PathBuf,
    status: Arc<Status>,
    server: tokio::task::JoinHandle<Result<(), csi_spec::Error>>,
    stop: CancellationToken,
    health: Option<HealthServer>,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running")
            .field("driver", &self.driver)
            .field("socket_path", &self.socket_path)
            .field("http_addr", &self.http_addr())
            .finish_non_exhaustive()
    }
}

pub(crate) async fn start(config: &Config, driver: String) -> Result<Running, Error> {
    let socket_path = crate::registration_socket_path(&config.plugin_registration_path, &driver);
    remove_old(&socket_path)?;
    let endpoint = socket_path.display().to_string();
    let socket = csi_spec::UnixSocket::bind(&endpoint).map_err(|source| Error::Socket {
        path: socket_path.clone(),
        source,
    })?;
    let status = Arc::new(Status::default());
    let health = match config.http_endpoint_addr() {
        Some(addr) => Some(health::serve(addr, socket_path.clone(), Arc::clone(&status)).await?),
        None => None,
    };
    let service = Service {
        info: PluginInfo {
            r#type: CSI_PLUGIN_TYPE.to_owned(),
            name: driver.clone(),
            endpoint: config.kubelet_registration_path.clone(),
            supported_versions: SUPPORTED_VERSIONS.iter().map(|v| (*v).to_owned()).collect(),
        },
        status: Arc::clone(&status),
    };
    let router = tonic::transport::Server::builder().add_service(RegistrationServer::new(service));
    let stop = CancellationToken::new();
    let stopped = stop.clone();
    let failed = status.failed.clone();
    let server = tokio::spawn(socket.serve(router, async move {
        tokio::select! {
            () = stopped.cancelled() => {}
            () = failed.cancelled() => {}
        }
    }));
    tracing::info!(
        driver = %driver,
        socket = %socket_path.display(),
        endpoint = %config.kubelet_registration_path,
        "registration socket ready for the kubelet"
    );
    Ok(Running {
        driver,
        socket_path,
        status,
        server,
        stop,
        health,
    })
}

/// The Go sidecar removes whatever a previous run left at the socket path; so do we (a
/// directory is left alone and makes the bind fail with its path).
fn remove_old(path: &Path) -> Result<(), Error> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if !meta.is_dir() => {
            std::fs::remove_file(path).map_err(|source| Error::RemoveStale {
                path: path.to_path_buf(),
                source,
            })?;
            tracing::info!(path = %path.display(), "removed the old registration socket");
            Ok(())
        }
        _ => Ok(()),
    }
}

impl Running {
    /// The driver name the kubelet is told.
    pub fn driver(&self) -> &str {
        &self.driver
    }

    /// `<plugin-registration-path>/<driver>-reg.sock`.
    pub fn socket_path(&self) -> &Path {
        &self.socket_path
    }

    /// The bound `/healthz` address (the real port when `:0` was asked for).
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.health.as_ref().map(|h| h.local_addr)
    }

    /// Serves until `shutdown` (then `Ok`) or until the kubelet reports a failed registration
    /// (then [`Error::RegistrationFailed`]); the registration socket is removed either way.
    pub async fn wait(mut self, shutdown: CancellationToken) -> Result<(), Error> {
        let failed = self.status.failed.clone();
        tokio::select! {
            () = shutdown.cancelled() => {}
            () = failed.cancelled() => {}
        }
        self.stop.cancel();
        let served = (&mut self.server).await;
        if let Some(health) = self.health.take() {
            health.stop.cancel();
            let _ = health.task.await;
        }
        match served {
            Ok(Ok(())) => {}
            Ok(Err(source)) => {
                return Err(Error::Socket {
                    path: self.socket_path.clone(),
                    source,
                });
            }
            Err(join) => {
                tracing::error!(error = %join, "the registration server task failed");
            }
        }
        tracing::info!(socket = %self.socket_path.display(), "registration socket removed");
        match self.status.get() {
            Some(Err(error)) => Err(Error::RegistrationFailed {
                driver: self.driver.clone(),
                error,
            }),
            _ => Ok(()),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(health) = &self.health {
            health.stop.cancel();
        }
    }
}
