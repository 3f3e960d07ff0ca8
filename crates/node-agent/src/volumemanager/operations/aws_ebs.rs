//! The in-tree `kubernetes.io/aws-ebs` plugin's node side, for volumes this node has not
//! migrated: wait for the device the attach/detach controller reported, mount it at the
//! plugin's staging path (formatting a blank device), bind it into the pod.

use super::{
    MountFailure, MountRequest, Mounted, OpContext, OpError, Progress, Step, make_dir,
    remove_empty_dirs,
};
use crate::volumemanager::cache::{MountedVolume, StagedVolume, VolumeHandle};
use crate::volumemanager::volume_spec::MountKind;

pub(super) async fn mount(ctx: &OpContext, req: &MountRequest) -> Result<Mounted, MountFailure> {
    Progress::track(async |p: &mut Progress| mount_steps(ctx, req, p).await).await
}

async fn mount_steps(
    ctx: &OpContext,
    req: &MountRequest,
    progress: &mut Progress,
) -> Result<Mounted, OpError> {
    let v = &req.volume;
    let MountKind::AwsEbs {
        volume_id,
        fs_type,
        mount_options,
    } = &v.kind
    else {
        return Err(OpError::new(Step::MountDevice, "not an aws-ebs volume"));
    };
    let handle = VolumeHandle::AwsEbs {
        volume_id: volume_id.clone(),
    };
    let staging = ctx.paths.aws_ebs_staging_path(volume_id);
    let staged = match &req.already_staged {
        Some(s) => s.clone(),
        None => {
            let device_path = req.device_path.clone().unwrap_or_default();
            let device = volume_plugins::aws_ebs::wait_for_attach_under(
                &ctx.dev_root,
                &device_path,
                volume_id,
                ctx.attach_timeout,
            )
            .await
            .map_err(|e| OpError::new(Step::WaitForAttach, e.to_string()))?;
            let staged = StagedVolume {
                unique_name: v.unique_name.clone(),
                spec_name: v.spec_name.clone(),
                handle: handle.clone(),
                staging_path: Some(staging.clone()),
                reported_in_use: req.reported_in_use,
                uncertain: false,
            };
            // A failed format-and-mount may have mounted (a fsck or a mount that timed out):
            // uncertain, so the staging path is unmounted when no pod wants the volume.
            if let Err(e) = volume_plugins::aws_ebs::mount_device(
                &device,
                &staging,
                fs_type,
                mount_options,
                v.read_only,
                ctx.attach_timeout,
            )
            .await
            {
                progress.staged = Some(StagedVolume {
                    uncertain: true,
                    ..staged
                });
                return Err(OpError::new(Step::MountDevice, e.to_string()));
            }
            staged
        }
    };
    progress.staged = Some(staged.clone());
    let target = ctx.paths.aws_ebs_pod_path(&req.pod.uid, &v.spec_name);
    make_dir(&target, Step::SetUp).await?;
    let mounted = mount_utils::findmnt::mounted_at(&target)
        .await
        .map_err(|e| OpError::new(Step::SetUp, e.to_string()))?;
    if mounted.is_none() {
        mount_utils::mount::bind(&staging, &target, v.read_only)
            .await
            .map_err(|e| OpError::new(Step::SetUp, e.to_string()))?;
    }
    tracing::info!(volume = %v.unique_name, target = %target.display(), "MountVolume.SetUp succeeded (in-tree aws-ebs)");
    Ok(Mounted {
        staged,
        mounted: MountedVolume {
            unique_name: v.unique_name.clone(),
            pod_uid: req.pod.uid.clone(),
            outer_name: v.outer_name.clone(),
            spec_name: v.spec_name.clone(),
            handle,
            host_path: target,
            uncertain: false,
            reported_in_use: req.reported_in_use,
        },
    })
}

pub(super) async fn unpublish(v: &MountedVolume) -> Result<(), OpError> {
    mount_utils::mount::unmount(&v.host_path)
        .await
        .map_err(|e| OpError::new(Step::TearDown, e.to_string()))?;
    match tokio::fs::remove_dir(&v.host_path).await {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(OpError::new(
                Step::TearDown,
                format!("removing {}: {e}", v.host_path.display()),
            ));
        }
    }
    tracing::info!(volume = %v.unique_name, pod_uid = %v.pod_uid, "UnmountVolume.TearDown succeeded (in-tree aws-ebs)");
    Ok(())
}

pub(super) async fn unstage(ctx: &OpContext, v: &StagedVolume) -> Result<(), OpError> {
    let Some(staging) = &v.staging_path else {
        return Ok(());
    };
    volume_plugins::aws_ebs::unmount_device(staging)
        .await
        .map_err(|e| OpError::new(Step::UnmountDevice, e.to_string()))?;
    if let Some(parent) = staging.parent() {
        remove_empty_dirs(parent.to_path_buf(), &ctx.paths.aws_ebs_mounts_dir()).await;
    }
    Ok(())
}
