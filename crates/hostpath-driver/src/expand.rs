//! Growing a volume while it is in use (ONLINE expansion). The controller side takes the new
//! size out of the capacity and grows a block volume's image; the node side makes an attached
//! loop device see the new size (`losetup --set-capacity`). A directory has no size of its
//! own, so a mount volume's expansion is bookkeeping and needs no node step.

use std::path::PathBuf;

use csi_spec::v1::{ControllerExpandVolumeRequest, NodeExpandVolumeRequest};

use crate::config::DEFAULT_VOLUME_SIZE;
use crate::driver::Driver;
use crate::state::Kind;
use crate::validate::{self, non_empty};
use crate::{Error, Result, backing, loopdev, mounts};

/// ControllerExpandVolume: the volume's new capacity and whether the node must act.
#[tracing::instrument(skip_all, fields(volume_id = %req.volume_id))]
pub(crate) async fn controller(
    d: &Driver,
    req: &ControllerExpandVolumeRequest,
) -> Result<(u64, bool)> {
    non_empty("volume_id", &req.volume_id)?;
    let range = req
        .capacity_range
        .as_ref()
        .ok_or_else(|| Error::required("capacity_range"))?;
    if range.required_bytes == 0 && range.limit_bytes == 0 {
        return Err(Error::invalid(
            "capacity_range",
            "must set required_bytes or limit_bytes: the size to grow to",
        ));
    }
    if let Some(cap) = &req.volume_capability {
        validate::capability("volume_capability", Some(cap))?;
    }
    let _lock = d.locks.lock(&req.volume_id).await;
    let v = d.existing_volume(&req.volume_id).await?;
    let wanted = validate::size(Some(range), v.kind, DEFAULT_VOLUME_SIZE)?;
    let node_step = v.kind == Kind::Block;
    if wanted <= v.capacity_bytes {
        // Never shrinks; a repeat of a finished expansion lands here.
        return Ok((v.capacity_bytes, node_step));
    }
    let total = d.config.capacity_bytes;
    if wanted > total {
        return Err(Error::OutOfRange(format!(
            "{wanted} bytes is more than this driver's whole capacity of {total} bytes"
        )));
    }
    let id = v.id.clone();
    d.update(|s| {
        let others = s.used_bytes().saturating_sub(v.capacity_bytes);
        if others.saturating_add(wanted) > total {
            return Err(Error::ResourceExhausted(format!(
                "not enough capacity to grow volume {id} to {wanted} bytes: {others} of {total} bytes are taken by other volumes"
            )));
        }
        if let Some(v) = s.volumes.get_mut(&id) {
            v.capacity_bytes = wanted;
        }
        Ok(())
    })
    .await?;
    if v.kind == Kind::Block {
        backing::create_empty(&d.volume_path(&v), Kind::Block, wanted)?;
    }
    tracing::info!(from = v.capacity_bytes, to = wanted, "expanded volume");
    Ok((wanted, node_step))
}

/// NodeExpandVolume: the capacity the volume has on the node now.
#[tracing::instrument(skip_all, fields(volume_id = %req.volume_id, path = %req.volume_path))]
pub(crate) async fn node(d: &Driver, req: &NodeExpandVolumeRequest) -> Result<u64> {
    non_empty("volume_id", &req.volume_id)?;
    non_empty("volume_path", &req.volume_path)?;
    let path = PathBuf::from(&req.volume_path);
    if let Some(cap) = &req.volume_capability {
        validate::capability("volume_capability", Some(cap))?;
    }
    let _lock = d.locks.lock(&req.volume_id).await;
    let v = d.existing_volume(&req.volume_id).await?;
    if !path.exists() {
        return Err(Error::NotFound {
            kind: "volume_path",
            id: path.display().to_string(),
        });
    }
    let required = validate::size(req.capacity_range.as_ref(), v.kind, 0)?;
    let not_here = || Error::NotFound {
        kind: "volume",
        id: format!("{} at volume_path {}", v.id, path.display()),
    };
    match v.kind {
        Kind::Mount => {
            if !mounts::is_dir_mount(&path, &d.volume_path(&v)).await? {
                return Err(not_here());
            }
            Ok(v.capacity_bytes)
        }
        Kind::Block => {
            let sys = &d.config.sys_root;
            let image = d.volume_path(&v);
            // The staging path (nothing is mounted there) or a target a loop device is bound onto.
            let staged_here = v.staged.as_ref().is_some_and(|s| s.path == path);
            if !staged_here && mounts::loop_mount(sys, &image, &path).await?.is_none() {
                return Err(not_here());
            }
            let devices = loopdev::refresh_capacity(sys, &image).await?;
            let mut size = None::<u64>;
            for dev in &devices {
                let s = mount_utils::stats::block_device_size(sys, dev.number)?;
                size = Some(size.map_or(s, |m| m.min(s)));
            }
            let size = size.ok_or_else(not_here)?;
            if size < required {
                return Err(Error::FailedPrecondition(format!(
                    "the loop devices of volume {} have {size} bytes, less than the {required} required; expand the volume through the controller first",
                    v.id
                )));
            }
            tracing::info!(devices = devices.len(), size, "loop devices resized");
            Ok(size)
        }
    }
}
