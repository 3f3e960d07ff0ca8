//! Whose API write is it. The embedded API server's audit trail records every request with its
//! User-Agent; a scenario names its parties (the benchmark itself, and each component under
//! test by the prefix its client puts first) and [`Parties::tally`] splits the writes among
//! them. Failed writes (409 conflicts, 422 validation errors) count: they cost the server as
//! much as successful ones.
//!
//! A party is recognised by its binary's file name and a slash: kube-rs clients here send
//! `csi-attacher/VERSION` (and `... leader-election`), client-go sends `BINARY/VERSION (os/arch)
//! ...`, so ours and the Go components are told apart the same way.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

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

    /// The writes of the given "verb resource[/subresource]" keys.
    pub fn of_requests(&self, keys: &[&str]) -> u64 {
        keys.iter().filter_map(|k| self.by_request.get(*k)).sum()
    }

    pub fn merge(&mut self, other: &Writes) {
        self.total += other.total;
        self.failed += other.failed;
        for (k, n) in &other.by_request {
            *self.by_request.entry(k.clone()).or_default() += n;
        }
    }
}

/// The parties of a scenario: the benchmark's own client (its exact User-Agent), components
/// known by a User-Agent prefix, and the party everything else is counted as.
#[derive(Debug, Clone)]
pub struct Parties<P> {
    own: String,
    by_prefix: Vec<(String, P)>,
    rest: P,
}

impl<P: Copy + Ord> Parties<P> {
    /// `own` is the benchmark's User-Agent; unrecognised agents are `rest`'s.
    pub fn new(own: &str, rest: P) -> Self {
        Self {
            own: own.to_owned(),
            by_prefix: Vec::new(),
            rest,
        }
    }

    /// Requests whose User-Agent starts with `prefix` are `party`'s.
    pub fn with_prefix(mut self, prefix: impl Into<String>, party: P) -> Self {
        self.by_prefix.push((prefix.into(), party));
        self
    }

    /// Requests of the binary `bin` (its file name and a slash) are `party`'s.
    pub fn with_binary(self, bin: &Path, party: P) -> Self {
        match bin.file_name() {
            Some(name) => self.with_prefix(format!("{}/", name.to_string_lossy()), party),
            None => self,
        }
    }

    /// The prefix that marks `party`'s requests, if it has one.
    pub fn prefix_of(&self, party: P) -> Option<&str> {
        self.by_prefix
            .iter()
            .find(|(_, p)| *p == party)
            .map(|(prefix, _)| prefix.as_str())
    }

    /// `None` for the benchmark's own requests.
    pub fn who(&self, user_agent: &str) -> Option<P> {
        if user_agent == self.own {
            return None;
        }
        Some(
            self.by_prefix
                .iter()
                .find(|(prefix, _)| user_agent.starts_with(prefix.as_str()))
                .map_or(self.rest, |(_, p)| *p),
        )
    }

    /// The writes of a slice of the audit trail, by party.
    pub fn tally(&self, records: &[AuditRecord]) -> Tally<P> {
        let mut t = Tally {
            own: Writes::default(),
            parties: BTreeMap::new(),
        };
        for r in records.iter().filter(|r| is_write(&r.verb)) {
            match self.who(&r.user_agent) {
                None => t.own.add(r),
                Some(p) => {
                    let (writes, agents) = t.parties.entry(p).or_default();
                    writes.add(r);
                    agents.insert(r.user_agent.to_string());
                }
            }
        }
        t
    }

    /// The resources of which `party` has not opened a watch in `records` yet: a component is
    /// ready for the load once its informers listed and watch (the audit records a watch as it
    /// starts).
    pub fn missing_watches<'a>(
        &self,
        records: &[AuditRecord],
        party: P,
        resources: &[&'a str],
    ) -> Vec<&'a str> {
        resources
            .iter()
            .copied()
            .filter(|res| {
                !records.iter().any(|r| {
                    r.verb == "watch"
                        && r.resource == *res
                        && self.who(&r.user_agent) == Some(party)
                })
            })
            .collect()
    }
}

/// The writes of a slice of the audit trail: the benchmark's own, and each party's with the
/// User-Agents it was seen under.
#[derive(Debug, Clone)]
pub struct Tally<P> {
    pub own: Writes,
    parties: BTreeMap<P, (Writes, BTreeSet<String>)>,
}

impl<P: Ord> Tally<P> {
    pub fn of(&self, party: P) -> Writes {
        self.parties
            .get(&party)
            .map(|(w, _)| w.clone())
            .unwrap_or_default()
    }

    pub fn agents_of(&self, party: P) -> BTreeSet<String> {
        self.parties
            .get(&party)
            .map(|(_, a)| a.clone())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
    enum Party {
        Adc,
        Attacher,
    }

    fn rec(agent: &str, verb: &str, resource: &str, sub: Option<&str>, code: u16) -> AuditRecord {
        AuditRecord {
            user: Default::default(),
            user_agent: agent.into(),
            verb: verb.into(),
            group: Default::default(),
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

    fn parties() -> Parties<Party> {
        Parties::new("csi-bench-adc/0.1.0", Party::Adc)
            .with_binary(Path::new("/t/release/csi-attacher"), Party::Attacher)
    }

    #[test]
    fn splits_writes_by_party_and_skips_reads() {
        let adc = "attach-detach-controller/0.1.0";
        let records = vec![
            rec("csi-bench-adc/0.1.0", "create", "pods", None, 201),
            rec(adc, "create", "volumeattachments", None, 201),
            rec(adc, "patch", "nodes", Some("status"), 200),
            rec(adc, "create", "events", None, 201),
            rec(adc, "get", "nodes", None, 200),
            rec(
                "csi-attacher/0.1.0",
                "patch",
                "volumeattachments",
                None,
                200,
            ),
            rec(
                "csi-attacher/0.1.0",
                "patch",
                "volumeattachments",
                Some("status"),
                409,
            ),
            rec(
                "csi-attacher/0.1.0 leader-election",
                "update",
                "leases",
                None,
                200,
            ),
            // client-go's default agent for a binary of that name.
            rec(
                "csi-attacher/v4.8.0 (linux/amd64) kubernetes/abc",
                "patch",
                "persistentvolumes",
                None,
                200,
            ),
            rec(
                "csi-attacher/0.1.0",
                "watch",
                "volumeattachments",
                None,
                200,
            ),
        ];
        let t = parties().tally(&records);
        assert_eq!(t.own.total, 1);
        let adc_writes = t.of(Party::Adc);
        assert_eq!(adc_writes.total, 3);
        assert_eq!(adc_writes.to_resource("nodes"), 1);
        assert_eq!(adc_writes.to_resource("volumeattachments"), 1);
        assert_eq!(adc_writes.to_resource("node"), 0);
        let att = t.of(Party::Attacher);
        assert_eq!(att.total, 4);
        assert_eq!(att.failed, 1);
        assert_eq!(att.to_resource("volumeattachments"), 2);
        assert_eq!(
            att.by_request.get("patch volumeattachments/status"),
            Some(&1)
        );
        assert_eq!(
            att.of_requests(&["patch volumeattachments", "update leases", "none"]),
            2
        );
        assert_eq!(t.agents_of(Party::Adc), BTreeSet::from([adc.to_owned()]));
        assert_eq!(t.agents_of(Party::Attacher).len(), 3);

        let mut sum = Writes::default();
        sum.merge(&att);
        sum.merge(&att);
        assert_eq!(sum.total, 8);
        assert_eq!(sum.by_request.get("update leases"), Some(&2));
    }

    #[test]
    fn a_prefix_is_not_a_substring_and_the_rest_gets_the_others() {
        let p = parties();
        assert_eq!(p.prefix_of(Party::Attacher), Some("csi-attacher/"));
        assert_eq!(p.prefix_of(Party::Adc), None);
        assert_eq!(p.who("csi-bench-adc/0.1.0"), None);
        assert_eq!(p.who("my-csi-attacher/1"), Some(Party::Adc));
        assert_eq!(p.who("csi-attacher-x/1"), Some(Party::Adc));
        assert_eq!(p.who(""), Some(Party::Adc));
        let without = Parties::new("own/1", Party::Adc);
        assert_eq!(without.who("csi-attacher/0.1.0"), Some(Party::Adc));
        assert_eq!(without.tally(&[]).of(Party::Attacher), Writes::default());
    }

    #[test]
    fn readiness_needs_a_watch_by_that_party() {
        let records = vec![
            rec("csi-bench-adc/0.1.0", "watch", "pods", None, 200),
            rec("adc/1", "list", "pods", None, 200),
            rec("adc/1", "watch", "nodes", None, 200),
            rec("csi-attacher/1", "watch", "persistentvolumes", None, 200),
        ];
        let res = ["pods", "nodes", "persistentvolumes"];
        let p = parties();
        assert_eq!(
            p.missing_watches(&records, Party::Adc, &res),
            vec!["pods", "persistentvolumes"]
        );
        assert_eq!(
            p.missing_watches(&records, Party::Attacher, &res),
            vec!["pods", "nodes"]
        );
    }
}
