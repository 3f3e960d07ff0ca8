//! DescribeAvailabilityZones.

use super::{dry_run, invalid_filter};
use crate::engine::Engine;
use crate::query::{Params, filter_matches};
use crate::xml::{ApiError, Xml};

/// AWS zone IDs are per-account shuffles like `use1-az4`; a fixed mapping is enough here.
fn zone_id(region: &str, index: usize) -> String {
    let short: String = region
        .split('-')
        .enumerate()
        .map(|(i, part)| match i {
            0 => part.to_string(),
            _ => part.chars().next().map(String::from).unwrap_or_default(),
        })
        .collect();
    let short = short.trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    format!("{short}-az{}", index + 1)
}

pub(crate) fn describe(engine: &mut Engine, params: &Params, x: &mut Xml) -> Result<(), ApiError> {
    let names = params.list("ZoneName");
    let zone_ids = params.list("ZoneId");
    let filters = params.filters()?;
    const FILTERS: &[&str] = &["zone-name", "zone-id", "region-name", "state", "zone-type"];
    for f in &filters {
        if !FILTERS.contains(&f.name.as_str()) {
            return Err(invalid_filter(f));
        }
    }
    let region = engine.config.region.clone();
    let zones: Vec<(String, String)> = engine
        .config
        .zones
        .iter()
        .enumerate()
        .map(|(i, z)| (z.clone(), zone_id(&region, i)))
        .collect();
    for n in &names {
        if !zones.iter().any(|(z, _)| z == n) {
            return Err(ApiError::new(
                "InvalidParameterValue",
                format!("The zone '{n}' does not exist."),
            ));
        }
    }
    for n in &zone_ids {
        if !zones.iter().any(|(_, id)| id == n) {
            return Err(ApiError::new(
                "InvalidParameterValue",
                format!("The zone ID '{n}' does not exist."),
            ));
        }
    }
    dry_run(params)?;
    x.start("availabilityZoneInfo");
    for (name, id) in &zones {
        if !names.is_empty() && !names.contains(name) {
            continue;
        }
        if !zone_ids.is_empty() && !zone_ids.contains(id) {
            continue;
        }
        let ok = filters.iter().all(|f| {
            let v = match f.name.as_str() {
                "zone-name" => name.as_str(),
                "zone-id" => id.as_str(),
                "region-name" => region.as_str(),
                "state" => "available",
                _ => "availability-zone",
            };
            filter_matches(f, [v])
        });
        if !ok {
            continue;
        }
        x.start("item")
            .leaf("zoneName", name)
            .leaf("zoneState", "available")
            .leaf("regionName", &region)
            .leaf("zoneId", id)
            .leaf("zoneType", "availability-zone")
            .leaf("optInStatus", "opt-in-not-required")
            .leaf("groupName", &region)
            .leaf("networkBorderGroup", &region)
            .start("messageSet")
            .end("messageSet")
            .end("item");
    }
    x.end("availabilityZoneInfo");
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn zone_ids_look_like_aws() {
        assert_eq!(super::zone_id("us-east-1", 0), "use1-az1");
        assert_eq!(super::zone_id("eu-west-2", 2), "euw2-az3");
    }
}
