//! Serving and dialing CSI over a unix socket.
//!
//! kubelet and the CSI sidecars reach a driver through a socket file named by an endpoint such
//! as `unix:///csi/csi.sock`; drivers are often started with a plain path too. Both forms are
//! accepted here, with the same meaning the Go drivers give them.

use std::future::Future;
use std::io;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::body::Body;
use tonic::codegen::http::{Request, Response, Uri};
use tonic::codegen::{Bytes, Service};
use tonic::service::Routes;
use tonic::transport::server::Router;
use tonic::transport::{Channel, Endpoint};
use tower::Layer;

use crate::Error;
use crate::authority::AuthorityFix;

/// The path named by a CSI endpoint.
///
/// Accepted: `unix:///abs/path` (→ `/abs/path`), `unix://rel/path` (→ `rel/path`, as Go's
/// `url.Parse` + host-and-path join yields), `unix:/abs/path`, and a plain path. Any other scheme
/// (`tcp://`, `http://`) and an empty path are rejected.
pub fn parse_endpoint(endpoint: &str) -> Result<PathBuf, Error> {
    let invalid = |reason| Error::InvalidEndpoint {
        endpoint: endpoint.to_owned(),
        reason,
    };
    let path = if let Some(rest) = endpoint.strip_prefix("unix://") {
        rest
    } else if let Some(rest) = endpoint.strip_prefix("unix:") {
        rest
    } else if endpoint.contains("://") {
        return Err(invalid(
            "only unix sockets are supported (expected unix:///path or a plain path)",
        ));
    } else {
        endpoint
    };
    if path.is_empty() {
        return Err(invalid("the socket path is empty"));
    }
    if path.contains('\0') {
        return Err(invalid("the socket path contains a NUL byte"));
    }
    Ok(PathBuf::from(path))
}

/// A bound CSI unix socket. The socket file is removed when this value (or the server that
/// [`UnixSocket::serve`] runs) is dropped.
#[derive(Debug)]
pub struct UnixSocket {
    listener: UnixListener,
    file: SocketFile,
}

impl UnixSocket {
    /// Binds the endpoint. Creates missing parent directories; removes a stale socket file left
    /// by a previous run, but refuses to replace a socket someone is still serving on or a file
    /// that is not a socket. Must be called inside a tokio runtime.
    pub fn bind(endpoint: &str) -> Result<Self, Error> {
        let path = parse_endpoint(endpoint)?;
        let io_err = |op, source| Error::Io {
            path: path.clone(),
            op,
            source,
        };
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)
                .map_err(|e| io_err("creating the socket directory", e))?;
        }
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.file_type().is_socket() => {
                // A live server answers connect(); a stale file left by a crash refuses it.
                if std::os::unix::net::UnixStream::connect(&path).is_ok() {
                    return Err(Error::InUse { path });
                }
                std::fs::remove_file(&path)
                    .map_err(|e| io_err("removing the stale socket file", e))?;
                tracing::debug!(path = %path.display(), "removed stale CSI socket file");
            }
            Ok(_) => return Err(Error::NotASocket { path }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err("inspecting the socket path", e)),
        }
        let listener = UnixListener::bind(&path).map_err(|e| io_err("binding", e))?;
        Ok(Self {
            listener,
            file: SocketFile { path },
        })
    }

    /// The socket file's path.
    pub fn path(&self) -> &Path {
        &self.file.path
    }

    /// Serves `router` until `shutdown` resolves, then removes the socket file.
    pub async fn serve<L, ResBody>(
        self,
        router: Router<L>,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), Error>
    where
        L: Layer<Routes>,
        L::Service: Service<Request<Body>, Response = Response<ResBody>> + Clone + Send + 'static,
        <L::Service as Service<Request<Body>>>::Future: Send,
        <L::Service as Service<Request<Body>>>::Error: Into<tonic::codegen::StdError> + Send,
        ResBody: tonic::codegen::Body<Data = Bytes> + Send + 'static,
        ResBody::Error: Into<tonic::codegen::StdError>,
    {
        let Self { listener, file } = self;
        tracing::info!(path = %file.path.display(), "serving CSI");
        let result = router
            .serve_with_incoming_shutdown(
                // grpc-go and grpc-core clients send the socket path as :authority; see authority.rs.
                UnixListenerStream::new(listener).map(|conn| conn.map(AuthorityFix::new)),
                shutdown,
            )
            .await;
        let path = file.path.clone();
        drop(file);
        result.map_err(|source| Error::Transport {
            path,
            op: "serving",
            source,
        })
    }
}

/// Binds `endpoint` and serves `router` on it until `shutdown` resolves; the socket file is
/// removed afterwards. Use [`UnixSocket::bind`] + [`UnixSocket::serve`] to learn when the socket
/// is ready before serving.
pub async fn serve_unix<L, ResBody>(
    router: Router<L>,
    endpoint: &str,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error>
where
    L: Layer<Routes>,
    L::Service: Service<Request<Body>, Response = Response<ResBody>> + Clone + Send + 'static,
    <L::Service as Service<Request<Body>>>::Future: Send,
    <L::Service as Service<Request<Body>>>::Error: Into<tonic::codegen::StdError> + Send,
    ResBody: tonic::codegen::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<tonic::codegen::StdError>,
{
    UnixSocket::bind(endpoint)?.serve(router, shutdown).await
}

/// Dials a CSI endpoint (`unix:///path` or a plain path) and returns a connected channel.
/// Fails at once if nothing listens there.
pub async fn connect_unix(endpoint: &str) -> Result<Channel, Error> {
    let path = parse_endpoint(endpoint)?;
    unix_endpoint()
        .connect_with_connector(unix_connector(path.clone()))
        .await
        .map_err(|source| Error::Transport {
            path,
            op: "connecting",
            source,
        })
}

/// Like [`connect_unix`], but connects on first use (and reconnects after a driver restart):
/// what a sidecar wants when it may start before the driver.
pub fn connect_unix_lazy(endpoint: &str) -> Result<Channel, Error> {
    let path = parse_endpoint(endpoint)?;
    Ok(unix_endpoint().connect_with_connector_lazy(unix_connector(path)))
}

/// The URI only feeds the HTTP/2 `:authority`; the connector ignores it and dials the socket.
/// "localhost" is what grpc-go sends for unix targets.
fn unix_endpoint() -> Endpoint {
    Endpoint::from_static("http://localhost")
}

fn unix_connector(
    path: PathBuf,
) -> impl Service<
    Uri,
    Response = TokioIo<UnixStream>,
    Error = io::Error,
    Future = impl Future<Output = io::Result<TokioIo<UnixStream>>> + Send,
> + Send
+ 'static {
    let path = Arc::new(path);
    tower::service_fn(move |_: Uri| {
        let path = Arc::clone(&path);
        async move { UnixStream::connect(path.as_path()).await.map(TokioIo::new) }
    })
}

/// Removes the socket file on drop, so a clean shutdown leaves no stale file behind.
#[derive(Debug)]
struct SocketFile {
    path: PathBuf,
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        match std::fs::remove_file(&self.path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "could not remove CSI socket file");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_forms() {
        assert_eq!(
            parse_endpoint("unix:///csi/csi.sock").unwrap(),
            PathBuf::from("/csi/csi.sock")
        );
        assert_eq!(
            parse_endpoint("unix:/csi/csi.sock").unwrap(),
            PathBuf::from("/csi/csi.sock")
        );
        // Go drivers' `unix://tmp/csi.sock` means the relative path tmp/csi.sock.
        assert_eq!(
            parse_endpoint("unix://tmp/csi.sock").unwrap(),
            PathBuf::from("tmp/csi.sock")
        );
        assert_eq!(
            parse_endpoint("/var/lib/kubelet/plugins/x/csi.sock").unwrap(),
            PathBuf::from("/var/lib/kubelet/plugins/x/csi.sock")
        );
    }

    #[test]
    fn bad_endpoints_name_the_endpoint() {
        for bad in ["tcp://127.0.0.1:10000", "unix://", "", "unix:"] {
            let err = parse_endpoint(bad).unwrap_err();
            assert!(
                matches!(err, Error::InvalidEndpoint { ref endpoint, .. } if endpoint == bad),
                "{bad:?} gave {err}"
            );
            assert!(err.to_string().contains("CSI endpoint"), "{err}");
        }
    }

    #[tokio::test]
    async fn bind_replaces_a_stale_socket_but_not_a_live_one_or_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nested/dir/csi.sock");
        let endpoint = format!("unix://{}", path.display());

        // Leave a stale socket file behind: bind with std and drop the listener.
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        assert!(path.exists());

        let live = UnixSocket::bind(&endpoint).unwrap();
        assert_eq!(live.path(), path.as_path());

        // A second bind while the first one listens must not steal the socket.
        match UnixSocket::bind(&endpoint) {
            Err(Error::InUse { path: p }) => assert_eq!(p, path),
            other => panic!("expected InUse, got {other:?}"),
        }

        drop(live);
        assert!(!path.exists(), "dropping the socket removes the file");

        std::fs::write(&path, b"not a socket").unwrap();
        match UnixSocket::bind(&endpoint) {
            Err(Error::NotASocket { path: p }) => assert_eq!(p, path),
            other => panic!("expected NotASocket, got {other:?}"),
        }
        assert_eq!(std::fs::read(&path).unwrap(), b"not a socket");
    }

    #[tokio::test]
    async fn connect_to_nothing_fails_with_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("absent.sock");
        let err = connect_unix(path.to_str().unwrap()).await.unwrap_err();
        assert!(
            matches!(err, Error::Transport { path: ref p, .. } if *p == path),
            "{err}"
        );
    }
}
