//! EC2 actions: validation like AWS, then the state change, then the response document.

mod attach;
mod instances;
mod known;
mod mappings;
mod modify;
mod snapshots;
mod tags;
mod volumes;
mod zones;

use crate::engine::Engine;
use crate::ids;
use crate::query::{Filter, Params};
use crate::xml::{ApiError, Xml};

pub(crate) fn dispatch(
    engine: &mut Engine,
    action: &str,
    params: &Params,
    now: u64,
    x: &mut Xml,
) -> Result<(), ApiError> {
    if crate::engine::ACTIONS.contains(&action) {
        known::check(action, params)?;
    }
    match action {
        "CreateVolume" => volumes::create(engine, params, now, x),
        "DeleteVolume" => volumes::delete(engine, params, now, x),
        "DescribeVolumes" => volumes::describe(engine, params, now, x),
        "AttachVolume" => attach::attach(engine, params, now, x),
        "DetachVolume" => attach::detach(engine, params, now, x),
        "RunInstances" => instances::run(engine, params, now, x),
        "TerminateInstances" => instances::terminate(engine, params, now, x),
        "DescribeInstances" => instances::describe(engine, params, now, x),
        "DescribeAvailabilityZones" => zones::describe(engine, params, x),
        "CreateSnapshot" => snapshots::create(engine, params, now, x),
        "DeleteSnapshot" => snapshots::delete(engine, params, x),
        "DescribeSnapshots" => snapshots::describe(engine, params, now, x),
        "ModifyVolume" => modify::modify(engine, params, now, x),
        "DescribeVolumesModifications" => modify::describe(engine, params, now, x),
        "CreateTags" => tags::create(engine, params, x),
        "DeleteTags" => tags::delete(engine, params, x),
        "" => Err(ApiError::missing("Action")),
        other => Err(ApiError::new(
            "InvalidAction",
            format!("The action {other} is not valid for this web service."),
        )),
    }
}

/// `DryRun=true`: everything validated, nothing done.
pub(crate) fn dry_run(params: &Params) -> Result<(), ApiError> {
    if params.flag("DryRun")? {
        return Err(ApiError::dry_run());
    }
    Ok(())
}

/// Checks a resource ID's shape, with EC2's `<Kind>ID.Malformed` code.
/// An instance by ID, or EC2's error for a malformed or unknown one.
pub(crate) fn lookup_instance<'a>(
    engine: &'a Engine,
    id: &str,
) -> Result<&'a crate::model::Instance, ApiError> {
    check_id(id, "i", "InvalidInstanceID.Malformed")?;
    engine.cloud.instances.get(id).ok_or_else(|| {
        ApiError::new(
            "InvalidInstanceID.NotFound",
            format!("The instance ID '{id}' does not exist"),
        )
    })
}

pub(crate) fn check_id(id: &str, prefix: &str, malformed_code: &str) -> Result<(), ApiError> {
    if ids::is_valid_id(id, prefix) {
        Ok(())
    } else {
        Err(ApiError::new(
            malformed_code,
            format!("Invalid id: \"{id}\" (expecting \"{prefix}-...\")"),
        ))
    }
}

/// EC2 client tokens: up to 64 ASCII characters.
pub(crate) fn client_token(params: &Params) -> Result<Option<String>, ApiError> {
    match params.get("ClientToken") {
        None | Some("") => Ok(None),
        Some(t) if t.len() > 64 || !t.is_ascii() => Err(ApiError::invalid_value(
            "ClientToken",
            t,
            "Client tokens are at most 64 ASCII characters.",
        )),
        Some(t) => Ok(Some(t.to_string())),
    }
}

pub(crate) fn idempotent_mismatch() -> ApiError {
    ApiError::new(
        "IdempotentParameterMismatch",
        "The client token you have provided is associated with a resource that is already \
         deleted or was created with different parameters. Please use a different client token.",
    )
}

/// Paging: `MaxResults` within `min..` (values above `max` are clamped, as AWS does) and an
/// opaque `NextToken` holding the ID to continue after.
pub(crate) struct Page {
    pub(crate) limit: Option<usize>,
    pub(crate) after: Option<String>,
}

pub(crate) fn page(params: &Params, min: i64, max: i64, prefix: &str) -> Result<Page, ApiError> {
    let limit = match params.int("MaxResults")? {
        None => None,
        Some(n) if n < min => {
            return Err(ApiError::invalid_value(
                "MaxResults",
                &n.to_string(),
                &format!("Expecting a value greater than or equal to {min}."),
            ));
        }
        Some(n) => Some(n.min(max) as usize),
    };
    let after = match params.get("NextToken") {
        None | Some("") => None,
        Some(t) => Some(decode_token(t, prefix)?),
    };
    Ok(Page { limit, after })
}

/// Tokens are the hex of the last ID returned, so they are opaque but stable across restarts.
pub(crate) fn encode_token(last_id: &str) -> String {
    last_id.bytes().map(|b| format!("{b:02x}")).collect()
}

fn decode_token(token: &str, prefix: &str) -> Result<String, ApiError> {
    let bad = || {
        ApiError::new(
            "InvalidPaginationToken",
            format!("The pagination token '{token}' is invalid or expired."),
        )
    };
    if token.len() % 2 != 0 || token.len() > 128 {
        return Err(bad());
    }
    let mut bytes = Vec::with_capacity(token.len() / 2);
    for i in (0..token.len()).step_by(2) {
        let byte = token
            .get(i..i + 2)
            .and_then(|h| u8::from_str_radix(h, 16).ok())
            .ok_or_else(bad)?;
        bytes.push(byte);
    }
    let id = String::from_utf8(bytes).map_err(|_| bad())?;
    if !ids::is_valid_id(&id, prefix) {
        return Err(bad());
    }
    Ok(id)
}

/// Applies a page to IDs in ascending order; returns the slice and the next token.
pub(crate) fn paginate<T>(
    items: Vec<(String, T)>,
    page: &Page,
) -> (Vec<(String, T)>, Option<String>) {
    let mut items: Vec<(String, T)> = match &page.after {
        Some(after) => items.into_iter().filter(|(id, _)| id > after).collect(),
        None => items,
    };
    let Some(limit) = page.limit else {
        return (items, None);
    };
    if items.len() <= limit {
        return (items, None);
    }
    items.truncate(limit);
    let next = items.last().map(|(id, _)| encode_token(id));
    (items, next)
}

pub(crate) fn invalid_filter(f: &Filter) -> ApiError {
    ApiError::new(
        "InvalidParameterValue",
        format!("The filter '{}' is invalid", f.name),
    )
}

/// Matches `tag:KEY` and `tag-key` filters; `None` when the filter is not a tag filter.
pub(crate) fn tag_filter(f: &Filter, tags: &[(String, String)]) -> Option<bool> {
    use crate::query::filter_matches;
    if let Some(key) = f.name.strip_prefix("tag:") {
        return Some(filter_matches(
            f,
            tags.iter()
                .filter(|(k, _)| k == key)
                .map(|(_, v)| v.as_str()),
        ));
    }
    if f.name == "tag-key" {
        return Some(filter_matches(f, tags.iter().map(|(k, _)| k.as_str())));
    }
    None
}

pub(crate) fn not_found(code: &str, kind: &str, missing: &[&String]) -> ApiError {
    let list: Vec<String> = missing.iter().map(|s| format!("'{s}'")).collect();
    let verb = if missing.len() == 1 { "does" } else { "do" };
    ApiError::new(
        code,
        format!("The {kind} {} {verb} not exist.", list.join(", ")),
    )
}

/// What one Describe* action accepts.
pub(crate) struct DescribeSpec<'a> {
    /// The ID list parameter (`VolumeId`) and the response set it names in errors (`volumeSet`).
    pub(crate) id_param: &'a str,
    pub(crate) set_name: &'a str,
    /// Filter names besides `tag:KEY` and `tag-key`.
    pub(crate) filters: &'a [&'a str],
    /// The largest MaxResults (the smallest is 5 for all of them).
    pub(crate) max_results: i64,
    /// ID prefix (`vol`) and the error codes for a malformed and an unknown ID.
    pub(crate) id_prefix: &'a str,
    pub(crate) malformed: &'a str,
    pub(crate) not_found: &'a str,
    /// The noun in the not-found message.
    pub(crate) noun: &'a str,
}

/// The validated IDs, filters and page of a Describe* request.
pub(crate) struct DescribeQuery {
    pub(crate) ids: Vec<String>,
    pub(crate) filters: Vec<Filter>,
    pub(crate) page: Page,
}

/// The checks every Describe* action makes, in AWS's order: filter names, IDs together with
/// MaxResults, the page, malformed IDs, unknown IDs (`exists`), then DryRun.
pub(crate) fn describe_query(
    params: &Params,
    spec: &DescribeSpec<'_>,
    exists: impl Fn(&str) -> bool,
) -> Result<DescribeQuery, ApiError> {
    let ids = params.list(spec.id_param);
    let filters = params.filters()?;
    if let Some(f) = filters.iter().find(|f| {
        !f.name.starts_with("tag:")
            && f.name != "tag-key"
            && !spec.filters.contains(&f.name.as_str())
    }) {
        return Err(invalid_filter(f));
    }
    if !ids.is_empty() && params.get("MaxResults").is_some() {
        return Err(ApiError::combination(format!(
            "The parameter {} cannot be used with the parameter maxResults",
            spec.set_name
        )));
    }
    let page = page(params, 5, spec.max_results, spec.id_prefix)?;
    for id in &ids {
        check_id(id, spec.id_prefix, spec.malformed)?;
    }
    let missing: Vec<&String> = ids.iter().filter(|id| !exists(id)).collect();
    if !missing.is_empty() {
        return Err(not_found(spec.not_found, spec.noun, &missing));
    }
    dry_run(params)?;
    Ok(DescribeQuery { ids, filters, page })
}

impl Engine {
    /// Runs one EC2 action and returns the response document.
    pub(crate) fn handle(
        &mut self,
        action: &str,
        params: &Params,
        request_id: &str,
    ) -> Result<String, ApiError> {
        self.tick();
        let now = ids::now_ms();
        let mut x = Xml::response(action, request_id);
        let result = dispatch(self, action, params, now, &mut x);
        self.history.observe(&self.cloud, now, &Default::default());
        if self.dirty {
            // Reconcile right away: with Timing::Instant a device exists when the call returns.
            self.reconcile();
            self.tick();
        }
        result.map(|()| x.finish())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_reject_garbage() {
        let t = encode_token("vol-0123456789abcdef0");
        assert_eq!(decode_token(&t, "vol").unwrap(), "vol-0123456789abcdef0");
        assert_eq!(
            decode_token("zz", "vol").unwrap_err().code,
            "InvalidPaginationToken"
        );
        assert!(decode_token(&encode_token("snap-0123456789abcdef0"), "vol").is_err());
    }

    #[test]
    fn paginate_splits_pages() {
        let items: Vec<(String, u32)> = (0..7).map(|i| (format!("vol-0000000{i}"), i)).collect();
        let p = Page {
            limit: Some(5),
            after: None,
        };
        let (first, next) = paginate(items.clone(), &p);
        assert_eq!(first.len(), 5);
        let after = decode_token(&next.unwrap(), "vol").unwrap();
        let (second, next) = paginate(
            items,
            &Page {
                limit: Some(5),
                after: Some(after),
            },
        );
        assert_eq!(second.len(), 2);
        assert!(next.is_none());
    }
}
