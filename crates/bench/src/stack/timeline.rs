//! Where a pod's time goes: each step on its way to Ready is the first (for Ready, the last)
//! successful write that does it in apiserver-lite's audit record, timed from the pod's create
//! call. Read together, the steps show which component a burst waits on: a long gap before
//! "node selected" is the scheduler's queue, before "PV created" the provisioner's, and so on.
//! The audit record is what kube-apiserver's audit log would show, so no component is asked
//! anything and none is slowed down by being measured.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use apiserver::AuditRecord;
use serde::{Deserialize, Serialize};

use super::measure::{self, Latency, component};

/// What the bench knows of one pod once it is Ready, to find its objects' writes.
#[derive(Debug, Clone)]
pub(crate) struct PodTrail {
    /// The pod's and its claim's name (namespace `default`).
    pub name: String,
    /// Just before the pod's create call.
    pub created: Instant,
    /// The PV its claim was bound to.
    pub volume: Option<String>,
    /// The VolumeAttachment the attach/detach controller would create for it (where the
    /// driver needs attaching).
    pub attachment: Option<String>,
}

/// One step: pod create → the write that did it, over the pods that had it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Stage {
    pub step: String,
    /// The component that writes it.
    pub by: String,
    pub since_create: Latency,
}

/// Which object of a pod a step writes.
#[derive(Clone, Copy)]
enum Object {
    Claim,
    Pod,
    Volume,
    Attachment,
}

struct Step {
    label: &'static str,
    by: &'static str,
    verb: &'static [&'static str],
    resource: &'static str,
    subresource: Option<&'static str>,
    object: Object,
    /// The last matching write instead of the first (Ready is the node agent's last status
    /// write of the pod).
    last: bool,
}

/// The steps in the order a pod goes through them (WaitForFirstConsumer classes).
const STEPS: [Step; 9] = [
    Step {
        label: "node selected (claim annotated)",
        by: "scheduler",
        verb: &["patch", "update"],
        resource: "persistentvolumeclaims",
        subresource: None,
        object: Object::Claim,
        last: false,
    },
    Step {
        label: "claim handed to the provisioner",
        by: "pv-controller",
        verb: &["patch", "update"],
        resource: "persistentvolumeclaims",
        subresource: None,
        object: Object::Claim,
        last: false,
    },
    Step {
        label: "PV created",
        by: "provisioner",
        verb: &["create"],
        resource: "persistentvolumes",
        subresource: None,
        object: Object::Volume,
        last: false,
    },
    Step {
        label: "PV Bound (its phase)",
        by: "pv-controller",
        verb: &["patch", "update"],
        resource: "persistentvolumes",
        subresource: Some("status"),
        object: Object::Volume,
        last: false,
    },
    Step {
        label: "claim Bound",
        by: "pv-controller",
        verb: &["patch", "update"],
        resource: "persistentvolumeclaims",
        subresource: Some("status"),
        object: Object::Claim,
        last: false,
    },
    Step {
        label: "pod bound to its node",
        by: "scheduler",
        verb: &["create"],
        resource: "pods",
        subresource: Some("binding"),
        object: Object::Pod,
        last: false,
    },
    Step {
        label: "VolumeAttachment created",
        by: "adc",
        verb: &["create"],
        resource: "volumeattachments",
        subresource: None,
        object: Object::Attachment,
        last: false,
    },
    Step {
        label: "attached (VolumeAttachment status)",
        by: "attacher",
        verb: &["patch", "update"],
        resource: "volumeattachments",
        subresource: Some("status"),
        object: Object::Attachment,
        last: false,
    },
    Step {
        label: "Ready (pod status)",
        by: "node-agent",
        verb: &["patch", "update"],
        resource: "pods",
        subresource: Some("status"),
        object: Object::Pod,
        last: true,
    },
];

/// The steps that happened, each with its latency since pod create.
pub(crate) fn stages(records: &[AuditRecord], pods: &[PodTrail]) -> Vec<Stage> {
    let mut out = Vec::new();
    for step in &STEPS {
        // The object name → when the step's write for it came in.
        let mut at: HashMap<&str, Instant> = HashMap::new();
        for r in records.iter().filter(|r| {
            r.code < 300
                && step.verb.contains(&r.verb.as_str())
                && r.resource == step.resource
                && r.subresource.as_deref() == step.subresource
                && component(&r.user_agent) == step.by
        }) {
            let Some(name) = r.name.as_deref() else {
                continue;
            };
            let slot = at.entry(name).or_insert(r.received);
            if step.last {
                *slot = (*slot).max(r.received);
            }
        }
        let samples: Vec<Duration> = pods
            .iter()
            .filter_map(|p| {
                let name = match step.object {
                    Object::Claim | Object::Pod => Some(p.name.as_str()),
                    Object::Volume => p.volume.as_deref(),
                    Object::Attachment => p.attachment.as_deref(),
                }?;
                Some(at.get(name)?.saturating_duration_since(p.created))
            })
            .collect();
        if samples.is_empty() {
            continue;
        }
        out.push(Stage {
            step: step.label.to_string(),
            by: step.by.to_string(),
            since_create: measure::latency(&samples),
        });
    }
    out
}

/// apiserver-lite's own time on the stack's writes in a window: how long it held them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct ServerTime {
    pub writes: usize,
    /// Sum over the writes, seconds: above the window's length means writes waited on each
    /// other inside the server.
    pub total_s: f64,
    pub per_write: Latency,
}

pub(crate) fn server_time(records: &[AuditRecord]) -> ServerTime {
    let took: Vec<Duration> = records
        .iter()
        .filter(|r| {
            matches!(r.verb.as_str(), "create" | "update" | "patch" | "delete")
                && !r.user_agent.starts_with(measure::BENCH_USER_AGENT)
        })
        .map(|r| r.took)
        .collect();
    ServerTime {
        writes: took.len(),
        total_s: took.iter().sum::<Duration>().as_secs_f64(),
        per_write: measure::latency(&took),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(ua: &str, verb: &str, resource: &str, sub: Option<&str>, name: &str) -> AuditRecord {
        AuditRecord {
            user: Default::default(),
            user_agent: format!("{ua}/0.1").into(),
            verb: verb.into(),
            group: Default::default(),
            version: "v1".into(),
            resource: resource.into(),
            subresource: sub.map(Into::into),
            namespace: Some("default".into()),
            name: Some(name.into()),
            code: 200,
            received: Instant::now(),
            took: Duration::from_millis(2),
        }
    }

    #[test]
    fn each_step_is_timed_from_its_pods_create_and_ready_is_the_last_status_write() {
        let t0 = Instant::now();
        let at = |ms: u64, ua: &str, verb: &str, res: &str, sub: Option<&str>, name: &str| {
            let mut r = rec(ua, verb, res, sub, name);
            r.received = t0 + Duration::from_millis(ms);
            r
        };
        let pvc = "persistentvolumeclaims";
        let mut records = vec![
            at(10, "csi-scheduler", "patch", pvc, None, "a"),
            at(20, "pv-controller", "patch", pvc, None, "a"),
            at(
                30,
                "csi-provisioner",
                "create",
                "persistentvolumes",
                None,
                "pvc-1",
            ),
            at(
                40,
                "pv-controller",
                "patch",
                "persistentvolumes",
                Some("status"),
                "pvc-1",
            ),
            at(50, "pv-controller", "update", pvc, Some("status"), "a"),
            at(60, "csi-scheduler", "create", "pods", Some("binding"), "a"),
            at(80, "csi-node-agent", "patch", "pods", Some("status"), "a"),
            at(95, "csi-node-agent", "patch", "pods", Some("status"), "a"),
            // Someone else's write on the same object is not the step.
            at(5, "csi-node-agent", "patch", pvc, None, "a"),
            // A failed write is not the step either.
            at(1, "csi-scheduler", "create", "pods", Some("binding"), "a"),
        ];
        records[9].code = 409;
        let pods = [PodTrail {
            name: "a".into(),
            created: t0,
            volume: Some("pvc-1".into()),
            attachment: Some("csi-x".into()),
        }];
        let got: Vec<(String, u128)> = stages(&records, &pods)
            .into_iter()
            .map(|s| (s.step, (s.since_create.p50_s * 1000.0).round() as u128))
            .collect();
        assert_eq!(
            got,
            vec![
                ("node selected (claim annotated)".to_string(), 10),
                ("claim handed to the provisioner".to_string(), 20),
                ("PV created".to_string(), 30),
                ("PV Bound (its phase)".to_string(), 40),
                ("claim Bound".to_string(), 50),
                ("pod bound to its node".to_string(), 60),
                ("Ready (pod status)".to_string(), 95),
            ],
            "no attach step without an attach write"
        );
        let server = server_time(&records);
        assert_eq!(server.writes, 10);
        assert!((server.total_s - 0.020).abs() < 1e-9);
    }
}
