//! ModifyVolume, DescribeVolumesModifications: modifying -> optimizing -> completed; the new
//! size takes effect (and the image grows) when `optimizing` begins.

use super::volumes::lookup;
use super::{check_id, dry_run, invalid_filter, page, paginate};
use crate::engine::Engine;
use crate::limits;
use crate::model::{Modification, Step, VolumeShape, duration_ms};
use crate::query::{Filter, Params, filter_matches};
use crate::render;
use crate::xml::{ApiError, Xml};

pub(crate) fn modify(
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
            format!("The volume '{volume_id}' is not in a state that can be modified: creating"),
        ));
    }
    if let Some(m) = engine.cloud.modifications.get(&volume_id) {
        if m.state(now) != "completed" {
            return Err(ApiError::new(
                "IncorrectModificationState",
                format!(
                    "Volume {volume_id} is already being modified (state {})",
                    m.state(now)
                ),
            ));
        }
    }
    let size = params.int("Size")?;
    let new_type = params.get("VolumeType").filter(|t| !t.is_empty());
    let iops = params.int("Iops")?;
    let throughput = params.int("Throughput")?;
    let multi = params.bool("MultiAttachEnabled")?;
    if size.is_none()
        && new_type.is_none()
        && iops.is_none()
        && throughput.is_none()
        && multi.is_none()
    {
        return Err(ApiError::new(
            "MissingParameter",
            "The request must contain at least one of Size, VolumeType, Iops, Throughput, MultiAttachEnabled",
        ));
    }
    let original = v.shape();
    let volume_type = new_type.unwrap_or(&original.volume_type).to_string();
    limits::check_type(&volume_type)?;
    if let Some(s) = size {
        if s < original.size_gib as i64 {
            return Err(ApiError::new(
                "InvalidParameterValue",
                format!(
                    "New size cannot be smaller than existing size: {s}GiB < {}GiB",
                    original.size_gib
                ),
            ));
        }
    }
    let size = limits::check_size(&volume_type, size.unwrap_or(original.size_gib as i64))?;
    // Provisioned IOPS carry over when the type keeps supporting them; switching to io1, io2
    // or gp3 otherwise defaults to 3,000 (AWS's documented ModifyVolume default).
    let keeps = |t: &str| matches!(t, "gp3" | "io1" | "io2");
    let iops = iops.or_else(|| {
        if !keeps(&volume_type) {
            None
        } else if keeps(&original.volume_type) {
            original.iops.map(i64::from)
        } else {
            Some(3000)
        }
    });
    let throughput = throughput.or_else(|| {
        if volume_type == "gp3" && original.volume_type == "gp3" {
            original.throughput.map(i64::from)
        } else {
            None
        }
    });
    let perf = limits::check_performance(&volume_type, size, iops, throughput)?;
    let multi_attach = multi.unwrap_or(original.multi_attach);
    limits::check_multi_attach(&volume_type, multi_attach)?;
    if multi_attach != original.multi_attach && !v.attachments.is_empty() {
        return Err(ApiError::new(
            "IncorrectState",
            format!("Multi-Attach can only be changed while {volume_id} is detached"),
        ));
    }
    let target = VolumeShape {
        size_gib: size,
        volume_type,
        iops: perf.iops,
        throughput: perf.throughput,
        multi_attach,
    };
    if target == original {
        return Err(ApiError::combination(
            "The modification must change at least one of size, type, IOPS, throughput or Multi-Attach.",
        ));
    }
    dry_run(params)?;
    let optimizing_ms = now + duration_ms(engine.config.timing, Step::Modifying);
    let m = Modification {
        volume_id: volume_id.clone(),
        original,
        target,
        start_ms: now,
        optimizing_ms,
        completed_ms: optimizing_ms + duration_ms(engine.config.timing, Step::Optimizing),
        applied: false,
    };
    x.start("volumeModification");
    render::modification_fields(x, &m, now.min(optimizing_ms.saturating_sub(1)));
    x.end("volumeModification");
    engine.cloud.modifications.insert(volume_id, m);
    engine.dirty = true;
    Ok(())
}

const MODIFICATION_FILTERS: &[&str] = &[
    "modification-state",
    "original-iops",
    "original-multi-attach-enabled",
    "original-size",
    "original-throughput",
    "original-volume-type",
    "target-iops",
    "target-multi-attach-enabled",
    "target-size",
    "target-throughput",
    "target-volume-type",
    "volume-id",
];

fn opt(v: Option<u32>) -> String {
    v.map(|n| n.to_string()).unwrap_or_default()
}

fn modification_matches(m: &Modification, f: &Filter, now: u64) -> bool {
    let one = |s: &str| filter_matches(f, [s]);
    match f.name.as_str() {
        "modification-state" => one(m.state(now)),
        "original-iops" => one(&opt(m.original.iops)),
        "original-multi-attach-enabled" => one(&m.original.multi_attach.to_string()),
        "original-size" => one(&m.original.size_gib.to_string()),
        "original-throughput" => one(&opt(m.original.throughput)),
        "original-volume-type" => one(&m.original.volume_type),
        "target-iops" => one(&opt(m.target.iops)),
        "target-multi-attach-enabled" => one(&m.target.multi_attach.to_string()),
        "target-size" => one(&m.target.size_gib.to_string()),
        "target-throughput" => one(&opt(m.target.throughput)),
        "target-volume-type" => one(&m.target.volume_type),
        "volume-id" => one(&m.volume_id),
        _ => false,
    }
}

pub(crate) fn describe(
    engine: &mut Engine,
    params: &Params,
    now: u64,
    x: &mut Xml,
) -> Result<(), ApiError> {
    let ids = params.list("VolumeId");
    let filters = params.filters()?;
    for f in &filters {
        if !MODIFICATION_FILTERS.contains(&f.name.as_str()) {
            return Err(invalid_filter(f));
        }
    }
    let page = page(params, 5, 500, "vol")?;
    for id in &ids {
        check_id(id, "vol", "InvalidVolumeID.Malformed")?;
        if !engine.cloud.volumes.contains_key(id) {
            return Err(ApiError::new(
                "InvalidVolume.NotFound",
                format!("The volume '{id}' does not exist."),
            ));
        }
        if !engine.cloud.modifications.contains_key(id) {
            return Err(ApiError::new(
                "InvalidVolumeModification.NotFound",
                format!("Modification for volume '{id}' does not exist."),
            ));
        }
    }
    dry_run(params)?;
    let selected: Vec<(String, &Modification)> = engine
        .cloud
        .modifications
        .values()
        .filter(|m| ids.is_empty() || ids.contains(&m.volume_id))
        .filter(|m| filters.iter().all(|f| modification_matches(m, f, now)))
        .map(|m| (m.volume_id.clone(), m))
        .collect();
    let (items, next) = paginate(selected, &page);
    x.start("volumeModificationSet");
    for (_, m) in items {
        x.start("item");
        render::modification_fields(x, m, now);
        x.end("item");
    }
    x.end("volumeModificationSet");
    x.opt_leaf("nextToken", next);
    Ok(())
}
