//! What the end-to-end tests with the EBS driver share: the driver's controller service on a
//! unix socket against ec2-sim (through the real aws-sdk-ec2), and the external attacher built
//! from its library against that driver.
// Each test binary uses part of this module.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use csi_spec::v1::ControllerGetCapabilitiesRequest;
use csi_spec::v1::controller_client::ControllerClient;
use ebs_cloud_aws::AwsConfig;
use ebs_driver::{DriverConfig, Mode as DriverMode, PublishConfig};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub mod ebs_world;
pub mod provisioning;
pub mod rbac;

pub const DRIVER: &str = "ebs.csi.aws.com";
pub const ZONE: &str = "us-east-1a";

pub fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        ..Default::default()
    }
}

/// ec2-sim at `endpoint` with static credentials and fast polling.
pub fn aws_config(endpoint: &str) -> AwsConfig {
    AwsConfig {
        region: Some("us-east-1".into()),
        endpoint: Some(endpoint.to_string()),
        static_credentials: Some(("AKIDTEST".into(), "secret".into())),
        poll_initial: Duration::from_millis(20),
        poll_max: Duration::from_millis(250),
        ..AwsConfig::default()
    }
}

/// The driver's gRPC server task; stopped on drop, also when an assertion fails.
pub struct DriverTask {
    stop: CancellationToken,
}

impl Drop for DriverTask {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// `ebs-csi-driver` in controller mode at `endpoint` (`unix://...`).
pub async fn start_driver(endpoint: &str, aws: AwsConfig) -> DriverTask {
    start_driver_tagging(endpoint, aws, None).await
}

/// [`start_driver`] with `--k8s-tag-cluster-id=<cluster_id>` (the in-tree plugin's tags).
pub async fn start_driver_tagging(
    endpoint: &str,
    aws: AwsConfig,
    cluster_id: Option<&str>,
) -> DriverTask {
    let config = DriverConfig {
        endpoint: endpoint.to_string(),
        mode: DriverMode::Controller,
        aws,
        controller: ebs_driver::ControllerConfig {
            publish: PublishConfig {
                poll_initial: Duration::from_millis(20),
                poll_max: Duration::from_millis(250),
                ..PublishConfig::default()
            },
            cluster_id: cluster_id.map(Into::into),
            ..Default::default()
        },
        ..DriverConfig::default()
    };
    let socket = csi_spec::UnixSocket::bind(endpoint).unwrap();
    let stop = CancellationToken::new();
    let stopped = stop.clone();
    tokio::spawn(async move {
        if let Err(e) = ebs_driver::serve(socket, config, stopped.cancelled_owned()).await {
            eprintln!("driver stopped: {e}");
        }
    });
    DriverTask { stop }
}

/// The external attacher for the driver at `endpoint`, from its library, until `stop`;
/// `observer` sees every CSI call it makes.
pub async fn start_attacher(
    kube: Client,
    endpoint: &str,
    observer: Option<attacher::metrics::CsiCallObserver>,
    stop: CancellationToken,
) -> JoinHandle<Result<(), attacher::Error>> {
    let channel = csi_spec::connect_unix(endpoint).await.unwrap();
    let caps = ControllerClient::new(channel.clone())
        .controller_get_capabilities(ControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities
        .iter()
        .filter_map(|c| c.rpc_type().map(|t| t as i32))
        .collect::<Vec<_>>();
    let driver = attacher::Driver::Csi {
        name: DRIVER.into(),
        channel,
        capabilities: attacher::Capabilities::from_rpc_types(caps),
    };
    let options = attacher::Options {
        timeout: Duration::from_secs(30),
        workers: 4,
        retry_interval_start: Duration::from_millis(100),
        retry_interval_max: Duration::from_secs(2),
        resync: Duration::ZERO,
        reconcile_sync: Duration::ZERO,
        max_entries: 0,
        default_fstype: String::new(),
    };
    let mut registry = prometheus_client::registry::Registry::default();
    let controller = attacher::Controller::new(kube, driver, options, &mut registry, observer);
    tokio::spawn(controller.run(stop))
}
