//! What a request asks for: its parameters and body ([`Req`]), the resource and object its path
//! addresses ([`Target`]), and the parameters every verb parses alike (selectors,
//! resourceVersion).

use std::collections::HashMap;

use bytes::Bytes;
use http::Method;

use crate::resources::{self, ResourceDef, ResourceId};
use crate::selectors::{FieldSelector, LabelSelector, Selectors};
use crate::status::{ApiError, ApiResult};
use crate::store::Key;

/// A parsed request.
#[derive(Debug)]
pub(crate) struct Req {
    pub method: Method,
    pub query: HashMap<String, String>,
    pub accept: String,
    pub content_type: String,
    pub user_agent: String,
    pub body: Bytes,
}

impl Req {
    pub fn param(&self, k: &str) -> Option<&str> {
        self.query
            .get(k)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    pub fn flag(&self, k: &str) -> bool {
        matches!(self.param(k), Some("true" | "1"))
    }

    pub fn wants_table(&self) -> bool {
        self.accept.contains("as=Table")
    }

    pub fn dry_run(&self) -> bool {
        self.param("dryRun").is_some()
    }
}

/// The resource (and maybe object and subresource) a request addresses.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub res: ResourceId,
    pub ns: Option<String>,
    pub name: Option<String>,
    pub sub: Option<String>,
}

impl Target {
    pub fn def(&self) -> &'static ResourceDef {
        resources::get(self.res)
    }

    pub fn key(&self) -> Key {
        (
            self.ns.clone().unwrap_or_default(),
            self.name.clone().unwrap_or_default(),
        )
    }
}

/// The target of a resource path below `/api/VERSION` or `/apis/GROUP/VERSION`.
pub(crate) fn parse_target(group: &str, version: &str, rest: &[&str]) -> ApiResult<Target> {
    let namespaced_path = rest.len() >= 3
        && rest[0] == "namespaces"
        && resources::find(group, version, rest[2]).is_some_and(|r| resources::get(r).namespaced);
    let (ns, plural, tail) = if namespaced_path {
        (Some(rest[1].to_string()), rest[2], &rest[3..])
    } else {
        match rest.split_first() {
            Some((p, tail)) => (None, *p, tail),
            None => return Err(ApiError::no_route()),
        }
    };
    let res = resources::find(group, version, plural).ok_or_else(ApiError::no_route)?;
    let def = resources::get(res);
    let (name, sub) = match tail {
        [] => (None, None),
        [n] => (Some(n.to_string()), None),
        [n, s] => (Some(n.to_string()), Some(s.to_string())),
        _ => return Err(ApiError::no_route()),
    };
    // A namespaced object is only addressable inside its namespace.
    if def.namespaced && ns.is_none() && name.is_some() {
        return Err(ApiError::no_route());
    }
    match sub.as_deref() {
        None => {}
        Some("status") if def.status => {}
        Some("binding") if def.plural == "pods" && def.group.is_empty() => {}
        Some("token") if def.plural == "serviceaccounts" && def.group.is_empty() => {}
        Some("scale") if resources::has_scale(def) => {}
        Some(_) => return Err(ApiError::no_route()),
    }
    Ok(Target { res, ns, name, sub })
}

pub(crate) fn selectors(def: &ResourceDef, req: &Req) -> ApiResult<Selectors> {
    // kube-apiserver answers the selectors' own errors, unprefixed.
    let labels = LabelSelector::parse(req.param("labelSelector").unwrap_or(""))
        .map_err(ApiError::bad_request)?;
    let fields = FieldSelector::parse(req.param("fieldSelector").unwrap_or(""), def)
        .map_err(ApiError::bad_request)?;
    Ok(Selectors { labels, fields })
}

/// Parses a resourceVersion parameter the way the real server does (400 when not a number).
pub(crate) fn parse_rv(s: &str) -> ApiResult<u64> {
    s.parse::<u64>().map_err(|_| {
        ApiError::bad_request(format!(
            "invalid resource version \"{s}\": strconv.ParseUint: parsing \"{s}\": invalid syntax"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_like_the_real_paths() {
        let t = parse_target("", "v1", &["namespaces", "default", "pods", "p", "status"]).unwrap();
        assert_eq!(t.def().plural, "pods");
        assert_eq!(t.ns.as_deref(), Some("default"));
        assert_eq!(t.sub.as_deref(), Some("status"));
        let t = parse_target("", "v1", &["namespaces", "default"]).unwrap();
        assert_eq!(t.def().plural, "namespaces");
        assert_eq!(t.name.as_deref(), Some("default"));
        let t = parse_target("", "v1", &["namespaces", "x", "status"]).unwrap();
        assert_eq!(t.sub.as_deref(), Some("status"));
        let t = parse_target("storage.k8s.io", "v1", &["volumeattachments"]).unwrap();
        assert!(t.name.is_none());
        assert!(parse_target("", "v1", &["pods", "p"]).is_err());
        assert!(parse_target("", "v1", &["deployments"]).is_err());
        assert!(parse_target("", "v1", &["secrets"]).is_ok());
        assert!(parse_target("", "v1", &["namespaces", "d", "secrets", "s", "status"]).is_err());
        assert!(parse_target("", "v1", &["namespaces", "d", "nodes"]).is_err());
    }
}
