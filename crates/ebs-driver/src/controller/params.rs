//! CreateVolume parameters (the StorageClass's `parameters`) and capacity ranges.

use std::collections::{BTreeMap, HashMap};

use ebs_cloud::DiskOptions;

use crate::capability;
use crate::{Error, Result};

pub(crate) const GIB: i64 = 1 << 30;
/// CSI leaves the size to the plugin when no capacity range is given; AWS's driver uses 100 GiB.
pub(crate) const DEFAULT_SIZE_GIB: i64 = 100;

pub(crate) const TYPE: &str = "type";
pub(crate) const IOPS: &str = "iops";
pub(crate) const IOPS_PER_GB: &str = "iopsPerGB";
pub(crate) const THROUGHPUT: &str = "throughput";
pub(crate) const ENCRYPTED: &str = "encrypted";
pub(crate) const KMS_KEY_ID: &str = "kmsKeyId";
/// Raise an `iopsPerGB` result below the type's minimum to that minimum. Keys are
/// case-insensitive in the Go driver, and csi-translation writes this one in lowercase for
/// migrated `kubernetes.io/aws-ebs` classes with `iopsPerGB`.
pub(crate) const ALLOW_AUTO_IOPS_PER_GB_INCREASE: &str = "allowAutoIOPSPerGBIncrease";
pub(crate) const FS_TYPE: &str = "csi.storage.k8s.io/fstype";
pub(crate) const TAG_SPEC_PREFIX: &str = "tagSpecification_";
/// What the external-provisioner adds with `--extra-create-metadata`.
const PVC_NAME: &str = "csi.storage.k8s.io/pvc/name";
const PVC_NAMESPACE: &str = "csi.storage.k8s.io/pvc/namespace";
const PV_NAME: &str = "csi.storage.k8s.io/pv/name";

/// The parsed parameters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct CreateParams {
    pub(crate) volume_type: String,
    pub(crate) iops: Option<i64>,
    pub(crate) iops_per_gb: Option<i64>,
    pub(crate) allow_iops_increase: bool,
    pub(crate) throughput: Option<i64>,
    pub(crate) encrypted: bool,
    pub(crate) kms_key_id: Option<String>,
    pub(crate) fs_type: Option<String>,
    pub(crate) tags: BTreeMap<String, String>,
}

/// The EBS volume types.
pub(crate) const VOLUME_TYPES: &[&str] = &["gp2", "gp3", "io1", "io2", "st1", "sc1", "standard"];

fn number(key: &str, value: &str) -> Result<i64> {
    positive("parameters", key, value)
}

/// A positive whole number, or InvalidArgument on `field` naming the key.
pub(crate) fn positive(field: &'static str, key: &str, value: &str) -> Result<i64> {
    match value.trim().parse::<i64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(Error::invalid(
            field,
            format!("{key}: '{value}' is not a positive whole number"),
        )),
    }
}

/// `candidate` (the caller's normalisation of `value`) lowercased, if it is an EBS volume type;
/// else InvalidArgument on `field` quoting `value` as given.
pub(crate) fn volume_type(field: &'static str, value: &str, candidate: &str) -> Result<String> {
    let t = candidate.to_ascii_lowercase();
    if !VOLUME_TYPES.contains(&t.as_str()) {
        return Err(Error::invalid(
            field,
            format!("type: '{value}' is not one of {}", VOLUME_TYPES.join(", ")),
        ));
    }
    Ok(t)
}

/// A tag key as given in parameter `param`, trimmed: 1-128 characters, not `aws:...`.
pub(crate) fn tag_key<'a>(field: &'static str, param: &str, key: &'a str) -> Result<&'a str> {
    let key = key.trim();
    if key.is_empty() || key.len() > 128 || key.starts_with("aws:") {
        return Err(Error::invalid(
            field,
            format!("{param}: tag key '{key}' must be 1-128 characters and not start with aws:"),
        ));
    }
    Ok(key)
}

/// A `tagSpecification_N` entry (`param`): `key=value` with a valid key, both trimmed (an empty
/// value is allowed).
pub(crate) fn tag_spec<'a>(
    field: &'static str,
    param: &str,
    value: &'a str,
) -> Result<(&'a str, &'a str)> {
    let Some((tk, tv)) = value.split_once('=') else {
        return Err(Error::invalid(
            field,
            format!("{param}: '{value}' is not key=value"),
        ));
    };
    Ok((tag_key(field, param, tk)?, tv.trim()))
}

/// Parses the parameters; an unknown key or a bad value is InvalidArgument naming the key.
pub(crate) fn parse(parameters: &HashMap<String, String>) -> Result<CreateParams> {
    let mut p = CreateParams {
        volume_type: "gp3".into(),
        ..CreateParams::default()
    };
    // Sorted, so the first bad key reported is the same every time.
    let sorted: BTreeMap<&String, &String> = parameters.iter().collect();
    for (key, value) in sorted {
        match key.as_str() {
            TYPE => p.volume_type = volume_type("parameters", value, value)?,
            IOPS => p.iops = Some(number(key, value)?),
            IOPS_PER_GB => p.iops_per_gb = Some(number(key, value)?),
            THROUGHPUT => p.throughput = Some(number(key, value)?),
            ENCRYPTED => {
                p.encrypted = match value.to_ascii_lowercase().as_str() {
                    "true" => true,
                    "false" => false,
                    _ => {
                        return Err(Error::invalid(
                            "parameters",
                            format!("encrypted: '{value}' is not true or false"),
                        ));
                    }
                }
            }
            KMS_KEY_ID => p.kms_key_id = Some(value.clone()).filter(|v| !v.is_empty()),
            k if k.eq_ignore_ascii_case(ALLOW_AUTO_IOPS_PER_GB_INCREASE) => {
                p.allow_iops_increase = match value.to_ascii_lowercase().as_str() {
                    "true" => true,
                    "false" => false,
                    _ => {
                        return Err(Error::invalid(
                            "parameters",
                            format!("{k}: '{value}' is not true or false"),
                        ));
                    }
                }
            }
            FS_TYPE => {
                let fs = capability::fs_type(value).ok_or_else(|| {
                    Error::invalid(
                        "parameters",
                        format!(
                            "{FS_TYPE}: '{value}' is not one of {}",
                            capability::supported_fs_types()
                        ),
                    )
                })?;
                p.fs_type = Some(fs.to_string());
            }
            PVC_NAME => {
                p.tags
                    .insert("kubernetes.io/created-for/pvc/name".into(), value.clone());
            }
            PVC_NAMESPACE => {
                p.tags.insert(
                    "kubernetes.io/created-for/pvc/namespace".into(),
                    value.clone(),
                );
            }
            PV_NAME => {
                p.tags
                    .insert("kubernetes.io/created-for/pv/name".into(), value.clone());
            }
            k if k.starts_with(TAG_SPEC_PREFIX) => {
                let (tk, tv) = tag_spec("parameters", k, value)?;
                p.tags.insert(tk.to_string(), tv.to_string());
            }
            other => {
                return Err(Error::invalid(
                    "parameters",
                    format!(
                        "unknown parameter '{other}' (known: {TYPE}, {IOPS}, {IOPS_PER_GB}, {ALLOW_AUTO_IOPS_PER_GB_INCREASE}, {THROUGHPUT}, {ENCRYPTED}, {KMS_KEY_ID}, {FS_TYPE}, {TAG_SPEC_PREFIX}N)"
                    ),
                ));
            }
        }
    }
    if p.iops.is_some() && p.iops_per_gb.is_some() {
        return Err(Error::invalid(
            "parameters",
            "iops and iopsPerGB cannot both be set",
        ));
    }
    if p.kms_key_id.is_some() && !p.encrypted {
        return Err(Error::invalid(
            "parameters",
            "kmsKeyId needs encrypted: \"true\"",
        ));
    }
    Ok(p)
}

/// GiB for a capacity range: `required_bytes` rounded up to whole GiB (at least 1), and the
/// result must not exceed `limit_bytes` when one is set.
pub(crate) fn size_gib(required: i64, limit: i64) -> Result<i64> {
    if required < 0 || limit < 0 {
        return Err(Error::invalid(
            "capacity_range",
            "required_bytes and limit_bytes must not be negative",
        ));
    }
    if limit > 0 && required > limit {
        return Err(Error::invalid(
            "capacity_range",
            format!("required_bytes {required} is more than limit_bytes {limit}"),
        ));
    }
    let gib = if required == 0 {
        if limit > 0 {
            (limit / GIB).clamp(1, DEFAULT_SIZE_GIB)
        } else {
            DEFAULT_SIZE_GIB
        }
    } else {
        (required + GIB - 1) / GIB
    };
    if limit > 0 && gib * GIB > limit {
        return Err(Error::OutOfRange(format!(
            "EBS sizes are whole GiB: {gib} GiB ({} bytes) is the smallest that holds required_bytes {required}, and it is more than limit_bytes {limit}",
            gib * GIB
        )));
    }
    Ok(gib)
}

impl CreateParams {
    /// The options for [`ebs_cloud::Cloud::create_disk`].
    pub(crate) fn disk_options(
        &self,
        size_gib: i64,
        zone: String,
        snapshot_id: Option<String>,
        extra_tags: &BTreeMap<String, String>,
    ) -> DiskOptions {
        let iops = self.iops.or_else(|| {
            self.iops_per_gb.map(|per| {
                let iops = per.saturating_mul(size_gib);
                match min_iops(&self.volume_type) {
                    Some(min) if self.allow_iops_increase && iops < min => min,
                    _ => iops,
                }
            })
        });
        let mut tags = extra_tags.clone();
        tags.extend(self.tags.clone());
        DiskOptions {
            size_gib,
            volume_type: self.volume_type.clone(),
            iops,
            throughput: self.throughput,
            encrypted: self.encrypted,
            kms_key_id: self.kms_key_id.clone(),
            zone,
            snapshot_id,
            multi_attach: false,
            tags,
        }
    }
}

/// EC2's smallest IOPS setting of the types that take one.
fn min_iops(volume_type: &str) -> Option<i64> {
    match volume_type {
        "io1" | "io2" => Some(100),
        "gp3" => Some(3000),
        _ => None,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Parameters from `(key, value)` pairs (also for `modify`'s tests).
    pub(crate) fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn parses_every_parameter() {
        let p = parse(&map(&[
            ("type", "io2"),
            ("iopsPerGB", "50"),
            ("encrypted", "true"),
            ("kmsKeyId", "alias/aws/ebs"),
            ("csi.storage.k8s.io/fstype", "xfs"),
            ("tagSpecification_1", "team=storage"),
            ("tagSpecification_2", "cost = 42"),
            ("csi.storage.k8s.io/pvc/name", "data"),
        ]))
        .unwrap();
        assert_eq!(p.volume_type, "io2");
        assert_eq!(p.fs_type.as_deref(), Some("xfs"));
        assert_eq!(p.tags.get("team").map(String::as_str), Some("storage"));
        assert_eq!(p.tags.get("cost").map(String::as_str), Some("42"));
        let o = p.disk_options(10, "us-east-1a".into(), None, &BTreeMap::new());
        assert_eq!(o.iops, Some(500));
        assert!(o.encrypted);
    }

    #[test]
    fn allow_auto_iops_per_gb_increase_raises_to_the_minimum_in_any_case() {
        // csi-translation's spelling for a migrated in-tree class.
        let p = parse(&map(&[
            ("type", "io1"),
            ("iopsPerGB", "10"),
            ("allowautoiopspergbincrease", "true"),
        ]))
        .unwrap();
        let o = p.disk_options(4, "us-east-1a".into(), None, &BTreeMap::new());
        assert_eq!(o.iops, Some(100));
        let o = p.disk_options(20, "us-east-1a".into(), None, &BTreeMap::new());
        assert_eq!(o.iops, Some(200));
        let p = parse(&map(&[
            ("type", "io1"),
            ("iopsPerGB", "10"),
            ("allowAutoIOPSPerGBIncrease", "false"),
        ]))
        .unwrap();
        let o = p.disk_options(4, "us-east-1a".into(), None, &BTreeMap::new());
        assert_eq!(o.iops, Some(40), "left to EC2 to refuse");
        let err = parse(&map(&[("allowAutoIOPSPerGBIncrease", "yes")]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("allowAutoIOPSPerGBIncrease"), "{err}");
    }

    #[test]
    fn bad_parameters_name_the_key() {
        for (pairs, needle) in [
            (vec![("type", "gp9")], "type"),
            (vec![("iops", "many")], "iops"),
            (vec![("encrypted", "yes")], "encrypted"),
            (vec![("bogus", "1")], "bogus"),
            (
                vec![("tagSpecification_1", "novalue")],
                "tagSpecification_1",
            ),
            (vec![("kmsKeyId", "k")], "kmsKeyId"),
            (vec![("iops", "100"), ("iopsPerGB", "3")], "iopsPerGB"),
        ] {
            let err = parse(&map(&pairs)).unwrap_err().to_string();
            assert!(err.contains(needle), "{err}");
        }
    }

    #[test]
    fn capacity_rounds_up_and_checks_the_limit() {
        assert_eq!(size_gib(0, 0).unwrap(), DEFAULT_SIZE_GIB);
        assert_eq!(size_gib(1, 0).unwrap(), 1);
        assert_eq!(size_gib(GIB, 0).unwrap(), 1);
        assert_eq!(size_gib(GIB + 1, 0).unwrap(), 2);
        assert_eq!(size_gib(0, 5 * GIB).unwrap(), 5);
        assert_eq!(size_gib(GIB + 1, 2 * GIB).unwrap(), 2);
        assert!(matches!(
            size_gib(GIB + 1, GIB + 2),
            Err(Error::OutOfRange(_))
        ));
        assert!(size_gib(3 * GIB, GIB).is_err());
        assert!(size_gib(-1, 0).is_err());
    }
}
