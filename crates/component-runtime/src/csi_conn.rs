//! The sidecar's side of the CSI socket: dial with retries, wait for the driver to be ready,
//! learn its name and controller capabilities.
//!
//! Behaviour follows csi-lib-utils: the driver container may start after the sidecar, so
//! dialling retries until `--connection-timeout`; Probe is retried while it times out or says
//! "not ready" and any other error is fatal; an unset `ready` counts as ready (CSI spec).

use std::collections::BTreeSet;
use std::time::Duration;

use csi_spec::v1::controller_client::ControllerClient;
use csi_spec::v1::controller_service_capability::rpc::Type as ControllerRpc;
use csi_spec::v1::identity_client::IdentityClient;
use csi_spec::v1::plugin_capability::service::Type as PluginService;
use csi_spec::v1::{
    ControllerGetCapabilitiesRequest, GetPluginCapabilitiesRequest, GetPluginInfoRequest,
    ProbeRequest,
};
use tokio::time::Instant;
use tonic::transport::Channel;

use crate::Error;

/// Pause between dial attempts and between Probe attempts (csi-lib-utils probes every second).
const RETRY_INTERVAL: Duration = Duration::from_secs(1);
/// Dial attempts are short so a socket that appears is noticed quickly.
const FIRST_RETRY_INTERVAL: Duration = Duration::from_millis(100);

/// Connects to the driver at `address` (a plain path or `unix://` URL), retrying until
/// `connection_timeout` passes: the driver may start later than the sidecar. Each failure is
/// logged. The returned channel reconnects by itself if the driver restarts later.
pub async fn connect(address: &str, connection_timeout: Duration) -> Result<Channel, Error> {
    // A malformed address will not get better by waiting.
    csi_spec::parse_endpoint(address).map_err(|source| Error::CsiEndpoint {
        address: address.to_owned(),
        source,
    })?;
    let deadline = Instant::now() + connection_timeout;
    let mut pause = FIRST_RETRY_INTERVAL;
    let mut attempt: u32 = 0;
    loop {
        attempt += 1;
        let remaining = deadline.saturating_duration_since(Instant::now());
        let result = tokio::time::timeout(remaining.max(Duration::from_millis(1)), async {
            csi_spec::connect_unix(address).await
        })
        .await;
        let last_error = match result {
            Ok(Ok(channel)) => {
                tracing::info!(address, attempt, "connected to the CSI driver");
                return Ok(channel);
            }
            Ok(Err(e)) => error_chain(&e),
            Err(_) => "the connection attempt timed out".to_owned(),
        };
        let now = Instant::now();
        if now >= deadline {
            return Err(Error::ConnectTimeout {
                address: address.to_owned(),
                timeout: connection_timeout,
                last_error,
            });
        }
        tracing::warn!(address, attempt, error = %last_error, "still connecting to the CSI driver");
        tokio::time::sleep(pause.min(deadline - now)).await;
        pause = (pause * 2).min(RETRY_INTERVAL);
    }
}

/// Calls Identity.Probe until the driver reports ready (an unset `ready` counts as ready).
/// A call that times out (`call_timeout`), answers DEADLINE_EXCEEDED or UNAVAILABLE, or says
/// not ready is retried every second until `overall` passes; any other error is returned at
/// once, as the Go sidecars do.
pub async fn probe_until_ready(
    channel: &Channel,
    call_timeout: Duration,
    overall: Duration,
) -> Result<(), Error> {
    let deadline = Instant::now() + overall;
    let mut client = IdentityClient::new(channel.clone());
    loop {
        let mut request = tonic::Request::new(ProbeRequest {});
        request.set_timeout(call_timeout);
        let last_error = match tokio::time::timeout(call_timeout, client.probe(request)).await {
            Ok(Ok(response)) => match response.into_inner().ready {
                None | Some(true) => {
                    tracing::debug!("CSI driver is ready");
                    return Ok(());
                }
                Some(false) => "the driver reports not ready".to_owned(),
            },
            Ok(Err(status))
                if matches!(
                    status.code(),
                    tonic::Code::DeadlineExceeded | tonic::Code::Unavailable
                ) =>
            {
                status.to_string()
            }
            Ok(Err(status)) => {
                return Err(Error::Csi {
                    method: "Probe",
                    status: Box::new(status),
                });
            }
            Err(_) => format!("no answer within {call_timeout:?}"),
        };
        let now = Instant::now();
        if now >= deadline {
            return Err(Error::ProbeTimeout {
                timeout: overall,
                last_error,
            });
        }
        tracing::info!(error = %last_error, "waiting for the CSI driver to become ready");
        tokio::time::sleep(RETRY_INTERVAL.min(deadline - now)).await;
    }
}

/// What a sidecar needs to know about its driver.
#[derive(Debug, Clone)]
pub struct DriverInfo {
    /// GetPluginInfo's name (the CSI driver name, e.g. `ebs.csi.aws.com`).
    pub name: String,
    /// GetPluginInfo's vendor_version.
    pub vendor_version: String,
    /// `csi.v1.ControllerServiceCapability.RPC.Type` values as i32; empty when the plugin does
    /// not offer CONTROLLER_SERVICE. Unknown (newer) values are kept.
    pub controller_capabilities: BTreeSet<i32>,
}

impl DriverInfo {
    /// Whether the driver announced controller RPC capability `t`.
    pub fn has_controller(&self, t: ControllerRpc) -> bool {
        self.controller_capabilities.contains(&(t as i32))
    }
}

/// How every sidecar starts on its driver: [`connect`] (retried until `connection_timeout`),
/// [`probe_until_ready`], then [`driver_info`], each call within `call_timeout`.
/// [`Error::ShutDown`] when `shutdown` comes first.
pub async fn connect_and_describe(
    address: &str,
    connection_timeout: Duration,
    call_timeout: Duration,
    shutdown: &tokio_util::sync::CancellationToken,
) -> Result<(Channel, DriverInfo), Error> {
    let connect = async {
        let channel = connect(address, connection_timeout).await?;
        probe_until_ready(&channel, call_timeout, connection_timeout).await?;
        let info = driver_info(&channel, call_timeout).await?;
        Ok((channel, info))
    };
    tokio::select! {
        () = shutdown.cancelled() => Err(Error::ShutDown("the CSI driver was reachable")),
        r = connect => r,
    }
}

/// GetPluginInfo, then GetPluginCapabilities, then ControllerGetCapabilities only when the
/// plugin offers CONTROLLER_SERVICE. Each call gets `call_timeout`.
pub async fn driver_info(channel: &Channel, call_timeout: Duration) -> Result<DriverInfo, Error> {
    let mut identity = IdentityClient::new(channel.clone());
    let info = call(
        "GetPluginInfo",
        call_timeout,
        identity.get_plugin_info(timed(GetPluginInfoRequest {}, call_timeout)),
    )
    .await?;
    if info.name.is_empty() {
        return Err(Error::CsiResponse {
            method: "GetPluginInfo",
            reason: "the driver returned an empty name (the spec requires one)".to_owned(),
        });
    }
    let plugin_caps = call(
        "GetPluginCapabilities",
        call_timeout,
        identity.get_plugin_capabilities(timed(GetPluginCapabilitiesRequest {}, call_timeout)),
    )
    .await?;
    let controller_service = plugin_caps
        .capabilities
        .iter()
        .any(|c| c.service_type() == Some(PluginService::ControllerService));
    let mut controller_capabilities = BTreeSet::new();
    if controller_service {
        let mut controller = ControllerClient::new(channel.clone());
        let caps = call(
            "ControllerGetCapabilities",
            call_timeout,
            controller.controller_get_capabilities(timed(
                ControllerGetCapabilitiesRequest {},
                call_timeout,
            )),
        )
        .await?;
        for cap in caps.capabilities {
            if let Some(csi_spec::v1::controller_service_capability::Type::Rpc(rpc)) = cap.r#type {
                controller_capabilities.insert(rpc.r#type);
            }
        }
    }
    tracing::info!(
        driver = %info.name,
        version = %info.vendor_version,
        controller_service,
        capabilities = ?controller_capabilities
            .iter()
            .map(|c| ControllerRpc::try_from(*c).map_or_else(|_| c.to_string(), |t| t.as_str_name().to_owned()))
            .collect::<Vec<_>>(),
        "CSI driver"
    );
    Ok(DriverInfo {
        name: info.name,
        vendor_version: info.vendor_version,
        controller_capabilities,
    })
}

fn timed<T>(message: T, timeout: Duration) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(timeout);
    request
}

/// One unary call with a client-side timeout as well (the server may ignore grpc-timeout).
async fn call<T>(
    method: &'static str,
    timeout: Duration,
    fut: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, Error> {
    match tokio::time::timeout(timeout, fut).await {
        Ok(Ok(response)) => Ok(response.into_inner()),
        Ok(Err(status)) => Err(Error::Csi {
            method,
            status: Box::new(status),
        }),
        Err(_) => Err(Error::Csi {
            method,
            status: Box::new(tonic::Status::deadline_exceeded(format!(
                "no answer within {timeout:?}"
            ))),
        }),
    }
}

/// The error with its sources, which is where tonic puts the interesting part.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_spec::v1::controller_server::{Controller, ControllerServer};
    use csi_spec::v1::identity_server::{Identity, IdentityServer};
    use csi_spec::v1::{
        ControllerGetCapabilitiesResponse, ControllerServiceCapability,
        GetPluginCapabilitiesResponse, GetPluginInfoResponse, PluginCapability, ProbeResponse,
    };
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};
    use tonic::{Request, Response, Status};

    /// A tiny driver: Probe says "not ready" for the first `not_ready` calls.
    #[derive(Clone, Default)]
    struct Plugin {
        not_ready: u32,
        probes: Arc<AtomicU32>,
        probe_error: Option<tonic::Code>,
        controller: bool,
    }

    #[tonic::async_trait]
    impl Identity for Plugin {
        async fn get_plugin_info(
            &self,
            _: Request<GetPluginInfoRequest>,
        ) -> Result<Response<GetPluginInfoResponse>, Status> {
            Ok(Response::new(GetPluginInfoResponse {
                name: "test.csi.rs".into(),
                vendor_version: "1.2.3".into(),
                ..Default::default()
            }))
        }
        async fn get_plugin_capabilities(
            &self,
            _: Request<GetPluginCapabilitiesRequest>,
        ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
            let mut capabilities = vec![PluginCapability::service(
                PluginService::VolumeAccessibilityConstraints,
            )];
            if self.controller {
                capabilities.push(PluginCapability::service(PluginService::ControllerService));
            }
            Ok(Response::new(GetPluginCapabilitiesResponse {
                capabilities,
            }))
        }
        async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
            let n = self.probes.fetch_add(1, Ordering::SeqCst);
            if let Some(code) = self.probe_error {
                return Err(Status::new(code, "probe says no"));
            }
            Ok(Response::new(ProbeResponse {
                ready: if n < self.not_ready {
                    Some(false)
                } else {
                    None
                },
            }))
        }
    }

    #[tonic::async_trait]
    impl Controller for Plugin {
        async fn controller_get_capabilities(
            &self,
            _: Request<ControllerGetCapabilitiesRequest>,
        ) -> Result<Response<ControllerGetCapabilitiesResponse>, Status> {
            Ok(Response::new(ControllerGetCapabilitiesResponse {
                capabilities: vec![
                    ControllerServiceCapability::rpc(ControllerRpc::PublishUnpublishVolume),
                    ControllerServiceCapability::rpc(ControllerRpc::ListVolumesPublishedNodes),
                ],
            }))
        }
    }

    struct Served {
        stop: Option<tokio::sync::oneshot::Sender<()>>,
        task: tokio::task::JoinHandle<()>,
    }

    impl Drop for Served {
        fn drop(&mut self) {
            if let Some(stop) = self.stop.take() {
                let _ = stop.send(());
            }
            self.task.abort();
        }
    }

    fn serve(endpoint: &str, plugin: Plugin) -> Served {
        let socket = csi_spec::UnixSocket::bind(endpoint).unwrap();
        let router = tonic::transport::Server::builder()
            .add_service(IdentityServer::new(plugin.clone()))
            .add_service(ControllerServer::new(plugin));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let _ = socket
                .serve(router, async {
                    let _ = stopped.await;
                })
                .await;
        });
        Served {
            stop: Some(stop),
            task,
        }
    }

    #[tokio::test]
    async fn connects_to_a_socket_that_appears_later() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("csi.sock");
        let endpoint = format!("unix://{}", path.display());
        let late = endpoint.clone();
        // The driver starts after the sidecar: bind only after a delay.
        let server = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(700)).await;
            serve(&late, Plugin::default())
        });
        let channel = connect(&endpoint, Duration::from_secs(60)).await.unwrap();
        let _served = server.await.unwrap();
        probe_until_ready(&channel, Duration::from_secs(10), Duration::from_secs(60))
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn plain_path_works_too() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("csi.sock");
        let _served = serve(path.to_str().unwrap(), Plugin::default());
        let channel = connect(path.to_str().unwrap(), Duration::from_secs(30))
            .await
            .unwrap();
        let info = driver_info(&channel, Duration::from_secs(10))
            .await
            .unwrap();
        assert_eq!(info.name, "test.csi.rs");
    }

    #[tokio::test]
    async fn times_out_when_no_driver_appears() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("never.sock");
        let err = connect(path.to_str().unwrap(), Duration::from_millis(500))
            .await
            .unwrap_err();
        match &err {
            Error::ConnectTimeout {
                address, timeout, ..
            } => {
                assert_eq!(address, path.to_str().unwrap());
                assert_eq!(*timeout, Duration::from_millis(500));
            }
            other => panic!("expected ConnectTimeout, got {other:?}"),
        }
        assert!(err.to_string().contains("--connection-timeout"), "{err}");
    }

    #[tokio::test]
    async fn malformed_address_fails_at_once() {
        let err = connect("tcp://127.0.0.1:1", Duration::from_secs(3600))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::CsiEndpoint { .. }), "{err:?}");
    }

    #[tokio::test]
    async fn probe_waits_for_ready() {
        let dir = tempfile::tempdir().unwrap();
        let endpoint = format!("unix://{}/csi.sock", dir.path().display());
        let plugin = Plugin {
            not_ready: 2,
            ..Default::default()
        };
        let probes = Arc::clone(&plugin.probes);
        let _served = serve(&endpoint, plugin);
        let channel = connect(&endpoint, Duration::from_secs(30)).await.unwrap();
        probe_until_ready(&channel, Duration::from_secs(10), Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(
            probes.load(Ordering::SeqCst),
            3,
            "two not-ready answers, then ready"
        );
    }

    #[tokio::test]
    async fn probe_gives_up_after_overall_and_fails_fast_on_other_errors() {
        let dir = tempfile::tempdir().unwrap();
        let endpoint = format!("unix://{}/a.sock", dir.path().display());
        let _served = serve(
            &endpoint,
            Plugin {
                not_ready: u32::MAX,
                ..Default::default()
            },
        );
        let channel = connect(&endpoint, Duration::from_secs(30)).await.unwrap();
        let err = probe_until_ready(&channel, Duration::from_secs(5), Duration::from_millis(300))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::ProbeTimeout { .. }), "{err:?}");
        assert!(err.to_string().contains("not ready"), "{err}");

        let endpoint = format!("unix://{}/b.sock", dir.path().display());
        let plugin = Plugin {
            probe_error: Some(tonic::Code::FailedPrecondition),
            ..Default::default()
        };
        let probes = Arc::clone(&plugin.probes);
        let _served_b = serve(&endpoint, plugin);
        let channel = connect(&endpoint, Duration::from_secs(30)).await.unwrap();
        let err = probe_until_ready(&channel, Duration::from_secs(5), Duration::from_secs(3600))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, Error::Csi { method: "Probe", status } if status.code() == tonic::Code::FailedPrecondition),
            "{err:?}"
        );
        assert_eq!(probes.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn capabilities_only_with_controller_service() {
        let dir = tempfile::tempdir().unwrap();
        let with = format!("unix://{}/with.sock", dir.path().display());
        let without = format!("unix://{}/without.sock", dir.path().display());
        let _a = serve(
            &with,
            Plugin {
                controller: true,
                ..Default::default()
            },
        );
        let _b = serve(&without, Plugin::default());

        let channel = connect(&with, Duration::from_secs(30)).await.unwrap();
        let info = driver_info(&channel, Duration::from_secs(10))
            .await
            .unwrap();
        assert_eq!(info.name, "test.csi.rs");
        assert_eq!(info.vendor_version, "1.2.3");
        assert!(info.has_controller(ControllerRpc::PublishUnpublishVolume));
        assert!(info.has_controller(ControllerRpc::ListVolumesPublishedNodes));
        assert!(!info.has_controller(ControllerRpc::PublishReadonly));
        assert_eq!(info.controller_capabilities, BTreeSet::from([2, 10]));

        let channel = connect(&without, Duration::from_secs(30)).await.unwrap();
        let info = driver_info(&channel, Duration::from_secs(10))
            .await
            .unwrap();
        assert!(info.controller_capabilities.is_empty());
        assert!(!info.has_controller(ControllerRpc::PublishUnpublishVolume));
    }
}
