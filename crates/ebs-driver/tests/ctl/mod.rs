//! Real parts for the controller tests: an in-process ec2-sim (loop devices where possible), an
//! instance registered in it through the real SDK, and the driver served on a real unix socket.

// Test support: a failed setup step should fail the test loudly.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use csi_spec::v1::controller_client::ControllerClient;
use csi_spec::v1::identity_client::IdentityClient;
use csi_spec::v1::node_client::NodeClient;
use csi_spec::v1::volume_capability::access_mode::Mode;
use csi_spec::v1::*;
use ebs_cloud::CloudMetrics;
use ebs_cloud_aws::{AwsCloud, AwsConfig};
use ebs_driver::{DriverConfig, Mode as DriverMode, NodeConfig, NodeInfo, PublishConfig};
use ec2_sim::{Backing, SimConfig, Simulator, Timing};
use tonic::transport::Channel;

pub const GIB: i64 = 1 << 30;

/// Why loop-backed tests cannot run here, if they cannot.
pub fn missing_block_parts() -> Option<String> {
    if !rustix::process::geteuid().is_root() {
        return Some("not running as root".into());
    }
    if !Path::new("/dev/loop-control").exists() {
        return Some("no /dev/loop-control".into());
    }
    for tool in ["losetup", "blkid", "mkfs.ext4", "e2fsck", "mount", "umount"] {
        let found = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).exists()))
            .unwrap_or(false);
        if !found {
            return Some(format!("{tool} is not on PATH"));
        }
    }
    None
}

/// Whether loop-backed tests can run here; where they cannot, skips (or, under
/// `CSI_RS_REQUIRE_ALL`, fails) saying why and `what` needs them.
pub fn block_parts_or_skip(what: &str) -> bool {
    match missing_block_parts() {
        Some(why) => {
            test_support::skip_or_fail(&format!("{why}; {what}"));
            false
        }
        None => true,
    }
}

pub struct Env {
    pub sim: Simulator,
    pub cloud: AwsCloud,
    pub node_id: String,
    pub zone: String,
    pub dir: tempfile::TempDir,
}

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

impl Env {
    pub async fn start(timing: Timing, backing: Backing, max_attachments: usize) -> Env {
        let dir = tempfile::tempdir().unwrap();
        let config = SimConfig {
            state_dir: dir.path().join("ec2"),
            timing,
            backing,
            max_attachments_per_instance: max_attachments,
            ..SimConfig::default()
        };
        let sim = Simulator::start(config, "127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let cloud = AwsCloud::new(aws_config(&sim.endpoint()), CloudMetrics::new())
            .await
            .unwrap();
        let i = cloud.run_instance("test-node", None).await.unwrap();
        Env {
            sim,
            cloud,
            node_id: i.instance_id,
            zone: i.zone,
            dir,
        }
    }

    pub fn device_dir(&self) -> PathBuf {
        self.dir.path().join("ec2/dev")
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// How often ec2-sim has answered `action` so far.
    pub fn calls(&self, action: &str) -> u64 {
        self.sim.call_counts().get(action).copied().unwrap_or(0)
    }

    /// Waits until ec2-sim has answered `action` at least `n` times in all (an observable step
    /// of the driver's work, instead of a sleep), failing after 30 s.
    pub async fn wait_for_calls(&self, action: &str, n: u64) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while self.calls(action) < n {
            assert!(
                std::time::Instant::now() < deadline,
                "{action} was called {} times, not {n}",
                self.calls(action)
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// The driver's config for this environment (mode all, fast polls).
    pub fn driver_config(&self, mode: DriverMode) -> DriverConfig {
        DriverConfig {
            endpoint: String::new(),
            mode,
            node: NodeConfig {
                dev_root: self.device_dir(),
                device_wait: Duration::from_secs(10),
                ..NodeConfig::default()
            },
            node_info: NodeInfo {
                node_id: self.node_id.clone(),
                zone: Some(self.zone.clone()),
                max_volumes_per_node: 25,
            },
            aws: aws_config(&self.sim.endpoint()),
            controller: ebs_driver::ControllerConfig {
                publish: PublishConfig {
                    poll_initial: Duration::from_millis(20),
                    poll_max: Duration::from_millis(250),
                    ..PublishConfig::default()
                },
                ..Default::default()
            },
            ..DriverConfig::default()
        }
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        // Mounts the tests made under the temp dir go before the loop devices do.
        unmount_under(self.dir.path());
    }
}

/// Unmounts everything mounted under `dir`, deepest first.
pub fn unmount_under(dir: &Path) {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let prefix = dir.display().to_string();
    let mut points: Vec<String> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| p.starts_with(&prefix))
        .map(str::to_string)
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in points {
        let _ = std::process::Command::new("umount").arg(&p).status();
    }
}

/// The driver on a socket in its own temp dir; stops on drop.
pub struct Driver {
    _dir: tempfile::TempDir,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    pub channel: Channel,
    pub endpoint: String,
}

impl Driver {
    pub async fn start(mut config: DriverConfig) -> Driver {
        let dir = tempfile::tempdir().unwrap();
        let endpoint = format!("unix://{}", dir.path().join("csi.sock").display());
        config.endpoint = endpoint.clone();
        let socket = csi_spec::UnixSocket::bind(&endpoint).unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let r = ebs_driver::serve(socket, config, async {
                let _ = stopped.await;
            })
            .await;
            if let Err(e) = &r {
                eprintln!("driver stopped: {e}");
            }
            let _ = ready_tx.send(());
            r
        });
        let channel = csi_spec::connect_unix(&endpoint).await.unwrap();
        drop(ready_rx);
        Driver {
            _dir: dir,
            stop: Some(stop),
            channel,
            endpoint,
        }
    }

    pub fn controller(&self) -> ControllerClient<Channel> {
        ControllerClient::new(self.channel.clone())
    }

    pub fn node(&self) -> NodeClient<Channel> {
        NodeClient::new(self.channel.clone())
    }

    pub fn identity(&self) -> IdentityClient<Channel> {
        IdentityClient::new(self.channel.clone())
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

pub fn mount_cap() -> VolumeCapability {
    VolumeCapability::mount("ext4", vec![], Mode::SingleNodeWriter)
}

pub fn create_req(name: &str, bytes: i64) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.to_string(),
        capacity_range: Some(CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![mount_cap()],
        ..Default::default()
    }
}

pub fn publish_req(volume_id: &str, node_id: &str) -> ControllerPublishVolumeRequest {
    ControllerPublishVolumeRequest {
        volume_id: volume_id.to_string(),
        node_id: node_id.to_string(),
        volume_capability: Some(mount_cap()),
        ..Default::default()
    }
}

pub fn unpublish_req(volume_id: &str, node_id: &str) -> ControllerUnpublishVolumeRequest {
    ControllerUnpublishVolumeRequest {
        volume_id: volume_id.to_string(),
        node_id: node_id.to_string(),
        ..Default::default()
    }
}

pub fn device_ctx(device: &str) -> HashMap<String, String> {
    HashMap::from([("devicePath".to_string(), device.to_string())])
}

/// Asserts a failed call's code and that the message names `needle`.
pub fn expect_code<T: std::fmt::Debug>(
    r: Result<tonic::Response<T>, tonic::Status>,
    code: tonic::Code,
    needle: &str,
) {
    let err = r.expect_err("the call should fail");
    assert_eq!(err.code(), code, "{}", err.message());
    assert!(
        err.message().contains(needle),
        "message {:?} should name {needle:?}",
        err.message()
    );
}

/// Parameters (or mutable parameters) from `(key, value)` pairs.
pub fn params(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

pub fn validate_req(volume_id: &str, cap: VolumeCapability) -> ValidateVolumeCapabilitiesRequest {
    ValidateVolumeCapabilitiesRequest {
        volume_id: volume_id.to_string(),
        volume_capabilities: vec![cap],
        ..Default::default()
    }
}

pub fn delete_req(volume_id: &str) -> DeleteVolumeRequest {
    DeleteVolumeRequest {
        volume_id: volume_id.to_string(),
        ..Default::default()
    }
}

pub fn expand_req(volume_id: &str, bytes: i64) -> ControllerExpandVolumeRequest {
    ControllerExpandVolumeRequest {
        volume_id: volume_id.to_string(),
        capacity_range: Some(CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        ..Default::default()
    }
}

/// A CreateVolume that must succeed: the volume made.
pub async fn create(c: &mut ControllerClient<Channel>, r: CreateVolumeRequest) -> Volume {
    c.create_volume(r)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
}

/// A ControllerPublishVolume that must succeed: the device path it hands the node.
pub async fn attach(c: &mut ControllerClient<Channel>, volume_id: &str, node_id: &str) -> String {
    c.controller_publish_volume(publish_req(volume_id, node_id))
        .await
        .unwrap()
        .into_inner()
        .publish_context["devicePath"]
        .clone()
}

/// The RPCs ControllerGetCapabilities advertises.
pub async fn controller_rpcs(
    c: &mut ControllerClient<Channel>,
) -> Vec<controller_service_capability::rpc::Type> {
    c.controller_get_capabilities(ControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities
        .iter()
        .filter_map(|c| c.rpc_type())
        .collect()
}

/// The RPCs NodeGetCapabilities advertises.
pub async fn node_rpcs(n: &mut NodeClient<Channel>) -> Vec<node_service_capability::rpc::Type> {
    n.node_get_capabilities(NodeGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities
        .iter()
        .filter_map(|c| c.rpc_type())
        .collect()
}

/// What Probe says about readiness.
pub async fn probe_ready(id: &mut IdentityClient<Channel>) -> Option<bool> {
    id.probe(ProbeRequest {}).await.unwrap().into_inner().ready
}

// Node requests as kubelet sends them, for a volume attached at `device`.

pub fn node_stage_req(
    volume_id: &str,
    device: &str,
    staging: &str,
    cap: VolumeCapability,
) -> NodeStageVolumeRequest {
    NodeStageVolumeRequest {
        volume_id: volume_id.into(),
        publish_context: device_ctx(device),
        staging_target_path: staging.into(),
        volume_capability: Some(cap),
        ..Default::default()
    }
}

pub fn node_publish_req(
    volume_id: &str,
    device: &str,
    staging: &str,
    target: &str,
    cap: VolumeCapability,
) -> NodePublishVolumeRequest {
    NodePublishVolumeRequest {
        volume_id: volume_id.into(),
        publish_context: device_ctx(device),
        staging_target_path: staging.into(),
        target_path: target.into(),
        volume_capability: Some(cap),
        ..Default::default()
    }
}

pub fn node_unstage_req(volume_id: &str, staging: &str) -> NodeUnstageVolumeRequest {
    NodeUnstageVolumeRequest {
        volume_id: volume_id.into(),
        staging_target_path: staging.into(),
    }
}

pub fn node_unpublish_req(volume_id: &str, target: &str) -> NodeUnpublishVolumeRequest {
    NodeUnpublishVolumeRequest {
        volume_id: volume_id.into(),
        target_path: target.into(),
    }
}
