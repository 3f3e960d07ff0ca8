//! CreateTags, DeleteTags on volumes, instances and snapshots.

use super::dry_run;
use super::lookup_instance;
use super::snapshots::lookup_snapshot;
use super::volumes::lookup;
use crate::engine::Engine;
use crate::query::{Params, check_tag};
use crate::xml::{ApiError, Xml};

/// AWS allows 50 user tags per resource.
const MAX_TAGS: usize = 50;

fn resource_ids(params: &Params) -> Result<Vec<String>, ApiError> {
    let ids = params.list("ResourceId");
    if ids.is_empty() {
        return Err(ApiError::missing("ResourceId"));
    }
    Ok(ids)
}

/// Checks that the resource exists, with the kind-specific error codes.
fn check_resource(engine: &Engine, id: &str) -> Result<(), ApiError> {
    if id.starts_with("vol-") {
        lookup(engine, id).map(|_| ())
    } else if id.starts_with("i-") {
        lookup_instance(engine, id).map(|_| ())
    } else if id.starts_with("snap-") {
        lookup_snapshot(engine, id).map(|_| ())
    } else {
        Err(ApiError::new(
            "InvalidID",
            format!("The ID '{id}' is not valid"),
        ))
    }
}

fn tags_of<'a>(engine: &'a mut Engine, id: &str) -> Option<&'a mut Vec<(String, String)>> {
    if id.starts_with("vol-") {
        engine.cloud.volumes.get_mut(id).map(|v| &mut v.tags)
    } else if id.starts_with("i-") {
        engine.cloud.instances.get_mut(id).map(|i| &mut i.tags)
    } else {
        engine.cloud.snapshots.get_mut(id).map(|s| &mut s.tags)
    }
}

pub(crate) fn create(engine: &mut Engine, params: &Params, x: &mut Xml) -> Result<(), ApiError> {
    let ids = resource_ids(params)?;
    let tags = params.tags("Tag")?;
    if tags.is_empty() {
        return Err(ApiError::missing("Tag"));
    }
    for (k, v) in &tags {
        check_tag(k, v.as_deref().unwrap_or(""))?;
    }
    for id in &ids {
        check_resource(engine, id)?;
        let existing = tags_of(engine, id).map(|t| t.clone()).unwrap_or_default();
        let mut keys: Vec<&str> = existing.iter().map(|(k, _)| k.as_str()).collect();
        for (k, _) in &tags {
            if !keys.contains(&k.as_str()) {
                keys.push(k);
            }
        }
        if keys.len() > MAX_TAGS {
            return Err(ApiError::new(
                "TagLimitExceeded",
                format!(
                    "The maximum number of tags ({MAX_TAGS}) for resource '{id}' has been reached."
                ),
            ));
        }
    }
    dry_run(params)?;
    for id in &ids {
        if let Some(t) = tags_of(engine, id) {
            for (k, v) in &tags {
                let v = v.clone().unwrap_or_default();
                match t.iter_mut().find(|(tk, _)| tk == k) {
                    Some(slot) => slot.1 = v,
                    None => t.push((k.clone(), v)),
                }
            }
        }
    }
    engine.dirty = true;
    x.leaf("return", true);
    Ok(())
}

pub(crate) fn delete(engine: &mut Engine, params: &Params, x: &mut Xml) -> Result<(), ApiError> {
    let ids = resource_ids(params)?;
    let tags = params.tags("Tag")?;
    for id in &ids {
        check_resource(engine, id)?;
    }
    dry_run(params)?;
    for id in &ids {
        if let Some(t) = tags_of(engine, id) {
            if tags.is_empty() {
                // No Tag.N: every user tag goes.
                t.clear();
            }
            for (k, v) in &tags {
                // With a value, only a tag with that exact value goes.
                t.retain(|(tk, tv)| !(tk == k && v.as_ref().is_none_or(|v| v == tv)));
            }
        }
    }
    engine.dirty = true;
    x.leaf("return", true);
    Ok(())
}
