//! The node service through its gRPC face: a real tonic client on a real unix socket, the way
//! kubelet calls a driver, against real loop devices.
// The Driver fixture and the check helper are plain fns, not #[test]s; a failure in them is a
// test failure, so unwrap is the right tool there too.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::{MIB, VOL_A, blkid_type};
use csi_spec::v1::identity_client::IdentityClient;
use csi_spec::v1::node_client::NodeClient;
use csi_spec::v1::node_service_capability::rpc::Type as Rpc;
use csi_spec::v1::plugin_capability::service::Type as PluginService;
use csi_spec::v1::volume_capability::access_mode::Mode;
use csi_spec::v1::volume_usage::Unit;
use csi_spec::v1::*;
use ebs_driver::{DriverConfig, IdentityConfig, NodeConfig, NodeInfo};
use tonic::Code;
use tonic::transport::Channel;

/// A driver served on a socket in its own temp dir; stops (and removes the socket) on drop.
struct Driver {
    _dir: tempfile::TempDir,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    channel: Channel,
}

impl Driver {
    async fn start(node: NodeConfig) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let endpoint = format!("unix://{}", dir.path().join("csi.sock").display());
        let socket = csi_spec::UnixSocket::bind(&endpoint).unwrap();
        let config = DriverConfig {
            endpoint: endpoint.clone(),
            identity: IdentityConfig::default(),
            node,
            node_info: NodeInfo {
                node_id: "i-0123456789abcdef0".into(),
                zone: Some("us-east-1a".into()),
                max_volumes_per_node: 25,
            },
            mode: ebs_driver::Mode::Node,
            ..DriverConfig::default()
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(ebs_driver::serve(socket, config, async {
            let _ = stopped.await;
        }));
        let channel = csi_spec::connect_unix(&endpoint).await.unwrap();
        Self {
            _dir: dir,
            stop: Some(stop),
            channel,
        }
    }

    fn node(&self) -> NodeClient<Channel> {
        NodeClient::new(self.channel.clone())
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

fn ctx() -> HashMap<String, String> {
    HashMap::from([("devicePath".to_string(), "/dev/xvdba".to_string())])
}

fn mount_cap(fs: &str) -> Option<VolumeCapability> {
    Some(VolumeCapability::mount(
        fs,
        vec!["noatime".into()],
        Mode::SingleNodeWriter,
    ))
}

fn stage(staging: &str, cap: Option<VolumeCapability>) -> NodeStageVolumeRequest {
    NodeStageVolumeRequest {
        volume_id: VOL_A.into(),
        publish_context: ctx(),
        staging_target_path: staging.into(),
        volume_capability: cap,
        ..Default::default()
    }
}

fn publish(
    staging: &str,
    target: &str,
    cap: Option<VolumeCapability>,
    readonly: bool,
) -> NodePublishVolumeRequest {
    NodePublishVolumeRequest {
        volume_id: VOL_A.into(),
        publish_context: ctx(),
        staging_target_path: staging.into(),
        target_path: target.into(),
        volume_capability: cap,
        readonly,
        ..Default::default()
    }
}

/// NodeExpandVolume of VOL_A at `path` to `required_bytes`.
fn expand(path: &str, required_bytes: i64) -> NodeExpandVolumeRequest {
    NodeExpandVolumeRequest {
        volume_id: VOL_A.into(),
        volume_path: path.into(),
        capacity_range: Some(CapacityRange {
            required_bytes,
            limit_bytes: 0,
        }),
        ..Default::default()
    }
}

#[tokio::test]
async fn identity_capabilities_and_node_info() {
    let d = Driver::start(NodeConfig::default()).await;
    let mut id = IdentityClient::new(d.channel.clone());
    let info = id
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "ebs.csi.aws.com");
    assert!(!info.vendor_version.is_empty());
    let caps = id
        .get_plugin_capabilities(GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    let services: Vec<_> = caps
        .capabilities
        .iter()
        .filter_map(|c| c.service_type())
        .collect();
    assert!(services.contains(&PluginService::VolumeAccessibilityConstraints));
    assert!(
        !services.contains(&PluginService::ControllerService),
        "node mode has no controller"
    );
    assert_eq!(
        id.probe(ProbeRequest {}).await.unwrap().into_inner().ready,
        Some(true)
    );

    let mut node = d.node();
    let caps = node
        .node_get_capabilities(NodeGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    let rpcs: Vec<_> = caps
        .capabilities
        .iter()
        .filter_map(|c| c.rpc_type())
        .collect();
    assert_eq!(
        rpcs,
        vec![
            Rpc::StageUnstageVolume,
            Rpc::GetVolumeStats,
            Rpc::ExpandVolume,
            Rpc::SingleNodeMultiWriter
        ]
    );
    let info = node
        .node_get_info(NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.node_id, "i-0123456789abcdef0");
    assert_eq!(info.max_volumes_per_node, 25);
    let segments = info.accessible_topology.unwrap().segments;
    assert_eq!(segments["topology.ebs.csi.aws.com/zone"], "us-east-1a");
    assert_eq!(segments["topology.kubernetes.io/zone"], "us-east-1a");
}

#[track_caller]
fn check<T: std::fmt::Debug>(r: Result<tonic::Response<T>, tonic::Status>, field: &str) {
    let s = r.unwrap_err();
    assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
    assert!(s.message().contains(field), "{field}: {}", s.message());
}

#[tokio::test]
async fn missing_and_bad_fields_are_invalid_argument_naming_the_field() {
    let d = Driver::start(NodeConfig::default()).await;
    let mut node = d.node();
    let mut r = stage("/s", mount_cap("ext4"));
    r.volume_id.clear();
    check(node.node_stage_volume(r).await, "volume_id");
    check(
        node.node_stage_volume(stage("", mount_cap("ext4"))).await,
        "staging_target_path",
    );
    check(
        node.node_stage_volume(stage("/s", None)).await,
        "volume_capability",
    );
    let multi = VolumeCapability::mount("ext4", vec![], Mode::MultiNodeReaderOnly);
    check(
        node.node_stage_volume(stage("/s", Some(multi))).await,
        "volume_capability.access_mode",
    );
    let mut no_type = VolumeCapability::block(Mode::SingleNodeWriter);
    no_type.access_type = None;
    check(
        node.node_stage_volume(stage("/s", Some(no_type))).await,
        "volume_capability.access_type",
    );
    check(
        node.node_stage_volume(stage("/s", mount_cap("ntfs"))).await,
        "ntfs",
    );
    // An ID that cannot be an EBS volume is a volume that does not exist, not a bad field.
    let mut r = stage("/s", mount_cap("ext4"));
    r.volume_id = "vol-xyz".into();
    let s = node.node_stage_volume(r).await.unwrap_err();
    assert_eq!(s.code(), Code::NotFound, "{s:?}");
    assert!(s.message().contains("vol-xyz"), "{s:?}");
    let mut r = stage("/s", mount_cap("ext4"));
    r.publish_context
        .insert("devicePath".into(), "/etc/passwd".into());
    check(
        node.node_stage_volume(r).await,
        "publish_context.devicePath",
    );
    check(
        node.node_publish_volume(publish("/s", "", mount_cap("ext4"), false))
            .await,
        "target_path",
    );
    // With STAGE_UNSTAGE_VOLUME, a missing staging path is the spec's "staging target path not
    // set" row.
    let s = node
        .node_publish_volume(publish("", "/t", mount_cap("ext4"), false))
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::FailedPrecondition, "{s:?}");
    assert!(s.message().contains("staging_target_path"), "{s:?}");
    // ...but a request that also lacks a required field is INVALID_ARGUMENT naming it
    // (csi-sanity's NodePublishVolume "should fail when no target path / no volume capability
    // is provided" send no staging path either).
    check(
        node.node_publish_volume(publish("", "", mount_cap("ext4"), false))
            .await,
        "target_path",
    );
    check(
        node.node_publish_volume(publish("", "/t", None, false))
            .await,
        "volume_capability",
    );
    check(
        node.node_unstage_volume(NodeUnstageVolumeRequest {
            volume_id: VOL_A.into(),
            staging_target_path: String::new(),
        })
        .await,
        "staging_target_path",
    );
    check(
        node.node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: String::new(),
            target_path: "/t".into(),
        })
        .await,
        "volume_id",
    );
    check(
        node.node_get_volume_stats(NodeGetVolumeStatsRequest {
            volume_id: VOL_A.into(),
            ..Default::default()
        })
        .await,
        "volume_path",
    );
    check(
        node.node_expand_volume(expand("/t", -1)).await,
        "capacity_range.required_bytes",
    );
    // A path that holds no volume is NotFound, not an internal error.
    let s = node
        .node_get_volume_stats(NodeGetVolumeStatsRequest {
            volume_id: VOL_A.into(),
            volume_path: "/nonexistent/volume".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::NotFound, "{s:?}");
}

#[tokio::test]
async fn full_node_lifecycle_over_the_socket() {
    let Some(mut fx) = fixture!() else { return };
    // xfs wants at least 300 MB.
    let dev = fx.attach_linked(VOL_A, 512 * MIB, "xvdba");
    let d = Driver::start(fx.config()).await;
    let mut node = d.node();
    let staging = fx.path("plugins/staging").display().to_string();
    let target = fx.path("pods/p1/volumes/mount").display().to_string();

    // Publish before stage: FailedPrecondition.
    let s = node
        .node_publish_volume(publish(&staging, &target, mount_cap("xfs"), false))
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::FailedPrecondition, "{s:?}");

    for _ in 0..2 {
        node.node_stage_volume(stage(&staging, mount_cap("xfs")))
            .await
            .unwrap();
    }
    assert_eq!(blkid_type(&dev).as_deref(), Some("xfs"));
    let opts = fx.mounted(std::path::Path::new(&staging)).unwrap();
    assert!(
        opts.split(',').any(|o| o == "noatime"),
        "mount flags applied: {opts}"
    );

    for _ in 0..2 {
        node.node_publish_volume(publish(&staging, &target, mount_cap("xfs"), false))
            .await
            .unwrap();
    }
    std::fs::write(format!("{target}/hello"), b"survives restage").unwrap();
    // Same target, now asking read-only: incompatible with what is published.
    let s = node
        .node_publish_volume(publish(&staging, &target, mount_cap("xfs"), true))
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::AlreadyExists, "{s:?}");

    let stats = node
        .node_get_volume_stats(NodeGetVolumeStatsRequest {
            volume_id: VOL_A.into(),
            volume_path: target.clone(),
            staging_target_path: staging.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let bytes = stats
        .usage
        .iter()
        .find(|u| u.unit == i32::from(Unit::Bytes))
        .unwrap();
    let inodes = stats
        .usage
        .iter()
        .find(|u| u.unit == i32::from(Unit::Inodes))
        .unwrap();
    assert!(
        bytes.total > 400 * MIB as i64 && bytes.total <= 512 * MIB as i64,
        "{bytes:?}"
    );
    assert!(
        bytes.used > 0 && bytes.available > 0 && inodes.total > 0,
        "{stats:?}"
    );

    fx.grow(VOL_A, &dev, 1024 * MIB);
    let expanded = node
        .node_expand_volume(expand(&target, (1024 * MIB) as i64))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(expanded.capacity_bytes, (1024 * MIB) as i64);

    for _ in 0..2 {
        node.node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: VOL_A.into(),
            target_path: target.clone(),
        })
        .await
        .unwrap();
        node.node_unstage_volume(NodeUnstageVolumeRequest {
            volume_id: VOL_A.into(),
            staging_target_path: staging.clone(),
        })
        .await
        .unwrap();
    }
    assert!(
        fx.mounts().is_empty(),
        "nothing left mounted: {:?}",
        fx.mounts()
    );
    assert!(!std::path::Path::new(&target).exists());

    // Stage and publish again: the data is still there, nothing was reformatted.
    node.node_stage_volume(stage(&staging, mount_cap("xfs")))
        .await
        .unwrap();
    node.node_publish_volume(publish(&staging, &target, mount_cap("xfs"), true))
        .await
        .unwrap();
    assert_eq!(
        std::fs::read(format!("{target}/hello")).unwrap(),
        b"survives restage"
    );
    assert!(
        std::fs::write(format!("{target}/x"), b"x").is_err(),
        "read-only publish"
    );
}

#[tokio::test]
async fn raw_block_over_the_socket() {
    let Some(mut fx) = fixture!() else { return };
    let dev = fx.attach_linked(VOL_A, 64 * MIB, "xvdba");
    let d = Driver::start(fx.config()).await;
    let mut node = d.node();
    let staging = fx.path("plugins/staging").display().to_string();
    let target = fx.path("pods/p1/volumeDevices/dev").display().to_string();
    let block = Some(VolumeCapability::block(Mode::SingleNodeWriter));
    node.node_stage_volume(stage(&staging, block.clone()))
        .await
        .unwrap();
    node.node_publish_volume(publish(&staging, &target, block.clone(), false))
        .await
        .unwrap();
    assert_eq!(
        common::rdev(std::path::Path::new(&target)),
        common::rdev(&dev)
    );
    let stats = node
        .node_get_volume_stats(NodeGetVolumeStatsRequest {
            volume_id: VOL_A.into(),
            volume_path: target.clone(),
            staging_target_path: staging.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stats.usage.len(), 1);
    assert_eq!(stats.usage[0].total, (64 * MIB) as i64);
    node.node_unpublish_volume(NodeUnpublishVolumeRequest {
        volume_id: VOL_A.into(),
        target_path: target.clone(),
    })
    .await
    .unwrap();
    assert!(!std::path::Path::new(&target).exists());
}

#[tokio::test]
async fn a_second_call_while_one_runs_is_aborted_and_stale_links_are_internal() {
    let Some(mut fx) = fixture!() else { return };
    let b = fx.attach(common::VOL_B, 64 * MIB);
    fx.link("xvdbb", &b);
    let mut cfg = fx.config();
    cfg.device_wait = Duration::from_secs(2);
    let d = Driver::start(cfg).await;
    let staging = fx.path("staging").display().to_string();
    // A's device never shows up: whichever of two concurrent stages takes the volume first waits
    // the whole device wait for it (NotFound in the end), and the other, arriving meanwhile, is
    // refused at once (Aborted). Which one is which does not matter; that both happen does.
    let (mut c1, mut c2) = (d.node(), d.node());
    let (r1, r2) = tokio::join!(
        c1.node_stage_volume(stage(&staging, mount_cap("ext4"))),
        c2.node_stage_volume(stage(&staging, mount_cap("ext4")))
    );
    let mut codes = [r1.unwrap_err(), r2.unwrap_err()];
    codes.sort_by_key(|s| s.code() as i32);
    let [not_found, aborted] = codes;
    assert_eq!(not_found.code(), Code::NotFound, "{not_found:?}");
    assert_eq!(aborted.code(), Code::Aborted, "{aborted:?}");
    assert!(aborted.message().contains(VOL_A), "{aborted:?}");

    // /dev/xvdbb belongs to B: staging A through it is refused, naming B.
    let mut r = stage(&staging, mount_cap("ext4"));
    r.publish_context
        .insert("devicePath".into(), "/dev/xvdbb".into());
    let s = d.node().node_stage_volume(r).await.unwrap_err();
    assert_eq!(s.code(), Code::Internal, "{s:?}");
    assert!(s.message().contains(common::VOL_B), "{s:?}");
    assert_eq!(blkid_type(&b), None);
}

/// NodeStage and NodeExpand rows that are FAILED_PRECONDITION (the volume or the node is not in
/// the state the call needs, and retrying as is will not help), over the socket.
#[tokio::test]
async fn failed_precondition_rows_over_the_socket() {
    let Some(mut fx) = fixture!() else { return };
    if !common::on_path("debugfs") {
        test_support::skip_or_fail("debugfs is not on PATH; this test corrupts an ext4 with it");
        return;
    }
    let a = fx.attach_linked(VOL_A, 64 * MIB, "xvdba");
    let b = fx.attach_linked(common::VOL_B, 64 * MIB, "xvdbb");
    let d = Driver::start(fx.config()).await;
    let mut node = d.node();
    let staging = fx.path("staging").display().to_string();
    let fail = |s: tonic::Status, needle: &str| {
        assert_eq!(s.code(), Code::FailedPrecondition, "{s:?}");
        assert!(s.message().contains(needle), "{needle}: {s:?}");
    };

    // Another volume is staged at the staging path.
    let mut stage_b = stage(&staging, mount_cap("ext4"));
    stage_b.volume_id = common::VOL_B.into();
    stage_b
        .publish_context
        .insert("devicePath".into(), "/dev/xvdbb".into());
    node.node_stage_volume(stage_b).await.unwrap();
    let s = node
        .node_stage_volume(stage(&staging, mount_cap("ext4")))
        .await
        .unwrap_err();
    fail(s, &b.display().to_string());
    node.node_unstage_volume(NodeUnstageVolumeRequest {
        volume_id: common::VOL_B.into(),
        staging_target_path: staging.clone(),
    })
    .await
    .unwrap();

    // A's device holds a partition table: not blank, nothing to mount.
    {
        use std::io::{Seek, SeekFrom, Write};
        let mut f = std::fs::OpenOptions::new().write(true).open(&a).unwrap();
        f.seek(SeekFrom::Start(446)).unwrap();
        let mut entry = vec![0u8, 0, 0, 0, 0x83, 0, 0, 0];
        entry.extend_from_slice(&2048u32.to_le_bytes());
        entry.extend_from_slice(&4096u32.to_le_bytes());
        f.write_all(&entry).unwrap();
        f.seek(SeekFrom::Start(510)).unwrap();
        f.write_all(&[0x55, 0xaa]).unwrap();
        f.sync_all().unwrap();
    }
    let s = node
        .node_stage_volume(stage(&staging, mount_cap("ext4")))
        .await
        .unwrap_err();
    fail(s, "partition table");

    // An ext4 that e2fsck -p cannot repair is not mounted.
    let dev = a.to_str().unwrap();
    common::run("wipefs", &["-a", "-q", dev]);
    common::run("mkfs.ext4", &["-q", dev]);
    common::run("debugfs", &["-w", "-R", "clri <2>", dev]);
    common::run("debugfs", &["-w", "-R", "ssv state 0", dev]);
    let s = node
        .node_stage_volume(stage(&staging, mount_cap("ext4")))
        .await
        .unwrap_err();
    fail(s, "e2fsck");
    assert!(fx.mounted(std::path::Path::new(&staging)).is_none());

    // NodeExpand asking for more than the device has: the resize has not reached the node.
    common::run("mkfs.ext4", &["-q", "-F", dev]);
    node.node_stage_volume(stage(&staging, mount_cap("ext4")))
        .await
        .unwrap();
    let s = node
        .node_expand_volume(expand(&staging, (128 * MIB) as i64))
        .await
        .unwrap_err();
    fail(s, "less than");
}
