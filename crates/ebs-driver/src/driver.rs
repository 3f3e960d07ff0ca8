//! Serving the driver's CSI services on the endpoint until shutdown, in one of three modes.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use csi_spec::UnixSocket;
use csi_spec::v1::controller_server::ControllerServer;
use csi_spec::v1::identity_server::IdentityServer;
use csi_spec::v1::node_server::NodeServer;
use ebs_cloud::CloudMetrics;
use ebs_cloud_aws::{AwsCloud, AwsConfig};
use prometheus_client::registry::Registry;
use telemetry::{Health, ReadyCheck};
use tonic::transport::Server;

use crate::controller::{ControllerConfig, ControllerService};
use crate::controller_svc::CsiControllerSvc;
#[cfg(feature = "embedded-ec2")]
use crate::embedded;
use crate::identity::{CsiIdentitySvc, IdentityConfig};
use crate::metrics::{RpcMetrics, RpcMetricsLayer};
use crate::node::requests::NodeConfig;
use crate::node::service::NodeService;
use crate::node::{CsiNodeSvc, NodeInfo};
use crate::{Error, Result};

/// Which services this process runs (the EBS driver design, docs/design/ebs-driver.md,
/// "No credentials on nodes").
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Identity + Controller: talks to EC2, needs credentials.
    Controller,
    /// Identity + Node: no credentials, no EC2 call; controller RPCs are Unimplemented.
    Node,
    /// Everything in one process.
    All,
}

impl Mode {
    pub fn controller(self) -> bool {
        self != Mode::Node
    }
    pub fn node(self) -> bool {
        self != Mode::Controller
    }
}

/// Everything `ebs-csi-driver` needs to run.
#[derive(Debug, Clone)]
pub struct DriverConfig {
    /// `unix:///path/csi.sock` or a plain path.
    pub endpoint: String,
    pub mode: Mode,
    pub identity: IdentityConfig,
    pub node: NodeConfig,
    /// `node_id` may be empty with `embedded_ec2` (the registered instance is used).
    pub node_info: NodeInfo,
    pub controller: ControllerConfig,
    /// The EC2 client (controller side only).
    pub aws: AwsConfig,
    /// `--embedded-ec2 DIR`. Without the `embedded-ec2` feature the field is still there, and
    /// setting it fails with [`crate::NO_EMBEDDED_EC2`].
    pub embedded_ec2: Option<PathBuf>,
    /// The embedded simulator's timing.
    #[cfg(feature = "embedded-ec2")]
    pub embedded_timing: ec2_sim::Timing,
    /// `--http-endpoint`: metrics and health.
    pub http_endpoint: Option<SocketAddr>,
    /// The series the driver records into; a process that embeds the driver passes handles it
    /// keeps, to read the counts without scraping `--http-endpoint`.
    pub metrics: DriverMetrics,
}

/// The driver's counters, shared with whoever holds a clone (all clones share the series).
#[derive(Debug, Clone, Default)]
pub struct DriverMetrics {
    /// CSI RPCs handled, per method.
    pub rpc: RpcMetrics,
    /// The controller service's EC2 calls, per action (none in node mode).
    pub ec2: CloudMetrics,
}

impl Default for DriverConfig {
    fn default() -> Self {
        Self {
            endpoint: "unix:///var/lib/kubelet/plugins/ebs.csi.aws.com/csi.sock".into(),
            mode: Mode::All,
            identity: IdentityConfig::default(),
            node: NodeConfig::default(),
            node_info: NodeInfo {
                node_id: String::new(),
                zone: None,
                max_volumes_per_node: 25,
            },
            controller: ControllerConfig::default(),
            aws: AwsConfig::default(),
            embedded_ec2: None,
            #[cfg(feature = "embedded-ec2")]
            embedded_timing: ec2_sim::Timing::Fast,
            http_endpoint: None,
            metrics: DriverMetrics::default(),
        }
    }
}

/// Binds the endpoint, then serves until `shutdown` resolves. The socket file is removed on
/// the way out.
pub async fn run(config: DriverConfig, shutdown: impl Future<Output = ()>) -> Result<()> {
    // Bad flags fail before the socket exists, so kubelet never sees a half-started driver.
    let parts = Parts::build(config).await?;
    let socket = UnixSocket::bind(&parts.config.endpoint).map_err(Error::Endpoint)?;
    parts.serve(socket, shutdown).await
}

/// Like [`run`] on a socket that is already bound (tests bind first to know when it is ready).
pub async fn serve(
    socket: UnixSocket,
    config: DriverConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    Parts::build(config).await?.serve(socket, shutdown).await
}

struct Parts {
    config: DriverConfig,
    #[cfg(feature = "embedded-ec2")]
    embedded: Option<embedded::Embedded>,
    controller: Option<ControllerService>,
    node: Option<NodeService>,
    registry: Registry,
    rpc: RpcMetrics,
}

impl Parts {
    async fn build(mut config: DriverConfig) -> Result<Parts> {
        let mut registry = Registry::with_prefix("ebs_csi");
        let rpc = config.metrics.rpc.clone();
        rpc.register(&mut registry);
        #[cfg(not(feature = "embedded-ec2"))]
        if config.embedded_ec2.is_some() {
            return Err(Error::invalid("embedded_ec2", crate::NO_EMBEDDED_EC2));
        }
        #[cfg(feature = "embedded-ec2")]
        let mut embedded = None;
        #[cfg(feature = "embedded-ec2")]
        if let Some(dir) = config.embedded_ec2.clone() {
            if !config.mode.controller() {
                return Err(Error::invalid(
                    "embedded_ec2",
                    "needs --mode all or controller: node mode makes no EC2 calls (pass --node-id instead)",
                ));
            }
            std::fs::create_dir_all(&dir).map_err(|e| Error::io("creating", &dir, e))?;
            let e = embedded::start(&dir, config.embedded_timing).await?;
            config.aws.endpoint = Some(e.sim.endpoint());
            config.aws.region = Some(e.region.clone());
            config.aws.static_credentials = e
                .credentials
                .first()
                .map(|(k, s)| (k.to_string(), s.to_string()));
            config.node.dev_root = e.device_dir.clone();
            embedded = Some(e);
        }
        let mut controller = None;
        if config.mode.controller() {
            let metrics = config.metrics.ec2.clone();
            metrics.register(&mut registry);
            let cloud = AwsCloud::new(config.aws.clone(), metrics)
                .await
                .map_err(|e| Error::invalid("aws", e.to_string()))?;
            #[cfg(feature = "embedded-ec2")]
            if let Some(dir) = &config.embedded_ec2 {
                let instance = embedded::register_instance(&cloud, dir).await?;
                if config.node_info.node_id.is_empty() {
                    config.node_info.node_id = instance.instance_id;
                    config.node_info.zone = Some(instance.zone.clone());
                }
                config.controller.default_zone.get_or_insert(instance.zone);
            }
            if config.controller.publish.attach_limit.is_none() {
                config.controller.publish.attach_limit =
                    usize::try_from(config.node_info.max_volumes_per_node).ok();
            }
            controller = Some(ControllerService::new(
                Arc::new(cloud),
                config.controller.clone(),
            ));
        }
        let mut node = None;
        if config.mode.node() {
            if config.node_info.node_id.is_empty() {
                // As the Go driver's node DaemonSet runs: no node ID given, ask the instance.
                let (id, zone) = ebs_cloud_aws::instance_identity(None).await.map_err(|e| {
                    Error::invalid(
                        "node_id",
                        format!(
                            "is required in node and all modes (the EC2 instance ID; --node-id or CSI_NODE_ID), unless --embedded-ec2 registers one, and instance metadata could not tell it: {e}"
                        ),
                    )
                })?;
                tracing::info!(node_id = %id, zone = %zone, "node identity from instance metadata");
                config.node_info.node_id = id;
                config.node_info.zone.get_or_insert(zone);
            }
            node = Some(NodeService::new(config.node.clone())?);
        }
        config.identity.controller_service = controller.is_some();
        Ok(Parts {
            config,
            #[cfg(feature = "embedded-ec2")]
            embedded,
            controller,
            node,
            registry,
            rpc,
        })
    }

    async fn serve(self, socket: UnixSocket, shutdown: impl Future<Output = ()>) -> Result<()> {
        let Parts {
            config,
            #[cfg(feature = "embedded-ec2")]
            embedded,
            controller,
            node,
            registry,
            rpc,
        } = self;
        tracing::info!(
            driver = %config.identity.driver_name,
            mode = ?config.mode,
            node_id = %config.node_info.node_id,
            endpoint = %socket.path().display(),
            "starting"
        );
        let http = match config.http_endpoint {
            Some(addr) => {
                // /healthz: the process answers; /readyz: the controller's Probe (node mode has
                // none, so it follows /healthz).
                let health = Health::default();
                health.set_ready(true);
                if let Some(probe) = controller.clone() {
                    let ready: ReadyCheck = Arc::new(move || {
                        let probe = probe.clone();
                        Box::pin(async move { probe.probe().await.is_ok() })
                    });
                    health.set_ready_check(ready);
                }
                Some(
                    telemetry::serve_http(
                        &addr.to_string(),
                        "/metrics",
                        Arc::new(registry),
                        health,
                    )
                    .await?,
                )
            }
            None => None,
        };
        let identity = match &controller {
            Some(c) => CsiIdentitySvc::new(config.identity.clone()).with_probe(c.clone()),
            None => CsiIdentitySvc::new(config.identity.clone()),
        };
        let router = Server::builder()
            .layer(RpcMetricsLayer(rpc))
            .add_service(IdentityServer::new(identity))
            .add_optional_service(
                controller.map(|c| ControllerServer::new(CsiControllerSvc::new(c))),
            )
            .add_optional_service(
                node.map(|n| NodeServer::new(CsiNodeSvc::new(n, config.node_info.clone()))),
            );
        let result = socket
            .serve(router, shutdown)
            .await
            .map_err(Error::Endpoint);
        if let Some(server) = http {
            server.shutdown().await;
        }
        #[cfg(feature = "embedded-ec2")]
        if let Some(e) = embedded {
            if let Err(err) = e.sim.shutdown().await {
                tracing::warn!(error = %err, "stopping the embedded EC2");
            }
        }
        result
    }
}
