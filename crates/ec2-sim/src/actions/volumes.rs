//! CreateVolume, DeleteVolume, DescribeVolumes.

use super::{
    DescribeQuery, DescribeSpec, check_id, client_token, describe_query, dry_run,
    idempotent_mismatch, not_found, paginate, tag_filter,
};
use crate::engine::Engine;
use crate::ids;
use crate::limits;
use crate::model::{Step, Token, Volume, duration_ms};
use crate::query::{Filter, Params, filter_matches};
use crate::render::{self, OWNER_ID};
use crate::xml::{ApiError, Xml};

pub(crate) fn create(
    engine: &mut Engine,
    params: &Params,
    now: u64,
    x: &mut Xml,
) -> Result<(), ApiError> {
    let token = client_token(params)?;
    let fingerprint = params.fingerprint(&["Action", "Version", "ClientToken", "DryRun"]);
    if let Some(t) = &token {
        if let Some(prev) = engine.cloud.tokens.get(&format!("CreateVolume/{t}")) {
            if prev.fingerprint != fingerprint {
                return Err(idempotent_mismatch());
            }
            dry_run(params)?;
            // The same call again: the same volume, in its current state.
            let id = prev.ids.first().cloned().unwrap_or_default();
            if let Some(v) = engine.cloud.volumes.get(&id) {
                render::created_volume_fields(x, v, v.status(now));
            } else if let Some(v) = &prev.volume {
                render::created_volume_fields(x, v, "deleted");
            }
            return Ok(());
        }
    }

    let zone = params.require("AvailabilityZone")?;
    if !engine.config.zones.iter().any(|z| z == zone) {
        return Err(ApiError::new(
            "InvalidZone.NotFound",
            format!(
                "The zone '{zone}' does not exist in region {}.",
                engine.config.region
            ),
        ));
    }
    let plan = plan_volume(
        engine,
        &VolumeRequest {
            size: params.int("Size")?,
            volume_type: params.get("VolumeType").unwrap_or("gp2"),
            iops: params.int("Iops")?,
            throughput: params.int("Throughput")?,
            snapshot_id: params.get("SnapshotId"),
            encrypted: params.bool("Encrypted")?,
            kms_key_id: params.get("KmsKeyId"),
            multi_attach: params.flag("MultiAttachEnabled")?,
        },
        now,
    )?;
    let tags = params.tag_specifications("volume")?;
    dry_run(params)?;

    let id = ids::resource_id("vol");
    engine
        .disks
        .create_volume(&id, plan.size, plan.snapshot_id.as_deref())
        .map_err(|e| ApiError::internal(format!("cannot create the volume image: {e}")))?;
    let available_ms = now + duration_ms(engine.config.timing, Step::Create);
    let volume = plan.into_volume(id.clone(), zone.to_string(), tags, now, available_ms);
    if volume.vanishes {
        tracing::info!(volume_id = %id, "KMS key does not exist: the volume will vanish");
    }
    // The response of CreateVolume always says `creating`, as AWS's does.
    render::created_volume_fields(x, &volume, "creating");
    if let Some(t) = token {
        engine.cloud.tokens.insert(
            format!("CreateVolume/{t}"),
            Token {
                fingerprint,
                ids: vec![id.clone()],
                volume: Some(volume.clone()),
            },
        );
    }
    engine.cloud.volumes.insert(id, volume);
    engine.dirty = true;
    Ok(())
}

/// The volume parameters CreateVolume and RunInstances' `BlockDeviceMapping.N.Ebs` share.
pub(crate) struct VolumeRequest<'a> {
    pub(crate) size: Option<i64>,
    pub(crate) volume_type: &'a str,
    pub(crate) iops: Option<i64>,
    pub(crate) throughput: Option<i64>,
    pub(crate) snapshot_id: Option<&'a str>,
    pub(crate) encrypted: Option<bool>,
    pub(crate) kms_key_id: Option<&'a str>,
    pub(crate) multi_attach: bool,
}

/// A validated volume request, with AWS's defaults applied.
#[derive(Debug, Clone)]
pub(crate) struct PlannedVolume {
    pub(crate) size: u64,
    pub(crate) snapshot_id: Option<String>,
    volume_type: String,
    perf: limits::Performance,
    encrypted: bool,
    kms_key_id: Option<String>,
    /// False when the KMS key does not exist (AWS accepts the call and then fails).
    pub(crate) key_exists: bool,
    multi_attach: bool,
}

impl PlannedVolume {
    pub(crate) fn into_volume(
        self,
        id: String,
        zone: String,
        tags: Vec<(String, String)>,
        now: u64,
        available_ms: u64,
    ) -> Volume {
        Volume {
            id,
            size_gib: self.size,
            snapshot_id: self.snapshot_id,
            zone,
            volume_type: self.volume_type,
            iops: self.perf.iops,
            throughput: self.perf.throughput,
            encrypted: self.encrypted,
            kms_key_id: self.kms_key_id,
            multi_attach: self.multi_attach,
            tags,
            create_ms: now,
            available_ms,
            // AWS accepts an unusable key, shows the volume as creating, then drops it.
            vanishes: !self.key_exists,
            deleted_ms: None,
            delete_when_detached: None,
            attachments: Vec::new(),
        }
    }
}

/// CreateVolume's checks (type, snapshot, size, IOPS, throughput, Multi-Attach, encryption)
/// with its error codes.
pub(crate) fn plan_volume(
    engine: &Engine,
    r: &VolumeRequest<'_>,
    now: u64,
) -> Result<PlannedVolume, ApiError> {
    let volume_type = r.volume_type;
    limits::check_type(volume_type)?;

    let snapshot = match r.snapshot_id {
        None | Some("") => None,
        Some(id) => {
            check_id(id, "snap", "InvalidSnapshotID.Malformed")?;
            let Some(s) = engine.cloud.snapshots.get(id) else {
                return Err(not_found(
                    "InvalidSnapshot.NotFound",
                    "snapshot",
                    &[&id.to_string()],
                ));
            };
            if s.status(now) != "completed" {
                return Err(ApiError::new(
                    "IncorrectState",
                    format!("Snapshot is in invalid state - {}", s.status(now)),
                ));
            }
            Some(s)
        }
    };
    let size = match (r.size, snapshot) {
        (Some(size), Some(s)) if size >= 0 && (size as u64) < s.volume_size => {
            return Err(ApiError::new(
                "InvalidParameterValue",
                format!(
                    "Volume of {size}GiB is smaller than snapshot '{}', expect size >= {}GiB",
                    s.id, s.volume_size
                ),
            ));
        }
        (Some(size), _) => size,
        (None, Some(s)) => s.volume_size as i64,
        (None, None) => {
            return Err(ApiError::new(
                "MissingParameter",
                "The request must contain the parameter size or snapshotId",
            ));
        }
    };
    let size = limits::check_size(volume_type, size)?;
    let perf = limits::check_performance(volume_type, size, r.iops, r.throughput)?;
    limits::check_multi_attach(volume_type, r.multi_attach)?;

    let kms_param = r.kms_key_id.filter(|k| !k.is_empty());
    let snapshot_encrypted = snapshot.is_some_and(|s| s.encrypted);
    if kms_param.is_some() && r.encrypted != Some(true) && !snapshot_encrypted {
        return Err(ApiError::new(
            "InvalidParameterDependency",
            "The parameter KmsKeyId requires the parameter Encrypted to be set.",
        ));
    }
    if snapshot_encrypted && r.encrypted == Some(false) {
        return Err(ApiError::combination(
            "A volume created from an encrypted snapshot must be encrypted.",
        ));
    }
    let encrypted = r.encrypted.unwrap_or(false) || snapshot_encrypted;
    let (kms_key_id, key_exists) = if encrypted {
        let key = kms_param
            .map(str::to_string)
            .or_else(|| snapshot.and_then(|s| s.kms_key_id.clone()))
            .unwrap_or_else(|| crate::config::DEFAULT_KMS_ALIAS.to_string());
        let exists = kms_key_exists(&engine.config.kms_keys, &key);
        (Some(kms_arn(&engine.config.region, &key)), exists)
    } else {
        (None, true)
    };
    Ok(PlannedVolume {
        size,
        snapshot_id: snapshot.map(|s| s.id.clone()),
        volume_type: volume_type.to_string(),
        perf,
        encrypted,
        kms_key_id,
        key_exists,
        multi_attach: r.multi_attach,
    })
}

/// A key exists if it equals a configured entry, or one is the other's `arn:aws:kms:..:`
/// suffix (so `alias/x`, `arn:aws:kms:r:a:alias/x`, a key ID and its ARN all match).
fn kms_key_exists(keys: &[String], key: &str) -> bool {
    let tail = |k: &str| -> String {
        if k.starts_with("arn:") {
            k.splitn(6, ':').nth(5).unwrap_or(k).to_string()
        } else if k.starts_with("alias/") {
            k.to_string()
        } else {
            format!("key/{k}")
        }
    };
    let wanted = tail(key);
    keys.iter().any(|k| k == key || tail(k) == wanted)
}

fn kms_arn(region: &str, key: &str) -> String {
    if key.starts_with("arn:") {
        key.to_string()
    } else if key.starts_with("alias/") {
        format!("arn:aws:kms:{region}:{OWNER_ID}:{key}")
    } else {
        format!("arn:aws:kms:{region}:{OWNER_ID}:key/{key}")
    }
}

/// Looks up a volume by ID with AWS's malformed / not-found codes.
pub(crate) fn lookup<'a>(engine: &'a Engine, id: &str) -> Result<&'a Volume, ApiError> {
    check_id(id, "vol", "InvalidVolumeID.Malformed")?;
    match engine.cloud.volumes.get(id) {
        Some(v) if v.deleted_ms.is_none() => Ok(v),
        _ => Err(not_found(
            "InvalidVolume.NotFound",
            "volume",
            &[&id.to_string()],
        )),
    }
}

pub(crate) fn delete(
    engine: &mut Engine,
    params: &Params,
    now: u64,
    x: &mut Xml,
) -> Result<(), ApiError> {
    let id = params.require("VolumeId")?;
    let v = lookup(engine, id)?;
    if let Some(a) = v.attachments.first() {
        return Err(ApiError::new(
            "VolumeInUse",
            format!("Volume {id} is currently attached to {}", a.instance_id),
        ));
    }
    dry_run(params)?;
    let delay = duration_ms(engine.config.timing, Step::Delete);
    if let Some(v) = engine.cloud.volumes.get_mut(id) {
        v.deleted_ms = Some(now + delay);
    }
    engine.dirty = true;
    x.leaf("return", true);
    Ok(())
}

const VOLUME_FILTERS: &[&str] = &[
    "attachment.delete-on-termination",
    "attachment.device",
    "attachment.instance-id",
    "attachment.status",
    "availability-zone",
    "encrypted",
    "multi-attach-enabled",
    "size",
    "snapshot-id",
    "status",
    "volume-id",
    "volume-type",
];

fn volume_matches(v: &Volume, f: &Filter, now: u64) -> bool {
    if let Some(m) = tag_filter(f, &v.tags) {
        return m;
    }
    let one = |s: &str| filter_matches(f, [s]);
    match f.name.as_str() {
        "attachment.delete-on-termination" => v
            .attachments
            .iter()
            .any(|a| one(&a.delete_on_termination.to_string())),
        "attachment.device" => v.attachments.iter().any(|a| one(&a.device)),
        "attachment.instance-id" => v.attachments.iter().any(|a| one(&a.instance_id)),
        "attachment.status" => v.attachments.iter().any(|a| one(a.state.as_str())),
        "availability-zone" => one(&v.zone),
        "encrypted" => one(&v.encrypted.to_string()),
        "multi-attach-enabled" => one(&v.multi_attach.to_string()),
        "size" => one(&v.size_gib.to_string()),
        "snapshot-id" => one(v.snapshot_id.as_deref().unwrap_or("")),
        "status" => one(v.status(now)),
        "volume-id" => one(&v.id),
        "volume-type" => one(&v.volume_type),
        _ => false,
    }
}

pub(crate) fn describe(
    engine: &mut Engine,
    params: &Params,
    now: u64,
    x: &mut Xml,
) -> Result<(), ApiError> {
    let DescribeQuery { ids, filters, page } = describe_query(
        params,
        &DescribeSpec {
            id_param: "VolumeId",
            set_name: "volumeSet",
            filters: VOLUME_FILTERS,
            max_results: 500,
            id_prefix: "vol",
            malformed: "InvalidVolumeID.Malformed",
            not_found: "InvalidVolume.NotFound",
            noun: "volume",
        },
        |id| engine.cloud.volumes.contains_key(id),
    )?;
    let selected: Vec<(String, &Volume)> = engine
        .cloud
        .volumes
        .values()
        .filter(|v| ids.is_empty() || ids.contains(&v.id))
        .filter(|v| filters.iter().all(|f| volume_matches(v, f, now)))
        .map(|v| (v.id.clone(), v))
        .collect();
    let (items, next) = paginate(selected, &page);
    x.start("volumeSet");
    for (_, v) in items {
        x.start("item");
        render::volume_fields(x, v, v.status(now));
        x.end("item");
    }
    x.end("volumeSet");
    x.opt_leaf("nextToken", next);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kms_keys_match_by_alias_id_and_arn() {
        let keys = vec![
            "alias/aws/ebs".to_string(),
            "1234abcd-12ab-34cd-56ef-1234567890ab".to_string(),
        ];
        assert!(kms_key_exists(&keys, "alias/aws/ebs"));
        assert!(kms_key_exists(
            &keys,
            "arn:aws:kms:us-east-1:111122223333:alias/aws/ebs"
        ));
        assert!(kms_key_exists(
            &keys,
            "arn:aws:kms:us-east-1:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab"
        ));
        assert!(!kms_key_exists(&keys, "alias/nope"));
        assert!(!kms_key_exists(&keys, "0000"));
    }
}
