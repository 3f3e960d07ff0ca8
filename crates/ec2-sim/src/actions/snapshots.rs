//! CreateSnapshot, DeleteSnapshot, DescribeSnapshots. A snapshot's content is a sparse copy
//! of the volume image taken when CreateSnapshot is called.

use super::volumes::lookup;
use super::{
    DescribeQuery, DescribeSpec, check_id, describe_query, dry_run, not_found, paginate, tag_filter,
};
use crate::engine::Engine;
use crate::ids;
use crate::model::{Snapshot, Step, duration_ms};
use crate::query::{Filter, Params, filter_matches};
use crate::render::{self, OWNER_ID};
use crate::xml::{ApiError, Xml};

pub(crate) fn create(
    engine: &mut Engine,
    params: &Params,
    now: u64,
    x: &mut Xml,
) -> Result<(), ApiError> {
    let volume_id = params.require("VolumeId")?.to_string();
    let v = lookup(engine, &volume_id)?;
    if v.status(now) == "creating" {
        return Err(ApiError::new(
            "IncorrectState",
            format!("The volume '{volume_id}' is not in a state that allows snapshots: creating"),
        ));
    }
    let description = params.get("Description").unwrap_or("").to_string();
    if description.chars().count() > 255 {
        return Err(ApiError::invalid_value(
            "Description",
            &description,
            "Descriptions are at most 255 characters.",
        ));
    }
    let tags = params.tag_specifications("snapshot")?;
    dry_run(params)?;
    let id = ids::resource_id("snap");
    engine
        .disks
        .snapshot_volume(&volume_id, &id)
        .map_err(|e| ApiError::internal(format!("cannot copy the volume image: {e}")))?;
    let snapshot = Snapshot {
        id: id.clone(),
        volume_id,
        volume_size: v.size_gib,
        description,
        start_ms: now,
        completed_ms: now + duration_ms(engine.config.timing, Step::Snapshot),
        encrypted: v.encrypted,
        kms_key_id: v.kms_key_id.clone(),
        tags,
    };
    render::snapshot_fields(x, &snapshot, now);
    engine.cloud.snapshots.insert(id, snapshot);
    engine.dirty = true;
    Ok(())
}

pub(crate) fn lookup_snapshot<'a>(engine: &'a Engine, id: &str) -> Result<&'a Snapshot, ApiError> {
    check_id(id, "snap", "InvalidSnapshotID.Malformed")?;
    engine
        .cloud
        .snapshots
        .get(id)
        .ok_or_else(|| not_found("InvalidSnapshot.NotFound", "snapshot", &[&id.to_string()]))
}

pub(crate) fn delete(engine: &mut Engine, params: &Params, x: &mut Xml) -> Result<(), ApiError> {
    let id = params.require("SnapshotId")?.to_string();
    lookup_snapshot(engine, &id)?;
    dry_run(params)?;
    engine.cloud.snapshots.remove(&id);
    engine.disks.remove_snapshot(&id);
    engine.dirty = true;
    x.leaf("return", true);
    Ok(())
}

const SNAPSHOT_FILTERS: &[&str] = &[
    "description",
    "encrypted",
    "owner-id",
    "progress",
    "snapshot-id",
    "start-time",
    "status",
    "volume-id",
    "volume-size",
];

fn snapshot_matches(s: &Snapshot, f: &Filter, now: u64) -> bool {
    if let Some(m) = tag_filter(f, &s.tags) {
        return m;
    }
    let one = |v: &str| filter_matches(f, [v]);
    match f.name.as_str() {
        "description" => one(&s.description),
        "encrypted" => one(&s.encrypted.to_string()),
        "owner-id" => one(OWNER_ID),
        "progress" => one(&format!("{}%", s.progress(now))),
        "snapshot-id" => one(&s.id),
        "start-time" => one(&ids::iso8601(s.start_ms)),
        "status" => one(s.status(now)),
        "volume-id" => one(&s.volume_id),
        "volume-size" => one(&s.volume_size.to_string()),
        _ => false,
    }
}

pub(crate) fn describe(
    engine: &mut Engine,
    params: &Params,
    now: u64,
    x: &mut Xml,
) -> Result<(), ApiError> {
    let owners = params.list("Owner");
    let DescribeQuery { ids, filters, page } = describe_query(
        params,
        &DescribeSpec {
            id_param: "SnapshotId",
            set_name: "snapshotSet",
            filters: SNAPSHOT_FILTERS,
            max_results: 1000,
            id_prefix: "snap",
            malformed: "InvalidSnapshotID.Malformed",
            not_found: "InvalidSnapshot.NotFound",
            noun: "snapshot",
        },
        |id| engine.cloud.snapshots.contains_key(id),
    )?;
    // Every snapshot belongs to this account: `self` and our ID match, others match nothing.
    let owner_ok = owners.is_empty() || owners.iter().any(|o| o == "self" || o == OWNER_ID);
    let selected: Vec<(String, &Snapshot)> = engine
        .cloud
        .snapshots
        .values()
        .filter(|_| owner_ok)
        .filter(|s| ids.is_empty() || ids.contains(&s.id))
        .filter(|s| filters.iter().all(|f| snapshot_matches(s, f, now)))
        .map(|s| (s.id.clone(), s))
        .collect();
    let (items, next) = paginate(selected, &page);
    x.start("snapshotSet");
    for (_, s) in items {
        x.start("item");
        render::snapshot_fields(x, s, now);
        x.end("item");
    }
    x.end("snapshotSet");
    x.opt_leaf("nextToken", next);
    Ok(())
}
