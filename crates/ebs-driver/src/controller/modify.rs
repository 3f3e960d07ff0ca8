//! ControllerModifyVolume (CSI `mutable_parameters`, Kubernetes VolumeAttributesClass): type,
//! IOPS and throughput through EC2 ModifyVolume, tags through CreateTags / DeleteTags. The same
//! keys are accepted as CreateVolume's `mutable_parameters`, where they take precedence over the
//! StorageClass's `parameters` (CSI spec).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use ebs_cloud::{CloudError, DiskModification};

use super::ControllerService;
use super::params::{self, IOPS, TAG_SPEC_PREFIX, THROUGHPUT, TYPE, positive};
use crate::{Error, Result};

/// `tagDeletion_N: <key>` removes a tag (the Go driver's syntax).
pub(crate) const TAG_DELETION_PREFIX: &str = "tagDeletion_";
/// How long ControllerModifyVolume waits for `optimizing` when the request has no deadline.
pub(crate) const DEFAULT_MODIFY_TIMEOUT: Duration = Duration::from_secs(300);
/// Tags the driver owns: a VolumeAttributesClass must not rewrite them.
const RESERVED_TAGS: &[&str] = &[
    ebs_cloud::VOLUME_NAME_TAG,
    ebs_cloud::SNAPSHOT_NAME_TAG,
    "ebs.csi.aws.com/cluster",
];

/// Parsed `mutable_parameters`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct MutableParams {
    pub(crate) change: DiskModification,
    pub(crate) add_tags: BTreeMap<String, String>,
    pub(crate) remove_tags: Vec<String>,
}

/// A tag key a VolumeAttributesClass may set or delete: valid, and not one the driver owns.
fn tag_key(field: &'static str, param: &str, key: &str) -> Result<String> {
    let key = params::tag_key(field, param, key)?;
    not_reserved(field, param, key)?;
    Ok(key.to_string())
}

fn not_reserved(field: &'static str, param: &str, key: &str) -> Result<()> {
    if RESERVED_TAGS.contains(&key) {
        return Err(Error::invalid(
            field,
            format!("{param}: tag {key} is set by the driver and cannot be changed"),
        ));
    }
    Ok(())
}

/// What is wrong with a `tagSpecification_N` / `tagDeletion_N` entry, if anything.
fn tag_problem(param: &str, value: &str) -> Option<String> {
    let key = if param.starts_with(TAG_SPEC_PREFIX) {
        match value.split_once('=') {
            Some((k, v)) if v.trim().len() > 256 => {
                return Some(format!(
                    "{param}: the value of tag '{}' is longer than 256 characters",
                    k.trim()
                ));
            }
            Some((k, _)) => k,
            None => return Some(format!("{param}: '{value}' is not key=value")),
        }
    } else if param.starts_with(TAG_DELETION_PREFIX) {
        value
    } else {
        return None;
    };
    tag_key("", param, key).err().map(|e| match e {
        Error::InvalidArgument { reason, .. } => reason,
        other => other.to_string(),
    })
}

/// `--warn-on-invalid-tag`: the parameters without their invalid tag entries, each logged as
/// a warning, instead of failing the call (the Go driver's behaviour with that flag).
pub(crate) fn drop_invalid_tags(
    field: &'static str,
    parameters: &HashMap<String, String>,
) -> HashMap<String, String> {
    parameters
        .iter()
        .filter(|(k, v)| match tag_problem(k, v) {
            Some(problem) => {
                tracing::warn!(field, problem = %problem, "skipping an invalid tag (--warn-on-invalid-tag)");
                false
            }
            None => true,
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Parses `mutable_parameters` (reported as `field`); an unknown key or a bad value is
/// InvalidArgument naming the key.
pub(crate) fn parse_mutable(
    field: &'static str,
    parameters: &HashMap<String, String>,
) -> Result<MutableParams> {
    let mut p = MutableParams::default();
    // Sorted, so the first bad key reported is the same every time.
    let sorted: BTreeMap<&String, &String> = parameters.iter().collect();
    for (key, value) in sorted {
        match key.as_str() {
            TYPE => p.change.volume_type = Some(params::volume_type(field, value, value.trim())?),
            IOPS => p.change.iops = Some(positive(field, key, value)?),
            THROUGHPUT => p.change.throughput = Some(positive(field, key, value)?),
            k if k.starts_with(TAG_SPEC_PREFIX) => {
                // An empty value is allowed: the tag is set with an empty value.
                let (tk, tv) = params::tag_spec(field, k, value)?;
                not_reserved(field, k, tk)?;
                p.add_tags.insert(tk.to_string(), tv.to_string());
            }
            k if k.starts_with(TAG_DELETION_PREFIX) => {
                let tk = tag_key(field, k, value)?;
                p.remove_tags.push(tk);
            }
            other => {
                return Err(Error::invalid(
                    field,
                    format!(
                        "unknown parameter '{other}' (known: {TYPE}, {IOPS}, {THROUGHPUT}, {TAG_SPEC_PREFIX}N, {TAG_DELETION_PREFIX}N)"
                    ),
                ));
            }
        }
    }
    if let Some(k) = p.remove_tags.iter().find(|k| p.add_tags.contains_key(*k)) {
        return Err(Error::invalid(
            field,
            format!(
                "tag {k} is both added ({TAG_SPEC_PREFIX}N) and deleted ({TAG_DELETION_PREFIX}N)"
            ),
        ));
    }
    p.remove_tags.sort();
    p.remove_tags.dedup();
    Ok(p)
}

impl ControllerService {
    /// ControllerModifyVolume. Idempotent: a volume that already has what is asked for, or a
    /// modification to the same target under way, is success without a second ModifyVolume.
    /// Waits until the modification is `optimizing` or `completed`, at most `deadline` (the
    /// RPC's) or the configured bound.
    pub async fn modify_volume(
        &self,
        volume_id: &str,
        mutable_parameters: &HashMap<String, String>,
        deadline: Option<Duration>,
    ) -> Result<()> {
        // The volume first: the spec's NOT_FOUND row applies to any request for a missing
        // volume, also one whose `mutable_parameters` would be refused (csi-sanity sends an
        // empty map for a volume that does not exist and expects NOT_FOUND).
        self.volume(volume_id).await?;
        if mutable_parameters.is_empty() {
            return Err(Error::invalid("mutable_parameters", "is required"));
        }
        let p = if self.config.warn_on_invalid_tag {
            parse_mutable(
                "mutable_parameters",
                &drop_invalid_tags("mutable_parameters", mutable_parameters),
            )?
        } else {
            parse_mutable("mutable_parameters", mutable_parameters)?
        };
        let _guard = self.claim(format!("volume {volume_id}"))?;
        let bound = self.config.modify_timeout.unwrap_or(DEFAULT_MODIFY_TIMEOUT);
        let timeout = deadline.map_or(bound, |d| d.min(bound));
        let not_found = |e: CloudError| match e {
            CloudError::NotFound { .. } => Error::NotFound {
                kind: "volume",
                id: volume_id.to_string(),
            },
            CloudError::Other { ref code, .. }
                if code == "IncorrectModificationState"
                    || code == "VolumeModificationRateExceeded" =>
            {
                Error::FailedPrecondition(format!(
                    "volume {volume_id} cannot be modified now (EC2 allows one modification at a time, and one per 6 hours): {e}"
                ))
            }
            other => other.into(),
        };
        let sent = self
            .cloud
            .modify_disk(volume_id, &p.change, timeout)
            .await
            .map_err(not_found)?;
        if !p.add_tags.is_empty() || !p.remove_tags.is_empty() {
            self.cloud
                .tag_disk(volume_id, &p.add_tags, &p.remove_tags)
                .await
                .map_err(not_found)?;
        }
        tracing::info!(
            volume_id,
            modify_volume_sent = sent,
            change = ?p.change,
            tags_added = p.add_tags.len(),
            tags_removed = p.remove_tags.len(),
            "volume modified"
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::params::tests::map;

    #[test]
    fn parses_type_performance_and_tags() {
        let p = parse_mutable(
            "mutable_parameters",
            &map(&[
                ("type", "IO2"),
                ("iops", "4000"),
                ("tagSpecification_1", "team=storage"),
                ("tagSpecification_2", "cost-center="),
                ("tagDeletion_1", "old"),
            ]),
        )
        .unwrap();
        assert_eq!(p.change.volume_type.as_deref(), Some("io2"));
        assert_eq!(p.change.iops, Some(4000));
        assert_eq!(p.change.throughput, None);
        assert_eq!(p.add_tags.get("cost-center").map(String::as_str), Some(""));
        assert_eq!(p.remove_tags, vec!["old".to_string()]);
    }

    #[test]
    fn warn_on_invalid_tag_drops_only_the_invalid_tags() {
        let kept = drop_invalid_tags(
            "parameters",
            &map(&[
                ("type", "io2"),
                ("tagSpecification_1", "good=1"),
                ("tagSpecification_2", "novalue"),
                ("tagSpecification_3", "aws:x=1"),
                ("tagSpecification_4", "CSIVolumeName=x"),
                ("tagDeletion_1", "old"),
                ("tagDeletion_2", ""),
            ]),
        );
        let mut keys: Vec<&str> = kept.keys().map(String::as_str).collect();
        keys.sort();
        assert_eq!(keys, ["tagDeletion_1", "tagSpecification_1", "type"]);
    }

    #[test]
    fn bad_mutable_parameters_name_the_key() {
        for (pairs, needle) in [
            (vec![("type", "gp9")], "type"),
            (vec![("iops", "-3")], "iops"),
            (vec![("throughput", "fast")], "throughput"),
            (vec![("encrypted", "true")], "encrypted"),
            (
                vec![("tagSpecification_1", "novalue")],
                "tagSpecification_1",
            ),
            (
                vec![("tagSpecification_1", "CSIVolumeName=x")],
                "CSIVolumeName",
            ),
            (vec![("tagDeletion_1", "aws:foo")], "tagDeletion_1"),
            (
                vec![("tagSpecification_1", "a=b"), ("tagDeletion_1", "a")],
                "both added",
            ),
        ] {
            let err = parse_mutable("mutable_parameters", &map(&pairs))
                .unwrap_err()
                .to_string();
            assert!(err.contains(needle), "{err}");
            assert!(err.contains("mutable_parameters"), "{err}");
        }
    }
}
