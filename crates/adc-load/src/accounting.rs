//! Whose write is it: the API server's audit trail names every request's User-Agent, and three
//! parties talk to it: adc-load itself ([`crate::USER_AGENT`]), the attacher and the ADC.
//!
//! The attacher is recognised by the name its client puts first: kube-rs clients here send
//! `csi-attacher/VERSION` (crates/attacher), client-go sends `BINARY/VERSION (os/arch) ...`, so
//! both start with the binary's file name and a slash. Everything else is the ADC's, whatever it
//! calls itself (the report lists the User-Agents it saw). Counting and keys are
//! attacher-load's ([`attacher_load::accounting`]).

use std::collections::BTreeSet;
use std::path::Path;

use apiserver::AuditRecord;
use attacher_load::Writes;
use attacher_load::accounting::is_write;

/// Who made a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Who {
    Own,
    Adc,
    Attacher,
}

/// How User-Agents map to the parties of one scenario.
#[derive(Debug, Clone)]
pub(crate) struct Agents {
    own: String,
    /// `BINARY/` of the attacher; `None` when no attacher runs.
    attacher_prefix: Option<String>,
}

impl Agents {
    pub(crate) fn new(own: &str, attacher_bin: Option<&Path>) -> Self {
        let attacher_prefix = attacher_bin
            .and_then(|b| b.file_name())
            .map(|name| format!("{}/", name.to_string_lossy()));
        Self {
            own: own.to_owned(),
            attacher_prefix,
        }
    }

    /// The User-Agent prefix that marks the attacher's requests.
    pub(crate) fn attacher_prefix(&self) -> Option<&str> {
        self.attacher_prefix.as_deref()
    }

    pub(crate) fn who(&self, user_agent: &str) -> Who {
        if user_agent == self.own {
            Who::Own
        } else if self
            .attacher_prefix
            .as_deref()
            .is_some_and(|p| user_agent.starts_with(p))
        {
            Who::Attacher
        } else {
            Who::Adc
        }
    }
}

/// The writes of a slice of the audit trail, by party.
#[derive(Debug, Clone, Default)]
pub(crate) struct Tally {
    pub(crate) own: Writes,
    pub(crate) adc: Writes,
    pub(crate) attacher: Writes,
    pub(crate) adc_agents: BTreeSet<String>,
    pub(crate) attacher_agents: BTreeSet<String>,
}

pub(crate) fn tally(records: &[AuditRecord], agents: &Agents) -> Tally {
    let mut t = Tally::default();
    for r in records.iter().filter(|r| is_write(&r.verb)) {
        match agents.who(&r.user_agent) {
            Who::Own => t.own.add(r),
            Who::Adc => {
                t.adc.add(r);
                t.adc_agents.insert(r.user_agent.to_string());
            }
            Who::Attacher => {
                t.attacher.add(r);
                t.attacher_agents.insert(r.user_agent.to_string());
            }
        }
    }
    t
}

/// Resources of which `who` has not yet opened a watch in `records`: a component is ready for
/// the load once its informers list and watch (the audit records a watch when it starts).
pub(crate) fn missing_watches<'a>(
    records: &[AuditRecord],
    agents: &Agents,
    who: Who,
    resources: &[&'a str],
) -> Vec<&'a str> {
    resources
        .iter()
        .copied()
        .filter(|res| {
            !records.iter().any(|r| {
                r.verb == "watch" && r.resource == *res && agents.who(&r.user_agent) == who
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn splits_writes_by_party_and_skips_reads() {
        let agents = Agents::new("adc-load/0.1.0", Some(Path::new("/t/release/csi-attacher")));
        let records = vec![
            rec("adc-load/0.1.0", "create", "pods", None, 201),
            rec(
                "attach-detach-controller/0.1.0",
                "create",
                "volumeattachments",
                None,
                201,
            ),
            rec(
                "attach-detach-controller/0.1.0",
                "patch",
                "nodes",
                Some("status"),
                200,
            ),
            rec(
                "attach-detach-controller/0.1.0",
                "create",
                "events",
                None,
                201,
            ),
            rec("attach-detach-controller/0.1.0", "get", "nodes", None, 200),
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
        let t = tally(&records, &agents);
        assert_eq!(t.own.total, 1);
        assert_eq!(t.adc.total, 3);
        assert_eq!(t.adc.to_resource("nodes"), 1);
        assert_eq!(t.adc.to_resource("volumeattachments"), 1);
        assert_eq!(t.attacher.total, 4);
        assert_eq!(t.attacher.failed, 1);
        assert_eq!(t.attacher.to_resource("volumeattachments"), 2);
        assert_eq!(
            t.adc_agents,
            BTreeSet::from(["attach-detach-controller/0.1.0".to_owned()])
        );
        assert_eq!(t.attacher_agents.len(), 3);
    }

    #[test]
    fn without_an_attacher_every_other_agent_is_the_adc() {
        let agents = Agents::new("adc-load/0.1.0", None);
        assert_eq!(agents.who("csi-attacher/0.1.0"), Who::Adc);
        assert_eq!(agents.who(""), Who::Adc);
        assert_eq!(agents.who("adc-load/0.1.0"), Who::Own);
        // A prefix, not a substring: another binary's agent is not the attacher's.
        let with = Agents::new("adc-load/0.1.0", Some(Path::new("/x/csi-attacher")));
        assert_eq!(with.attacher_prefix(), Some("csi-attacher/"));
        assert_eq!(with.who("my-csi-attacher/1"), Who::Adc);
        assert_eq!(with.who("csi-attacher-x/1"), Who::Adc);
    }

    #[test]
    fn readiness_needs_a_watch_by_that_party() {
        let agents = Agents::new("adc-load/0.1.0", Some(Path::new("csi-attacher")));
        let records = vec![
            rec("adc-load/0.1.0", "watch", "pods", None, 200),
            rec("adc/1", "list", "pods", None, 200),
            rec("adc/1", "watch", "nodes", None, 200),
            rec("csi-attacher/1", "watch", "persistentvolumes", None, 200),
        ];
        let res = ["pods", "nodes", "persistentvolumes"];
        assert_eq!(
            missing_watches(&records, &agents, Who::Adc, &res),
            vec!["pods", "persistentvolumes"]
        );
        assert_eq!(
            missing_watches(&records, &agents, Who::Attacher, &res),
            vec!["pods", "nodes"]
        );
    }
}
