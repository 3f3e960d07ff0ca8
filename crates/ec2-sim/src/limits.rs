//! AWS's published limits per EBS volume type: size, IOPS, throughput and their ratios.

use crate::xml::ApiError;

pub(crate) const VOLUME_TYPES: &[&str] = &["standard", "io1", "io2", "gp2", "sc1", "st1", "gp3"];

/// The performance a volume ends up with after defaults are applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Performance {
    pub(crate) iops: Option<u32>,
    pub(crate) throughput: Option<u32>,
}

struct TypeLimits {
    min_size: u64,
    max_size: u64,
}

fn size_limits(volume_type: &str) -> Option<TypeLimits> {
    let (min_size, max_size) = match volume_type {
        "gp2" | "gp3" => (1, 16_384),
        "io1" => (4, 16_384),
        // io2 is Block Express everywhere now: up to 64 TiB.
        "io2" => (4, 65_536),
        "st1" | "sc1" => (125, 16_384),
        "standard" => (1, 1_024),
        _ => return None,
    };
    Some(TypeLimits { min_size, max_size })
}

pub(crate) fn check_type(volume_type: &str) -> Result<(), ApiError> {
    if VOLUME_TYPES.contains(&volume_type) {
        Ok(())
    } else {
        Err(ApiError::invalid_value(
            "volumeType",
            volume_type,
            "Valid values: standard | io1 | io2 | gp2 | sc1 | st1 | gp3",
        ))
    }
}

pub(crate) fn check_size(volume_type: &str, size: i64) -> Result<u64, ApiError> {
    check_type(volume_type)?;
    let Some(l) = size_limits(volume_type) else {
        return Err(ApiError::internal("no limits for a known volume type"));
    };
    if size < l.min_size as i64 {
        return Err(ApiError::new(
            "InvalidParameterValue",
            format!(
                "Volume of {size}GiB is too small; minimum is {}GiB for volume type {volume_type}.",
                l.min_size
            ),
        ));
    }
    if size as u64 > l.max_size {
        return Err(ApiError::new(
            "InvalidParameterValue",
            format!(
                "Volume of {size}GiB is too large; maximum is {}GiB for volume type {volume_type}.",
                l.max_size
            ),
        ));
    }
    Ok(size as u64)
}

fn not_supported(param: &str, volume_type: &str) -> ApiError {
    ApiError::combination(format!(
        "The parameter {param} is not supported for {volume_type} volumes."
    ))
}

/// Validates IOPS and throughput for a type and size, and fills AWS's defaults.
pub(crate) fn check_performance(
    volume_type: &str,
    size: u64,
    iops: Option<i64>,
    throughput: Option<i64>,
) -> Result<Performance, ApiError> {
    if throughput.is_some() && volume_type != "gp3" {
        return Err(not_supported("throughput", volume_type));
    }
    match volume_type {
        "gp3" => {
            let iops = iops.unwrap_or(3000);
            range("iops", iops, 3000, 16_000)?;
            // Every gp3 volume gets 3,000 IOPS; more costs 500 IOPS per GiB at most.
            if iops > 3000 && iops as f64 / size as f64 > 500.0 {
                return Err(ratio(
                    "Iops to volume size",
                    iops as f64 / size as f64,
                    500.0,
                ));
            }
            let throughput = throughput.unwrap_or(125);
            range("throughput", throughput, 125, 1000)?;
            // 0.25 MiB/s per provisioned IOPS above the 125 MiB/s baseline.
            if throughput > 125 && throughput as f64 / iops as f64 > 0.25 {
                return Err(ratio(
                    "Throughput (MiBps) to iops",
                    throughput as f64 / iops as f64,
                    0.25,
                ));
            }
            Ok(Performance {
                iops: Some(iops as u32),
                throughput: Some(throughput as u32),
            })
        }
        "io1" | "io2" => {
            let Some(iops) = iops else {
                return Err(ApiError::missing("iops"));
            };
            let (max, per_gib) = if volume_type == "io1" {
                (64_000, 50.0)
            } else {
                (256_000, 1000.0)
            };
            range("iops", iops, 100, max)?;
            if iops as f64 / size as f64 > per_gib {
                return Err(ratio(
                    "Iops to volume size",
                    iops as f64 / size as f64,
                    per_gib,
                ));
            }
            Ok(Performance {
                iops: Some(iops as u32),
                throughput: None,
            })
        }
        "gp2" => {
            if iops.is_some() {
                return Err(not_supported("iops", volume_type));
            }
            // gp2 reports its burst baseline: 3 IOPS per GiB within 100..=16,000.
            let baseline = (size.saturating_mul(3)).clamp(100, 16_000);
            Ok(Performance {
                iops: Some(baseline as u32),
                throughput: None,
            })
        }
        other => {
            if iops.is_some() {
                return Err(not_supported("iops", other));
            }
            check_type(other)?;
            Ok(Performance {
                iops: None,
                throughput: None,
            })
        }
    }
}

pub(crate) fn check_multi_attach(volume_type: &str, enabled: bool) -> Result<(), ApiError> {
    if enabled && volume_type != "io1" && volume_type != "io2" {
        return Err(ApiError::combination(format!(
            "The volume type {volume_type} does not support Multi-Attach; use io1 or io2."
        )));
    }
    Ok(())
}

fn range(field: &str, v: i64, min: i64, max: i64) -> Result<(), ApiError> {
    if v < min || v > max {
        return Err(ApiError::invalid_value(
            field,
            &v.to_string(),
            &format!("Expected a value between {min} and {max}."),
        ));
    }
    Ok(())
}

fn ratio(what: &str, got: f64, max: f64) -> ApiError {
    ApiError::new(
        "InvalidParameterValue",
        format!("{what} ratio of {got:.6} is too high; maximum is {max:.6}."),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_per_type() {
        assert!(check_size("gp3", 1).is_ok());
        assert!(check_size("gp3", 0).is_err());
        assert!(check_size("gp3", 16_385).is_err());
        assert!(check_size("io1", 3).is_err());
        assert!(check_size("io2", 65_536).is_ok());
        assert!(check_size("st1", 124).is_err());
        assert!(check_size("sc1", 125).is_ok());
        assert!(check_size("standard", 1_025).is_err());
        assert_eq!(
            check_size("gp4", 10).unwrap_err().code,
            "InvalidParameterValue"
        );
    }

    #[test]
    fn gp3_defaults_and_ratios() {
        let p = check_performance("gp3", 1, None, None).unwrap();
        assert_eq!(p.iops, Some(3000));
        assert_eq!(p.throughput, Some(125));
        // 4,000 IOPS needs at least 8 GiB.
        assert!(check_performance("gp3", 7, Some(4000), None).is_err());
        assert!(check_performance("gp3", 8, Some(4000), None).is_ok());
        assert!(check_performance("gp3", 100, Some(16_001), None).is_err());
        // 1,000 MiB/s needs 4,000 IOPS.
        assert!(check_performance("gp3", 100, Some(3000), Some(1000)).is_err());
        assert!(check_performance("gp3", 100, Some(4000), Some(1000)).is_ok());
        assert!(check_performance("gp3", 100, None, Some(124)).is_err());
    }

    #[test]
    fn provisioned_iops_types() {
        assert_eq!(
            check_performance("io1", 10, None, None).unwrap_err().code,
            "MissingParameter"
        );
        assert!(check_performance("io1", 10, Some(500), None).is_ok());
        assert!(check_performance("io1", 10, Some(501), None).is_err());
        assert!(check_performance("io2", 10, Some(10_000), None).is_ok());
        assert!(check_performance("io2", 10, Some(10_001), None).is_err());
        assert!(check_performance("io2", 10, Some(99), None).is_err());
    }

    #[test]
    fn parameters_not_supported_by_type() {
        assert_eq!(
            check_performance("gp2", 10, Some(100), None)
                .unwrap_err()
                .code,
            "InvalidParameterCombination"
        );
        assert_eq!(
            check_performance("io1", 10, Some(100), Some(200))
                .unwrap_err()
                .code,
            "InvalidParameterCombination"
        );
        assert!(check_performance("st1", 500, Some(100), None).is_err());
        assert_eq!(
            check_performance("gp2", 10, None, None).unwrap().iops,
            Some(100)
        );
        assert!(check_multi_attach("gp3", true).is_err());
        assert!(check_multi_attach("io2", true).is_ok());
    }
}
