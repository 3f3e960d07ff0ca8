//! Counting API writes from the embedded API server's audit trail.
//!
//! Every request the server answered is recorded with its User-Agent. The run's own client
//! sends [`crate::USER_AGENT`]; nothing else talks to the server but the attacher, so every
//! other write is the attacher's, whatever it calls itself. Failed writes (409 conflicts, 422
//! validation errors) count: they cost the server as much as successful ones.

use std::collections::{BTreeMap, BTreeSet};

use apiserver::AuditRecord;
use serde::Serialize;

/// create, update, patch, delete, deletecollection.
pub fn is_write(verb: &str) -> bool {
    matches!(
        verb,
        "create" | "update" | "patch" | "delete" | "deletecollection"
    )
}

/// "patch volumeattachments/status": the verb and the resource with its subresource.
pub fn request_key(r: &AuditRecord) -> String {
    match &r.subresource {
        Some(sub) => format!("{} {}/{}", r.verb, r.resource, sub),
        None => format!("{} {}", r.verb, r.resource),
    }
}

/// Writes, counted by "verb resource[/subresource]".
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Writes {
    pub total: u64,
    /// Answered with an HTTP error (>= 400): conflicts, validation errors, not found.
    pub failed: u64,
    pub by_request: BTreeMap<String, u64>,
}

impl Writes {
    pub fn add(&mut self, r: &AuditRecord) {
        self.total += 1;
        if r.code >= 400 {
            self.failed += 1;
        }
        *self.by_request.entry(request_key(r)).or_default() += 1;
    }

    /// Writes to one resource, its subresources included ("volumeattachments" counts
    /// "patch volumeattachments/status" too).
    pub fn to_resource(&self, resource: &str) -> u64 {
        self.by_request
            .iter()
            .filter(|(key, _)| {
                key.split_once(' ')
                    .map(|(_, res)| res.split('/').next() == Some(resource))
                    .unwrap_or(false)
            })
            .map(|(_, n)| n)
            .sum()
    }

    pub fn merge(&mut self, other: &Writes) {
        self.total += other.total;
        self.failed += other.failed;
        for (k, n) in &other.by_request {
            *self.by_request.entry(k.clone()).or_default() += n;
        }
    }
}

/// The writes in a slice of the audit trail, split by who made them.
#[derive(Debug, Clone, Default)]
pub(crate) struct Tally {
    pub(crate) attacher: Writes,
    pub(crate) own: Writes,
    /// User-Agents of the writes that were not ours.
    pub(crate) attacher_agents: BTreeSet<String>,
}

pub(crate) fn tally(records: &[AuditRecord], own_agent: &str) -> Tally {
    let mut t = Tally::default();
    for r in records.iter().filter(|r| is_write(&r.verb)) {
        if r.user_agent == own_agent {
            t.own.add(r);
        } else {
            t.attacher.add(r);
            t.attacher_agents.insert(r.user_agent.to_string());
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(agent: &str, verb: &str, resource: &str, sub: Option<&str>, code: u16) -> AuditRecord {
        AuditRecord {
            user: Default::default(),
            user_agent: agent.into(),
            verb: verb.into(),
            group: "storage.k8s.io".into(),
            version: "v1".into(),
            resource: resource.into(),
            subresource: sub.map(Into::into),
            namespace: None,
            name: Some("x".into()),
            code,
            received: std::time::Instant::now(),
            took: std::time::Duration::ZERO,
        }
    }

    #[test]
    fn splits_by_agent_and_skips_reads() {
        let records = vec![
            rec(
                "attacher-load/0.1.0",
                "create",
                "volumeattachments",
                None,
                201,
            ),
            rec("csi-attacher/1", "patch", "volumeattachments", None, 200),
            rec(
                "csi-attacher/1",
                "patch",
                "volumeattachments",
                Some("status"),
                200,
            ),
            rec("csi-attacher/1", "patch", "persistentvolumes", None, 409),
            rec("csi-attacher/1", "get", "persistentvolumes", None, 200),
            rec("csi-attacher/1", "watch", "volumeattachments", None, 200),
            rec("", "create", "events", None, 201),
        ];
        let t = tally(&records, "attacher-load/0.1.0");
        assert_eq!(t.own.total, 1);
        assert_eq!(t.attacher.total, 4);
        assert_eq!(t.attacher.failed, 1);
        assert_eq!(t.attacher.to_resource("volumeattachments"), 2);
        assert_eq!(t.attacher.to_resource("persistentvolumes"), 1);
        assert_eq!(t.attacher.to_resource("volume"), 0);
        assert_eq!(
            t.attacher.by_request.get("patch volumeattachments/status"),
            Some(&1)
        );
        assert_eq!(
            t.attacher_agents,
            ["".to_owned(), "csi-attacher/1".to_owned()].into()
        );

        let mut sum = Writes::default();
        sum.merge(&t.attacher);
        sum.merge(&t.attacher);
        assert_eq!(sum.total, 8);
        assert_eq!(sum.by_request.get("create events"), Some(&2));
    }
}
