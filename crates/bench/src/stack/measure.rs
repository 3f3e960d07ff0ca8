//! The numbers: latency percentiles, API writes from apiserver-lite's audit record by
//! component (named from its User-Agent), and this process's memory (the harness's readers).

use std::collections::BTreeMap;
use std::time::Duration;

use apiserver::AuditRecord;
use serde::{Deserialize, Serialize};

use crate::harness::procfs;
use crate::harness::stats::percentile;
use crate::harness::writes::{is_write, request_key};

/// The bench's own client's User-Agent: its creates and deletes are not the stack's work.
pub(crate) const BENCH_USER_AGENT: &str = "csi-bench-stack";

/// p50 / p99 / max of a set of latencies, in seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Latency {
    pub count: usize,
    pub p50_s: f64,
    pub p99_s: f64,
    pub max_s: f64,
}

pub(crate) fn latency(samples: &[Duration]) -> Latency {
    let mut sorted = samples.to_vec();
    sorted.sort();
    let secs = |d: Option<Duration>| d.unwrap_or_default().as_secs_f64();
    Latency {
        count: sorted.len(),
        p50_s: secs(percentile(&sorted, 50.0)),
        p99_s: secs(percentile(&sorted, 99.0)),
        max_s: sorted.last().copied().unwrap_or_default().as_secs_f64(),
    }
}

/// The stack's API writes in a window, per pod (or per claim).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Writes {
    /// Creates, updates, patches and deletes by every component, leases left out, / N.
    pub per_pod: f64,
    /// The same, whole numbers.
    pub total: usize,
    /// Writes answered with an error (409 conflicts, 422), included in `total`.
    pub failed: usize,
    /// Lease renewals in the window (leader election, node heartbeats): time-driven
    /// background, not per-pod work, so not in `total`.
    pub lease_writes: usize,
    /// `total` split by component (named from its User-Agent), / N.
    pub per_pod_by_component: BTreeMap<String, f64>,
    /// `total` split by component and request ("attacher patch volumeattachments/status"),
    /// whole numbers.
    pub by_request: BTreeMap<String, usize>,
    /// The failed ones by component, request and code ("adc create volumeattachments 409").
    pub failed_by_request: BTreeMap<String, usize>,
    /// VolumeAttachments created in the window.
    pub volume_attachments_created: usize,
}

/// The component a User-Agent belongs to: the part before the version, with the names the
/// tables use for the ones that matter here.
pub(crate) fn component(user_agent: &str) -> String {
    let base = user_agent.split('/').next().unwrap_or_default().trim();
    match base {
        "attach-detach-controller" => "adc",
        "csi-attacher" => "attacher",
        "csi-node-agent" => "node-agent",
        "csi-provisioner" => "provisioner",
        "pv-controller" => "pv-controller",
        "csi-scheduler" => "scheduler",
        "statefulset-controller" => "statefulset",
        "" => "unnamed",
        other => other,
    }
    .to_string()
}

/// A request as the tables name it: "attacher patch volumeattachments/status".
fn request_name(who: &str, r: &AuditRecord) -> String {
    format!("{who} {}", request_key(r))
}

/// Tallies the writes of `records` (the window's audit record), leaving out the bench's own.
pub(crate) fn writes(records: &[AuditRecord], n: usize) -> Writes {
    let mut w = Writes::default();
    let mut by_component: BTreeMap<String, usize> = BTreeMap::new();
    for r in records.iter().filter(|r| is_write(&r.verb)) {
        if r.user_agent.starts_with(BENCH_USER_AGENT) {
            continue;
        }
        if r.resource == "leases" {
            w.lease_writes += 1;
            continue;
        }
        w.total += 1;
        let who = component(&r.user_agent);
        let what = request_name(&who, r);
        if r.code >= 400 {
            w.failed += 1;
            *w.failed_by_request
                .entry(format!("{what} {}", r.code))
                .or_default() += 1;
        }
        if r.resource == "volumeattachments"
            && r.verb == "create"
            && r.subresource.is_none()
            && r.code < 300
        {
            w.volume_attachments_created += 1;
        }
        *by_component.entry(who).or_default() += 1;
        *w.by_request.entry(what).or_default() += 1;
    }
    let n = n.max(1) as f64;
    w.per_pod = w.total as f64 / n;
    w.per_pod_by_component = by_component
        .into_iter()
        .map(|(c, k)| (c, k as f64 / n))
        .collect();
    w
}

/// The stack's API reads in a window: gets, lists and watches started, the bench's own left
/// out. Each costs the API server a lookup and an encode, and a real kube-apiserver its
/// priority-and-fairness seats; watches should be a few per component, gets near 0 per pod
/// once the caches are warm.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Reads {
    /// Gets and lists, / N.
    pub per_pod: f64,
    pub total: usize,
    /// Watches started (resumed ones included).
    pub watches: usize,
    /// Gets, lists and watches by component and request ("node-agent get persistentvolumes").
    pub by_request: BTreeMap<String, usize>,
}

/// Tallies the reads of `records`, leaving out the bench's own.
pub(crate) fn reads(records: &[AuditRecord], n: usize) -> Reads {
    let mut r = Reads::default();
    for rec in records
        .iter()
        .filter(|r| matches!(r.verb.as_str(), "get" | "list" | "watch"))
    {
        if rec.user_agent.starts_with(BENCH_USER_AGENT) {
            continue;
        }
        if rec.verb == "watch" {
            r.watches += 1;
        } else {
            r.total += 1;
        }
        *r.by_request
            .entry(request_name(&component(&rec.user_agent), rec))
            .or_default() += 1;
    }
    r.per_pod = r.total as f64 / n.max(1) as f64;
    r
}

/// This process's memory now, in MiB: (VmRSS, VmHWM); zeros if `/proc` cannot be read.
pub(crate) fn memory() -> (f64, f64) {
    let mib = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
    procfs::memory(std::process::id()).map_or((0.0, 0.0), |m| (mib(m.rss), mib(m.hwm)))
}

/// Resets VmHWM to the current RSS (`clear_refs` 5, Linux 4.0+), so each scenario's peak is
/// its own and not the largest so far in this process. Best effort: on failure the peak is
/// the process's so far, which the report then overstates.
pub(crate) fn reset_peak() {
    if let Err(e) = std::fs::write("/proc/self/clear_refs", "5") {
        tracing::warn!(error = %e, "resetting VmHWM through /proc/self/clear_refs");
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn rec(ua: &str, verb: &str, resource: &str, sub: Option<&str>, code: u16) -> AuditRecord {
        AuditRecord {
            user: Default::default(),
            user_agent: ua.into(),
            verb: verb.into(),
            group: Default::default(),
            version: "v1".into(),
            resource: resource.into(),
            subresource: sub.map(Into::into),
            namespace: None,
            name: None,
            code,
            received: std::time::Instant::now(),
            took: std::time::Duration::ZERO,
        }
    }

    #[test]
    fn nearest_rank_percentiles() {
        let ms: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
        let l = latency(&ms);
        assert_eq!(l.count, 100);
        assert!((l.p50_s - 0.050).abs() < 1e-9);
        assert!((l.p99_s - 0.099).abs() < 1e-9);
        assert!((l.max_s - 0.100).abs() < 1e-9);
        let one = latency(&[Duration::from_millis(7)]);
        assert_eq!((one.p50_s, one.p99_s), (0.007, 0.007));
        assert_eq!(latency(&[]).count, 0);
    }

    #[test]
    fn writes_leave_out_reads_leases_and_the_bench() {
        let records = vec![
            rec(
                "attach-detach-controller/0.1",
                "create",
                "volumeattachments",
                None,
                201,
            ),
            rec(
                "attach-detach-controller/0.1",
                "create",
                "volumeattachments",
                None,
                409,
            ),
            rec(
                "csi-attacher/0.1",
                "patch",
                "volumeattachments",
                Some("status"),
                200,
            ),
            rec("csi-node-agent/0.1", "patch", "pods", Some("status"), 200),
            rec("csi-node-agent/0.1", "update", "leases", None, 200),
            rec("csi-node-agent/0.1", "get", "pods", None, 200),
            rec("csi-bench-stack/0.1", "create", "pods", None, 201),
        ];
        let w = writes(&records, 2);
        assert_eq!(w.total, 4);
        assert_eq!(w.failed, 1);
        assert_eq!(w.lease_writes, 1);
        assert_eq!(w.volume_attachments_created, 1, "the 409 created nothing");
        assert!((w.per_pod - 2.0).abs() < 1e-9);
        assert_eq!(w.per_pod_by_component["adc"], 1.0);
        assert_eq!(w.per_pod_by_component["node-agent"], 0.5);
        assert_eq!(w.by_request["attacher patch volumeattachments/status"], 1);
        assert_eq!(w.failed_by_request["adc create volumeattachments 409"], 1);
        assert!(!w.per_pod_by_component.contains_key("csi-bench-stack"));
    }

    #[test]
    fn memory_reads_this_process() {
        let (rss, hwm) = memory();
        assert!(rss > 0.0 && hwm >= rss, "VmRSS {rss} VmHWM {hwm}");
    }
}
