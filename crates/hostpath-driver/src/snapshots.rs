//! Snapshots: a copy of a volume's directory tree or image under `snapshots/`, ready at once.

use csi_spec::v1::CreateSnapshotRequest;

use crate::driver::Driver;
use crate::state::Snapshot;
use crate::validate::non_empty;
use crate::{Error, Result, backing};

pub(crate) fn csi_snapshot(s: &Snapshot) -> csi_spec::v1::Snapshot {
    csi_spec::v1::Snapshot {
        size_bytes: i64::try_from(s.size_bytes).unwrap_or(i64::MAX),
        snapshot_id: s.id.clone(),
        source_volume_id: s.source_volume_id.clone(),
        creation_time: Some(prost_types::Timestamp {
            seconds: s.created_secs,
            nanos: s.created_nanos,
        }),
        ready_to_use: true,
        group_snapshot_id: String::new(),
    }
}

#[tracing::instrument(skip_all, fields(name = %req.name, source_volume_id = %req.source_volume_id))]
pub(crate) async fn create(d: &Driver, req: CreateSnapshotRequest) -> Result<Snapshot> {
    non_empty("name", &req.name)?;
    non_empty("source_volume_id", &req.source_volume_id)?;
    let _name = d.locks.lock(&format!("snapshot-name/{}", req.name)).await;
    if let Some(s) = d.snapshot().await.snapshot_by_name(&req.name) {
        if s.source_volume_id != req.source_volume_id {
            return Err(Error::AlreadyExists(format!(
                "snapshot name {} is already used for a snapshot of volume {}, not {}",
                req.name, s.source_volume_id, req.source_volume_id
            )));
        }
        return Ok(s.clone());
    }
    let _vol = d.locks.lock(&req.source_volume_id).await;
    let v = d.existing_volume(&req.source_volume_id).await?;
    let id = uuid::Uuid::new_v4().to_string();
    let dst = backing::snapshot_path(&d.config.state_dir, &id, v.kind);
    backing::copy(&d.volume_path(&v), &dst, v.kind, 0).await?;
    let (created_secs, created_nanos) = now();
    let snap = Snapshot {
        id,
        name: req.name.clone(),
        source_volume_id: v.id.clone(),
        kind: v.kind,
        size_bytes: backing::content_size(&dst, v.kind),
        created_secs,
        created_nanos,
    };
    let record = snap.clone();
    d.update(|s| Ok(s.snapshots.insert(record.id.clone(), record)))
        .await?;
    tracing::info!(snapshot_id = %snap.id, "created snapshot");
    Ok(snap)
}

pub(crate) async fn delete(d: &Driver, snapshot_id: &str) -> Result<()> {
    non_empty("snapshot_id", snapshot_id)?;
    let _lock = d.locks.lock(&format!("snapshot/{snapshot_id}")).await;
    let Some(s) = d.snapshot().await.snapshots.get(snapshot_id).cloned() else {
        return Ok(());
    };
    backing::remove(
        &backing::snapshot_path(&d.config.state_dir, &s.id, s.kind),
        s.kind,
    )?;
    d.update(|st| Ok(st.snapshots.remove(snapshot_id))).await?;
    tracing::info!(snapshot_id, "deleted snapshot");
    Ok(())
}

fn now() -> (i64, i32) {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    (
        i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        i32::try_from(d.subsec_nanos()).unwrap_or(0),
    )
}
