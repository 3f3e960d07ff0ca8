//! `--http-endpoint`: `/healthz` answers 200 while the registration socket exists and the
//! kubelet reported the plugin registered, else 500 with the reason (as the Go sidecar).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use tokio_util::sync::CancellationToken;

use crate::Error;
use crate::registration_status::Status;

/// A running health server; cancelling `stop` ends it (`Running` does, on wait and on drop).
pub(crate) struct HealthServer {
    pub(crate) local_addr: SocketAddr,
    pub(crate) stop: CancellationToken,
    pub(crate) task: tokio::task::JoinHandle<()>,
}

#[derive(Clone)]
struct HealthState {
    socket: Arc<PathBuf>,
    status: Arc<Status>,
}

/// Binds `addr` (`host:port`, or Go's `:port` for every interface) and serves `/healthz`.
pub(crate) async fn serve(
    addr: &str,
    socket: PathBuf,
    status: Arc<Status>,
) -> Result<HealthServer, Error> {
    let http_err = |reason: String| Error::Http {
        addr: addr.to_owned(),
        reason,
    };
    let bind_to = match addr.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => addr.to_owned(),
    };
    let listener = tokio::net::TcpListener::bind(&bind_to)
        .await
        .map_err(|e| http_err(format!("cannot listen: {e}")))?;
    let local_addr = listener
        .local_addr()
        .map_err(|e| http_err(format!("cannot read the bound address: {e}")))?;
    let app = Router::new()
        .route("/healthz", get(healthz))
        .with_state(HealthState {
            socket: Arc::new(socket),
            status,
        });
    let stop = CancellationToken::new();
    let stopped = stop.clone();
    let task = tokio::spawn(async move {
        let result = axum::serve(listener, app)
            .with_graceful_shutdown(async move { stopped.cancelled().await })
            .await;
        if let Err(e) = result {
            tracing::error!(error = %e, "health server failed");
        }
    });
    tracing::info!(%local_addr, "serving /healthz");
    Ok(HealthServer {
        local_addr,
        stop,
        task,
    })
}

async fn healthz(State(state): State<HealthState>) -> (StatusCode, String) {
    if !crate::is_socket(&state.socket) {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "registration socket {} does not exist\n",
                state.socket.display()
            ),
        );
    }
    match state.status.get() {
        Some(Ok(())) => (StatusCode::OK, "ok\n".to_owned()),
        Some(Err(error)) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the kubelet did not register the plugin: {error}\n"),
        ),
        None => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "the kubelet has not reported the registration status yet\n".to_owned(),
        ),
    }
}
