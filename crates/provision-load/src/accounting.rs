//! Whose write is it. The API server's audit trail names every request's User-Agent, and three
//! parties talk to it: provision-load itself ([`crate::USER_AGENT`]), the provisioner and the
//! PV controller.
//!
//! The provisioner is recognised by its binary's file name and a slash, which both kube-rs here
//! (`csi-provisioner/VERSION`, `... leader-election`) and client-go (`csi-provisioner/v5.2.0
//! (linux/amd64) kubernetes/...`) put first; the PV controller by `pv-controller/`
//! (`pv_controller::user_agent`). Anything else is "other" and should not exist: the report
//! lists its User-Agents. Counting and request keys are attacher-load's.

use std::collections::BTreeSet;
use std::path::Path;

use apiserver::AuditRecord;
use attacher_load::Writes;
use attacher_load::accounting::is_write;
use serde::Serialize;

/// Who made a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Who {
    Own,
    Provisioner,
    PvController,
    Other,
}

/// How User-Agents map to the parties of a run.
#[derive(Debug, Clone)]
pub struct Agents {
    own: String,
    provisioner_prefix: String,
    pv_controller_prefix: String,
}

impl Agents {
    pub fn new(own: &str, provisioner_bin: &Path) -> Self {
        let name = provisioner_bin
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "csi-provisioner".into());
        let pv_controller = pv_controller::user_agent();
        let pv_controller_name = pv_controller.split('/').next().unwrap_or("pv-controller");
        Self {
            own: own.to_owned(),
            provisioner_prefix: format!("{name}/"),
            pv_controller_prefix: format!("{pv_controller_name}/"),
        }
    }

    pub fn who(&self, user_agent: &str) -> Who {
        if user_agent == self.own {
            Who::Own
        } else if user_agent.starts_with(&self.provisioner_prefix) {
            Who::Provisioner
        } else if user_agent.starts_with(&self.pv_controller_prefix) {
            Who::PvController
        } else {
            Who::Other
        }
    }
}

/// The writes of one phase, by party.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PhaseWrites {
    pub provisioner: Writes,
    pub pv_controller: Writes,
    /// Neither of the two nor provision-load: should stay empty.
    pub other: Writes,
    pub other_agents: BTreeSet<String>,
    /// provision-load's own (the claims' creates and deletes).
    pub own: Writes,
}

pub fn tally(records: &[AuditRecord], agents: &Agents) -> PhaseWrites {
    let mut t = PhaseWrites::default();
    for r in records.iter().filter(|r| is_write(&r.verb)) {
        match agents.who(&r.user_agent) {
            Who::Own => t.own.add(r),
            Who::Provisioner => t.provisioner.add(r),
            Who::PvController => t.pv_controller.add(r),
            Who::Other => {
                t.other.add(r);
                t.other_agents.insert(r.user_agent.to_string());
            }
        }
    }
    t
}

/// The resources of which `who` has not opened a watch in `records` yet: a component is ready
/// for the load once its informers listed and watch (the audit records a watch as it starts).
pub fn missing_watches<'a>(
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
    #![allow(clippy::unwrap_used, clippy::expect_used)]
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
    fn writes_are_split_by_party_and_reads_skipped() {
        let agents = Agents::new(
            "provision-load/0.1.0",
            Path::new("/t/release/csi-provisioner"),
        );
        let pvc = pv_controller::user_agent();
        let records = vec![
            rec(
                "provision-load/0.1.0",
                "create",
                "persistentvolumeclaims",
                None,
                201,
            ),
            rec(
                "csi-provisioner/0.1.0",
                "create",
                "persistentvolumes",
                None,
                201,
            ),
            rec("csi-provisioner/0.1.0", "create", "events", None, 201),
            rec(
                "csi-provisioner/0.1.0",
                "get",
                "persistentvolumeclaims",
                None,
                200,
            ),
            // client-go's agent for a Go binary of that name.
            rec(
                "csi-provisioner/v5.2.0 (linux/amd64) kubernetes/abc",
                "patch",
                "persistentvolumes",
                None,
                409,
            ),
            rec(&pvc, "patch", "persistentvolumeclaims", Some("status"), 200),
            rec(&pvc, "patch", "persistentvolumes", None, 200),
            rec(&pvc, "watch", "persistentvolumes", None, 200),
            rec("kubectl/v1.32", "delete", "persistentvolumes", None, 200),
        ];
        let t = tally(&records, &agents);
        assert_eq!(t.own.total, 1);
        assert_eq!(t.provisioner.total, 3);
        assert_eq!(t.provisioner.failed, 1);
        assert_eq!(t.provisioner.to_resource("persistentvolumes"), 2);
        assert_eq!(t.pv_controller.total, 2);
        assert_eq!(
            t.pv_controller
                .by_request
                .get("patch persistentvolumeclaims/status"),
            Some(&1)
        );
        assert_eq!(t.other.total, 1);
        assert_eq!(t.other_agents, BTreeSet::from(["kubectl/v1.32".to_owned()]));
        // A prefix, not a substring.
        assert_eq!(agents.who("my-csi-provisioner/1"), Who::Other);
    }

    #[test]
    fn readiness_needs_a_watch_by_that_party() {
        let agents = Agents::new("provision-load/0.1.0", Path::new("csi-provisioner"));
        let records = vec![
            rec(
                "provision-load/0.1.0",
                "watch",
                "persistentvolumes",
                None,
                200,
            ),
            rec("csi-provisioner/1", "list", "persistentvolumes", None, 200),
            rec(
                "csi-provisioner/1",
                "watch",
                "persistentvolumeclaims",
                None,
                200,
            ),
        ];
        let res = ["persistentvolumeclaims", "persistentvolumes"];
        assert_eq!(
            missing_watches(&records, &agents, Who::Provisioner, &res),
            vec!["persistentvolumes"]
        );
        assert_eq!(
            missing_watches(&records, &agents, Who::PvController, &res),
            res.to_vec()
        );
    }
}
