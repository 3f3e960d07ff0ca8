//! CSI mount and unmount: the kubelet's CSI attacher (`WaitForAttach`, `MountDevice` =
//! NodeStage, `UnmountDevice` = NodeUnstage) and mounter (`SetUp` = NodePublish, `TearDown` =
//! NodeUnpublish), with `vol_data.json` written before each stage and publish so that a crash
//! in the middle is found and cleaned up by reconstruction.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use csi_spec::v1::node_client::NodeClient;
use csi_spec::v1::volume_capability::{
    AccessMode, AccessType, BlockVolume, MountVolume, access_mode::Mode,
};
use csi_spec::v1::{
    NodePublishVolumeRequest, NodeStageVolumeRequest, NodeUnpublishVolumeRequest,
    NodeUnstageVolumeRequest, VolumeCapability,
};

use super::sa_tokens;
use super::vol_data::{self, VolData};
use super::{
    MountFailure, MountRequest, Mounted, OpContext, OpError, Progress, Step, is_final, make_dir,
    read_secret, remove_empty_dirs,
};
use crate::drivers::RegisteredDriver;
use crate::volumemanager::cache::{MountedVolume, StagedVolume, VolumeHandle};
use crate::volumemanager::volume_spec::{AccessMode as PvAccess, CsiMount};

/// The message the kubelet gives for a driver that has not registered.
pub fn not_registered(driver: &str) -> String {
    format!(
        "kubernetes.io/csi: driver name {driver} not found in the list of registered CSI drivers"
    )
}

/// A gRPC failure as the kubelet's Events show it (grpc-go's text).
fn rpc_error(status: &tonic::Status) -> String {
    format!(
        "rpc error: code = {} desc = {}",
        csi_spec::go_code_name(status.code()),
        status.message()
    )
}

fn driver(ctx: &OpContext, name: &str, step: Step) -> Result<RegisteredDriver, OpError> {
    ctx.drivers
        .get(name)
        .ok_or_else(|| OpError::new(step, not_registered(name)))
}

/// The volume capability as the kubelet sends it: ReadWriteOnce and ReadWriteOncePod are told
/// apart (SINGLE_NODE_MULTI_WRITER / SINGLE_NODE_SINGLE_WRITER) only to a driver that
/// advertises SINGLE_NODE_MULTI_WRITER; any other driver gets SINGLE_NODE_WRITER for both,
/// the mode every CSI driver knows.
fn capability(c: &CsiMount, multi_writer: bool) -> VolumeCapability {
    let mode = match c.access_mode {
        PvAccess::SingleNodeWriter if multi_writer => Mode::SingleNodeMultiWriter,
        PvAccess::SingleNodeSingleWriter if multi_writer => Mode::SingleNodeSingleWriter,
        PvAccess::SingleNodeWriter | PvAccess::SingleNodeSingleWriter => Mode::SingleNodeWriter,
        PvAccess::MultiNodeReaderOnly => Mode::MultiNodeReaderOnly,
        PvAccess::MultiNodeMultiWriter => Mode::MultiNodeMultiWriter,
    };
    let access_type = if c.block {
        AccessType::Block(BlockVolume {})
    } else {
        AccessType::Mount(MountVolume {
            fs_type: c.fs_type.clone(),
            mount_flags: c.mount_options.clone(),
            volume_mount_group: String::new(),
        })
    };
    VolumeCapability {
        access_type: Some(access_type),
        access_mode: Some(AccessMode { mode: mode as i32 }),
    }
}

fn request<T>(ctx: &OpContext, message: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(message);
    req.set_timeout(ctx.csi_timeout);
    req
}

fn path_str(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

pub(super) async fn mount(ctx: &OpContext, req: &MountRequest) -> Result<Mounted, MountFailure> {
    Progress::track(async |p: &mut Progress| mount_steps(ctx, req, p).await).await
}

async fn mount_steps(
    ctx: &OpContext,
    req: &MountRequest,
    progress: &mut Progress,
) -> Result<Mounted, OpError> {
    let v = &req.volume;
    let Some(c) = v.csi() else {
        return Err(OpError::new(Step::MountDevice, "not a CSI volume"));
    };
    // WaitForAttach: the VolumeAttachment the attach/detach controller made, attached by the
    // external attacher; none for a driver that needs no attach.
    let (publish_context, attachment_id) = if c.ephemeral {
        (BTreeMap::new(), String::new())
    } else {
        let attached = ctx
            .csi
            .wait_for_attach(&c.driver, &c.handle, &ctx.node_name, ctx.attach_timeout)
            .await
            .map_err(|e| OpError::new(Step::WaitForAttach, attach_error(&e)))?;
        (
            attached.attachment_metadata,
            attached.volume_attachment.unwrap_or_default(),
        )
    };
    let publish_context: HashMap<String, String> = publish_context.into_iter().collect();
    let drv = driver(ctx, &c.driver, Step::MountDevice)?;
    let mut client = NodeClient::new(drv.channel.clone());
    let lifecycle = if c.ephemeral {
        "Ephemeral"
    } else {
        "Persistent"
    };
    let vol_data = VolData {
        spec_vol_id: v.spec_name.clone(),
        volume_handle: c.handle.clone(),
        driver_name: c.driver.clone(),
        node_name: ctx.node_name.clone(),
        attachment_id,
        volume_lifecycle_mode: lifecycle.into(),
    };
    let handle = VolumeHandle::Csi {
        driver: c.driver.clone(),
        handle: c.handle.clone(),
        block: c.block,
        ephemeral: c.ephemeral,
    };

    // MountDevice = NodeStage, once per volume and node.
    let staged = match &req.already_staged {
        Some(s) => s.clone(),
        None => {
            let staging_path = if drv.stage_unstage && !c.ephemeral {
                let (staging, data_file) = if c.block {
                    (
                        ctx.paths.csi_block_staging_path(&v.spec_name),
                        ctx.paths.csi_block_vol_data(&v.spec_name),
                    )
                } else {
                    (
                        ctx.paths.csi_staging_path(&c.driver, &c.handle),
                        ctx.paths.csi_staging_vol_data(&c.driver, &c.handle),
                    )
                };
                vol_data::write(&data_file, &vol_data).await.map_err(|e| {
                    OpError::new(
                        Step::MountDevice,
                        format!("writing {}: {e}", data_file.display()),
                    )
                })?;
                make_dir(&staging, Step::MountDevice).await?;
                let secrets = match &c.stage_secret {
                    Some(r) => read_secret(&ctx.client, r, Step::MountDevice).await?,
                    None => HashMap::new(),
                };
                let started = std::time::Instant::now();
                let staged = client
                    .node_stage_volume(request(
                        ctx,
                        NodeStageVolumeRequest {
                            volume_id: c.handle.clone(),
                            publish_context: publish_context.clone(),
                            staging_target_path: path_str(&staging),
                            volume_capability: Some(capability(c, drv.single_node_multi_writer)),
                            secrets,
                            volume_context: c.volume_context.clone().into_iter().collect(),
                        },
                    ))
                    .await;
                if let Err(s) = staged {
                    if !is_final(&s) || left_mounted(&staging, "NodeStageVolume", &s).await {
                        progress.staged = Some(StagedVolume {
                            unique_name: v.unique_name.clone(),
                            spec_name: v.spec_name.clone(),
                            handle: handle.clone(),
                            staging_path: Some(staging.clone()),
                            reported_in_use: req.reported_in_use,
                            uncertain: true,
                        });
                    }
                    return Err(OpError::new(Step::MountDevice, rpc_error(&s)));
                }
                tracing::info!(volume = %v.unique_name, staging = %staging.display(), elapsed_ms = started.elapsed().as_millis() as u64, "MountVolume.MountDevice succeeded (NodeStageVolume)");
                Some(staging)
            } else {
                None
            };
            StagedVolume {
                unique_name: v.unique_name.clone(),
                spec_name: v.spec_name.clone(),
                handle: handle.clone(),
                staging_path,
                reported_in_use: req.reported_in_use,
                uncertain: false,
            }
        }
    };
    // Staged: whatever fails from here on, the stage is recorded (and torn down when no pod
    // wants the volume any more).
    progress.staged = Some(staged.clone());

    // SetUp = NodePublish into the pod.
    let (target, data_file, host_path) = if c.block {
        (
            ctx.paths.csi_block_publish_path(&v.spec_name, &req.pod.uid),
            ctx.paths.csi_block_vol_data(&v.spec_name),
            ctx.paths.pod_block_link(&req.pod.uid, &v.spec_name),
        )
    } else {
        let target = ctx.paths.csi_publish_path(&req.pod.uid, &v.spec_name);
        let dir = ctx.paths.csi_pod_volume_dir(&req.pod.uid, &v.spec_name);
        (
            target.clone(),
            dir.join(super::super::paths::VOL_DATA_FILE),
            target,
        )
    };
    vol_data::write(&data_file, &vol_data)
        .await
        .map_err(|e| OpError::new(Step::SetUp, format!("writing {}: {e}", data_file.display())))?;
    if let Some(parent) = target.parent() {
        make_dir(parent, Step::SetUp).await?;
    }
    let secrets = match &c.publish_secret {
        Some(r) => read_secret(&ctx.client, r, Step::SetUp).await?,
        None => HashMap::new(),
    };
    let mut volume_context: HashMap<String, String> =
        c.volume_context.clone().into_iter().collect();
    let csidriver = ctx.csidrivers.get(&c.driver);
    let pod_info = csidriver
        .as_ref()
        .and_then(|d| d.spec.pod_info_on_mount)
        .unwrap_or(false);
    if pod_info {
        volume_context.insert("csi.storage.k8s.io/pod.name".into(), req.pod.name.clone());
        volume_context.insert(
            "csi.storage.k8s.io/pod.namespace".into(),
            req.pod.namespace.clone(),
        );
        volume_context.insert("csi.storage.k8s.io/pod.uid".into(), req.pod.uid.clone());
        volume_context.insert(
            "csi.storage.k8s.io/serviceAccount.name".into(),
            req.pod.service_account.clone(),
        );
        // Whether this is an inline ephemeral volume: only with the pod's info, as the
        // kubelet sends it ("false" for a persistent one).
        volume_context.insert(
            crate::volumemanager::volume_spec::EPHEMERAL_CONTEXT_KEY.into(),
            c.ephemeral.to_string(),
        );
    }
    // The pod's service account tokens, when the CSIDriver asks for them (with or without
    // the pod's info); a token that cannot be had fails the publish before it starts.
    let token_requests = csidriver
        .as_ref()
        .and_then(|d| d.spec.token_requests.clone())
        .unwrap_or_default();
    if !token_requests.is_empty() {
        let tokens = sa_tokens::tokens_for(&ctx.client, &ctx.tokens, &req.pod, &token_requests)
            .await
            .map_err(|e| OpError::new(Step::SetUp, format!("{}: {e}", sa_tokens::FAILED)))?;
        volume_context.insert(sa_tokens::TOKENS_CONTEXT_KEY.into(), tokens);
    }
    let published = MountedVolume {
        unique_name: v.unique_name.clone(),
        pod_uid: req.pod.uid.clone(),
        outer_name: v.outer_name.clone(),
        spec_name: v.spec_name.clone(),
        handle,
        host_path,
        uncertain: true,
        reported_in_use: req.reported_in_use,
    };
    let started = std::time::Instant::now();
    let result = client
        .node_publish_volume(request(
            ctx,
            NodePublishVolumeRequest {
                volume_id: c.handle.clone(),
                publish_context,
                staging_target_path: staged
                    .staging_path
                    .as_deref()
                    .map(path_str)
                    .unwrap_or_default(),
                target_path: path_str(&target),
                volume_capability: Some(capability(c, drv.single_node_multi_writer)),
                readonly: v.read_only,
                secrets,
                volume_context,
            },
        ))
        .await;
    if let Err(s) = result {
        if !is_final(&s) || left_mounted(&target, "NodePublishVolume", &s).await {
            progress.published = Some(published);
        }
        return Err(OpError::new(Step::SetUp, rpc_error(&s)));
    }
    // Published; until the block device link is in place too, the pod's volume is uncertain
    // (published again, or unpublished if the pod goes).
    progress.published = Some(published.clone());
    if c.block {
        link_block_device(&target, &published.host_path).await?;
    }
    tracing::info!(volume = %v.unique_name, pod = %format!("{}/{}", req.pod.namespace, req.pod.name), target = %target.display(), elapsed_ms = started.elapsed().as_millis() as u64, "MountVolume.SetUp succeeded (NodePublishVolume)");
    Ok(Mounted {
        staged,
        mounted: MountedVolume {
            uncertain: false,
            ..published
        },
    })
}

/// The pod's link to its block device (a symlink to the published device file).
async fn link_block_device(target: &Path, link: &Path) -> Result<(), OpError> {
    if let Some(parent) = link.parent() {
        make_dir(parent, Step::SetUp).await?;
    }
    match tokio::fs::read_link(link).await {
        Ok(existing) if existing == target => return Ok(()),
        Ok(_) => {
            let _ = tokio::fs::remove_file(link).await;
        }
        Err(_) => {}
    }
    tokio::fs::symlink(target, link)
        .await
        .map_err(|e| OpError::new(Step::SetUp, format!("linking {}: {e}", link.display())))
}

/// A teardown call answered NOT_FOUND: the driver no longer knows the volume (an ephemeral
/// volume it deleted at the first unpublish, whose result a restart lost; a volume deleted
/// behind the node's back). There is nothing left to undo through the driver; whether the
/// path is still mounted is checked right after, so a driver that forgot a mounted volume
/// still fails the teardown.
fn gone_is_done<T>(
    result: Result<T, tonic::Status>,
    step: Step,
    handle: &str,
) -> Result<(), OpError> {
    match result {
        Ok(_) => Ok(()),
        Err(s) if s.code() == tonic::Code::NotFound => {
            tracing::info!(
                volume_handle = handle,
                step = step.as_str(),
                message = s.message(),
                "the driver does not know the volume any more; treated as done"
            );
            Ok(())
        }
        Err(s) => Err(OpError::new(step, rpc_error(&s))),
    }
}

fn attach_error(e: &volume_plugins::Error) -> String {
    match e {
        volume_plugins::Error::AttachFailed {
            volume_attachment,
            message,
        } => format!("VolumeAttachment {volume_attachment} failed to attach: {message}"),
        other => other.to_string(),
    }
}

fn csi_handle(v: &VolumeHandle) -> Option<(&str, &str, bool)> {
    match v {
        VolumeHandle::Csi {
            driver,
            handle,
            block,
            ..
        } => Some((driver, handle, *block)),
        VolumeHandle::AwsEbs { .. } => None,
    }
}

pub(super) async fn unpublish(ctx: &OpContext, v: &MountedVolume) -> Result<(), OpError> {
    let Some((driver_name, handle, block)) = csi_handle(&v.handle) else {
        return Err(OpError::new(Step::TearDown, "not a CSI volume"));
    };
    let drv = driver(ctx, driver_name, Step::TearDown)?;
    let target = if block {
        ctx.paths.csi_block_publish_path(&v.spec_name, &v.pod_uid)
    } else {
        ctx.paths.csi_publish_path(&v.pod_uid, &v.spec_name)
    };
    let unpublished = NodeClient::new(drv.channel.clone())
        .node_unpublish_volume(request(
            ctx,
            NodeUnpublishVolumeRequest {
                volume_id: handle.to_string(),
                target_path: path_str(&target),
            },
        ))
        .await;
    gone_is_done(unpublished, Step::TearDown, handle)?;
    if block {
        let link = ctx.paths.pod_block_link(&v.pod_uid, &v.spec_name);
        let _ = tokio::fs::remove_file(&link).await;
        let _ = tokio::fs::remove_file(&target).await;
        if let Some(parent) = target.parent() {
            remove_empty_dirs(parent.to_path_buf(), ctx.paths.root()).await;
        }
        remove_empty_dirs(
            link.parent().map(Path::to_path_buf).unwrap_or_default(),
            &ctx.paths.pod_dir(&v.pod_uid),
        )
        .await;
    } else {
        // The driver removed the target (or left an empty dir): the kubelet removes the
        // dir, vol_data.json and the volume's dir.
        remove_unmounted_dir(&target).await?;
        let dir = ctx.paths.csi_pod_volume_dir(&v.pod_uid, &v.spec_name);
        let _ = tokio::fs::remove_file(dir.join(super::super::paths::VOL_DATA_FILE)).await;
        remove_empty_dirs(dir, &ctx.paths.pod_dir(&v.pod_uid)).await;
    }
    tracing::info!(volume = %v.unique_name, pod_uid = %v.pod_uid, "UnmountVolume.TearDown succeeded (NodeUnpublishVolume)");
    Ok(())
}

/// Whether a stage or publish that failed with a final code left `path` mounted anyway. The
/// kubelet believes a final code and records nothing, so a driver that mounted and then failed
/// a later step (a resize, a fsck, an answer lost behind a proxy) without unmounting leaves a
/// mount that nothing tears down, and the volume drops out of volumesInUse while mounted: the
/// attach/detach controller may detach it under the mount. We look at the mount table instead
/// (a deliberate difference from the kubelet, docs/node-agent.md): a mount that is there is
/// recorded as uncertain, kept in use, and torn down when no pod wants it. `csi-cluster chaos`
/// found this with a fault after a NodeStage that had succeeded.
async fn left_mounted(path: &Path, call: &str, status: &tonic::Status) -> bool {
    let Ok(entry) = mount_utils::findmnt::mounted_at(path).await else {
        // Unknown: assume the worst, as for a non-final code.
        return true;
    };
    let mounted = entry.is_some();
    if mounted {
        tracing::warn!(path = %path.display(), code = ?status.code(), "{call} failed with a final code but left its target mounted: recorded as uncertain");
    }
    mounted
}

/// Removes `dir` if it is still there and not a mount point; a mount still there is an error
/// (the driver said it unpublished, but the kernel disagrees).
async fn remove_unmounted_dir(dir: &Path) -> Result<(), OpError> {
    if tokio::fs::symlink_metadata(dir).await.is_err() {
        return Ok(());
    }
    let mounted = mount_utils::findmnt::mounted_at(dir)
        .await
        .map_err(|e| OpError::new(Step::TearDown, e.to_string()))?;
    if mounted.is_some() {
        return Err(OpError::new(
            Step::TearDown,
            format!(
                "{} is still mounted after NodeUnpublishVolume succeeded",
                dir.display()
            ),
        ));
    }
    match tokio::fs::remove_dir(dir).await {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(OpError::new(
            Step::TearDown,
            format!("removing {}: {e}", dir.display()),
        )),
    }
}

pub(super) async fn unstage(ctx: &OpContext, v: &StagedVolume) -> Result<(), OpError> {
    let Some((driver_name, handle, block)) = csi_handle(&v.handle) else {
        return Err(OpError::new(Step::UnmountDevice, "not a CSI volume"));
    };
    let Some(staging) = &v.staging_path else {
        return Ok(());
    };
    let drv = driver(ctx, driver_name, Step::UnmountDevice)?;
    let unstaged = NodeClient::new(drv.channel.clone())
        .node_unstage_volume(request(
            ctx,
            NodeUnstageVolumeRequest {
                volume_id: handle.to_string(),
                staging_target_path: path_str(staging),
            },
        ))
        .await;
    gone_is_done(unstaged, Step::UnmountDevice, handle)?;
    let data_file = if block {
        ctx.paths.csi_block_vol_data(&v.spec_name)
    } else {
        ctx.paths.csi_staging_vol_data(driver_name, handle)
    };
    let mounted = mount_utils::findmnt::mounted_at(staging)
        .await
        .map_err(|e| OpError::new(Step::UnmountDevice, e.to_string()))?;
    if mounted.is_some() {
        return Err(OpError::new(
            Step::UnmountDevice,
            format!(
                "{} is still mounted after NodeUnstageVolume succeeded",
                staging.display()
            ),
        ));
    }
    let _ = tokio::fs::remove_dir(staging).await;
    let _ = tokio::fs::remove_file(&data_file).await;
    if let Some(parent) = data_file.parent() {
        remove_empty_dirs(parent.to_path_buf(), &ctx.paths.csi_plugin_dir()).await;
    }
    if let Some(parent) = staging.parent() {
        remove_empty_dirs(parent.to_path_buf(), &ctx.paths.csi_plugin_dir()).await;
    }
    tracing::info!(volume = %v.unique_name, staging = %staging.display(), "UnmountDevice succeeded (NodeUnstageVolume)");
    Ok(())
}
