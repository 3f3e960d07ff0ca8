//! The driver served in-process on a real unix socket in a temp dir, CSI clients for it,
//! request builders, and a guard that takes down every mount and loop device the test made
//! under its temp dir, also when the test fails.

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
use hostpath_driver::Config;
use test_support::ComponentTask;
use tonic::transport::Channel;

pub const MIB: i64 = 1 << 20;
pub const NODE: &str = "node-a";

/// Why tests that mount and attach loop devices cannot run here, if they cannot.
pub fn missing_root_parts() -> Option<String> {
    if !rustix::process::geteuid().is_root() {
        return Some("not running as root (bind mounts and loop devices need it)".into());
    }
    if !Path::new("/dev/loop-control").exists() {
        return Some("no /dev/loop-control".into());
    }
    for tool in ["losetup", "mount", "umount", "dd", "cp"] {
        let found = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).exists()))
            .unwrap_or(false);
        if !found {
            return Some(format!("{tool} is not on PATH"));
        }
    }
    None
}

/// Whether root-only tests can run; where they cannot, skips (or fails under
/// `CSI_RS_REQUIRE_ALL`) saying why.
pub fn root_parts_or_skip(what: &str) -> bool {
    match missing_root_parts() {
        Some(why) => {
            test_support::skip_or_fail(&format!("{why}; {what}"));
            false
        }
        None => true,
    }
}

/// A temp dir whose mounts and loop devices are taken down on drop, before the dir goes.
pub struct Scratch {
    pub dir: tempfile::TempDir,
}

impl Scratch {
    pub fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    pub fn state_dir(&self) -> PathBuf {
        self.path("state")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        cleanup_under(self.dir.path());
    }
}

/// Unmounts everything mounted under `dir` (deepest first, stacked mounts included) and
/// detaches every loop device whose backing file is under it.
pub fn cleanup_under(dir: &Path) {
    let prefix = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let prefix = prefix.display().to_string();
    for _ in 0..8 {
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut points: Vec<String> = info
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|p| p.starts_with(&prefix))
            .map(str::to_string)
            .collect();
        if points.is_empty() {
            break;
        }
        points.sort_by_key(|p| std::cmp::Reverse(p.len()));
        for p in points {
            let _ = std::process::Command::new("umount").arg(&p).status();
        }
    }
    for dev in loops_under(&prefix) {
        let _ = std::process::Command::new("losetup")
            .args(["--detach", &dev])
            .status();
    }
}

/// Loop devices whose backing file starts with `prefix`.
pub fn loops_under(prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/sys/block") {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.starts_with("loop") {
                continue;
            }
            if let Ok(b) = std::fs::read_to_string(e.path().join("loop/backing_file")) {
                if b.trim_end().starts_with(prefix) {
                    out.push(format!("/dev/{name}"));
                }
            }
        }
    }
    out.sort();
    out
}

/// The loop devices whose backing file is exactly `image`.
pub fn loops_of(image: &Path) -> Vec<String> {
    let image = std::fs::canonicalize(image).unwrap_or_else(|_| image.to_path_buf());
    let image = image.display().to_string();
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/sys/block") {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Ok(b) = std::fs::read_to_string(e.path().join("loop/backing_file")) {
                if b.trim_end() == image {
                    out.push(format!("/dev/{name}"));
                }
            }
        }
    }
    out.sort();
    out
}

/// How many mounts are stacked at `path` now.
pub fn mounts_at(path: &Path) -> usize {
    let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let path = path.display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.split(' ').nth(4) == Some(path.as_str()))
        .count()
}

/// The driver's config for a state dir in `scratch`.
pub fn config(scratch: &Scratch) -> Config {
    Config {
        node_id: NODE.into(),
        state_dir: scratch.state_dir(),
        ..Config::default()
    }
}

/// The driver served on a socket in its own temp dir; stops on drop (or with `stop`).
pub struct Driver {
    task: ComponentTask<hostpath_driver::Error>,
    pub channel: Channel,
    pub endpoint: String,
    /// Declared last: removed once the driver is stopped.
    _dir: tempfile::TempDir,
}

impl Driver {
    pub async fn start(config: Config) -> Driver {
        let dir = tempfile::tempdir().unwrap();
        let endpoint = format!("unix://{}", dir.path().join("csi.sock").display());
        let socket = csi_spec::UnixSocket::bind(&endpoint).unwrap();
        let task = ComponentTask::spawn(|stop| {
            hostpath_driver::serve(socket, config, stop.cancelled_owned())
        });
        let channel = csi_spec::connect_unix(&endpoint).await.unwrap();
        Driver {
            task,
            channel,
            endpoint,
            _dir: dir,
        }
    }

    /// Stops serving and waits until the server is gone; fails the test if it failed.
    pub async fn stop(self) {
        self.task
            .stop("the hostpath driver", Duration::from_secs(30))
            .await;
    }

    pub fn identity(&self) -> IdentityClient<Channel> {
        IdentityClient::new(self.channel.clone())
    }
    pub fn controller(&self) -> ControllerClient<Channel> {
        ControllerClient::new(self.channel.clone())
    }
    pub fn node(&self) -> NodeClient<Channel> {
        NodeClient::new(self.channel.clone())
    }
}

/// Asserts a call failed with `code` and a message containing `needle`.
#[track_caller]
pub fn expect_code<T: std::fmt::Debug>(
    result: Result<tonic::Response<T>, tonic::Status>,
    code: tonic::Code,
    needle: &str,
) {
    match result {
        Ok(r) => panic!("expected {code:?} ({needle}), got OK: {:?}", r.into_inner()),
        Err(s) => {
            assert_eq!(s.code(), code, "{s:?}");
            assert!(
                s.message().contains(needle),
                "message {:?} does not mention {needle:?}",
                s.message()
            );
        }
    }
}

pub fn mount_cap() -> VolumeCapability {
    VolumeCapability::mount("", vec![], Mode::SingleNodeWriter)
}

pub fn block_cap() -> VolumeCapability {
    VolumeCapability::block(Mode::SingleNodeWriter)
}

pub fn create_req(name: &str, bytes: i64, cap: VolumeCapability) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![cap],
        ..Default::default()
    }
}

pub async fn create(
    c: &mut ControllerClient<Channel>,
    name: &str,
    bytes: i64,
    cap: VolumeCapability,
) -> Volume {
    c.create_volume(create_req(name, bytes, cap))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
}

pub fn stage_req(volume_id: &str, staging: &Path, cap: VolumeCapability) -> NodeStageVolumeRequest {
    NodeStageVolumeRequest {
        volume_id: volume_id.into(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(cap),
        ..Default::default()
    }
}

pub fn unstage_req(volume_id: &str, staging: &Path) -> NodeUnstageVolumeRequest {
    NodeUnstageVolumeRequest {
        volume_id: volume_id.into(),
        staging_target_path: staging.display().to_string(),
    }
}

pub fn publish_req(
    volume_id: &str,
    staging: Option<&Path>,
    target: &Path,
    cap: VolumeCapability,
    readonly: bool,
) -> NodePublishVolumeRequest {
    NodePublishVolumeRequest {
        volume_id: volume_id.into(),
        staging_target_path: staging.map(|s| s.display().to_string()).unwrap_or_default(),
        target_path: target.display().to_string(),
        volume_capability: Some(cap),
        readonly,
        ..Default::default()
    }
}

pub fn unpublish_req(volume_id: &str, target: &Path) -> NodeUnpublishVolumeRequest {
    NodeUnpublishVolumeRequest {
        volume_id: volume_id.into(),
        target_path: target.display().to_string(),
    }
}

pub fn stats_req(volume_id: &str, path: &Path) -> NodeGetVolumeStatsRequest {
    NodeGetVolumeStatsRequest {
        volume_id: volume_id.into(),
        volume_path: path.display().to_string(),
        staging_target_path: String::new(),
    }
}

pub fn ephemeral_context() -> HashMap<String, String> {
    [(
        hostpath_driver::EPHEMERAL_CONTEXT_KEY.to_string(),
        "true".to_string(),
    )]
    .into()
}

/// All volume IDs through ListVolumes, following next_token with pages of `page`.
pub async fn list_all(c: &mut ControllerClient<Channel>, page: i32) -> Vec<String> {
    let mut ids = Vec::new();
    let mut token = String::new();
    loop {
        let r = c
            .list_volumes(ListVolumesRequest {
                max_entries: page,
                starting_token: token.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(page == 0 || r.entries.len() <= usize::try_from(page).unwrap());
        ids.extend(r.entries.into_iter().map(|e| e.volume.unwrap().volume_id));
        if r.next_token.is_empty() {
            return ids;
        }
        token = r.next_token;
    }
}
