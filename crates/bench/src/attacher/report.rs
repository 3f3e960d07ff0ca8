//! What a run measured, and the table it prints.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use serde::Serialize;

use crate::harness::writes::Writes;

/// One timed phase.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Phase {
    /// From the start of the phase until the watch saw the last object reach its goal.
    pub seconds: f64,
    /// The attacher's API writes while the phase ran.
    pub writes: Writes,
}

/// CSI calls the attacher made, when the run used the built-in csi-mock.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CsiCalls {
    pub publish: u64,
    pub publish_failed: u64,
    pub unpublish: u64,
    pub unpublish_failed: u64,
    pub list_volumes: u64,
    /// Volumes the mock still had published after the detach phase (should be 0).
    pub left_published: u64,
}

/// Everything a run measured.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    pub attacher_bin: String,
    pub attacher_args: Vec<String>,
    /// User-Agents of the writes not made by the benchmark.
    pub attacher_user_agents: BTreeSet<String>,
    pub driver: String,
    pub csi_address: String,
    pub builtin_mock: bool,
    pub count: usize,
    pub nodes: usize,
    /// Creating the Nodes, CSINodes, PVs and VolumeAttachments (before the attacher starts).
    pub setup_seconds: f64,
    /// From spawning the attacher until the first VolumeAttachment is attached (start-up:
    /// process start, CSI connection, informer sync, first publish).
    pub first_attached_seconds: f64,
    /// From spawning the attacher until every VolumeAttachment has `status.attached=true`.
    pub attach: Phase,
    /// From the first VolumeAttachment delete until all are gone (finalizers removed).
    pub detach: Phase,
    /// From the first PV delete until all are gone (the attacher's PV finalizer removed).
    pub pv_delete: Phase,
    /// Writes after the last phase, until the attacher was stopped.
    pub after: Writes,
    /// All of the attacher's writes, by request.
    pub attacher_writes: Writes,
    /// the benchmark's own writes as it counted them, and as the API server saw them.
    pub own_writes: u64,
    pub own_writes_seen: u64,
    /// Attach-phase writes to VolumeAttachments (and their status) per VolumeAttachment.
    /// Floor: 2 (finalizer + node annotation, then status).
    pub va_writes_per_attach: f64,
    /// Attach-phase writes to PersistentVolumes per PV. Floor: 1 (the finalizer).
    pub pv_writes_per_attach: f64,
    /// All attach-phase writes (any resource) per VolumeAttachment. Floor: 3.
    pub writes_per_attach: f64,
    /// Detach-phase writes per VolumeAttachment. Floor: 1 (finalizer removal).
    pub writes_per_detach: f64,
    /// PV-delete-phase writes per PV. Floor: 1 (finalizer removal).
    pub writes_per_pv_delete: f64,
    /// Peak resident set size (VmHWM) of the attacher process.
    pub peak_rss_bytes: Option<u64>,
    /// User + system CPU time of the attacher process.
    pub cpu_seconds: Option<f64>,
    pub csi_calls: Option<CsiCalls>,
    /// Where the attacher's output went (removed after the run unless --attacher-log was set).
    pub attacher_log: String,
}

pub(crate) fn per(n: u64, count: usize) -> f64 {
    if count == 0 {
        0.0
    } else {
        n as f64 / count as f64
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

impl Report {
    /// The human-readable table.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let args = if self.attacher_args.is_empty() {
            String::new()
        } else {
            format!(" {}", self.attacher_args.join(" "))
        };
        let _ = writeln!(out, "attacher: {}{args}", self.attacher_bin);
        let _ = writeln!(
            out,
            "driver:   {} at {}{}",
            self.driver,
            self.csi_address,
            if self.builtin_mock {
                " (built-in csi-mock)"
            } else {
                ""
            }
        );
        let _ = writeln!(
            out,
            "load:     {} PVs + VolumeAttachments on {} nodes (setup {:.2} s, {} writes by the benchmark)",
            self.count, self.nodes, self.setup_seconds, self.own_writes
        );
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "{:<10} {:>10} {:>10} {:>12} {:>8}",
            "phase", "seconds", "writes", "per object", "failed"
        );
        for (name, phase) in [
            ("attach", &self.attach),
            ("detach", &self.detach),
            ("pv delete", &self.pv_delete),
        ] {
            let _ = writeln!(
                out,
                "{:<10} {:>10.2} {:>10} {:>12.2} {:>8}",
                name,
                phase.seconds,
                phase.writes.total,
                per(phase.writes.total, self.count),
                phase.writes.failed
            );
        }
        if self.after.total > 0 {
            let _ = writeln!(
                out,
                "{:<10} {:>10} {:>10} {:>12} {:>8}",
                "after", "", self.after.total, "", self.after.failed
            );
        }
        let _ = writeln!(
            out,
            "(the attach phase starts when the attacher is spawned; first attach after {:.2} s)",
            self.first_attached_seconds
        );
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "VolumeAttachment writes per attach  {:>8.2}   (floor 2)",
            self.va_writes_per_attach
        );
        let _ = writeln!(
            out,
            "PV writes per attach                {:>8.2}   (floor 1)",
            self.pv_writes_per_attach
        );
        let _ = writeln!(
            out,
            "writes per detach                   {:>8.2}   (floor 1)",
            self.writes_per_detach
        );
        let _ = writeln!(
            out,
            "writes per PV delete                {:>8.2}   (floor 1)",
            self.writes_per_pv_delete
        );
        let rss = self.peak_rss_bytes.map_or_else(|| "n/a".to_owned(), mib);
        let _ = writeln!(out, "peak RSS (VmHWM)                    {rss:>8}");
        let cpu = self
            .cpu_seconds
            .map_or_else(|| "n/a".to_owned(), |s| format!("{s:.2} s"));
        let _ = writeln!(out, "CPU time (user + system)            {cpu:>8}");
        if let Some(c) = &self.csi_calls {
            let _ = writeln!(
                out,
                "CSI calls: {} publish ({} failed), {} unpublish ({} failed), {} ListVolumes; {} left published",
                c.publish,
                c.publish_failed,
                c.unpublish,
                c.unpublish_failed,
                c.list_volumes,
                c.left_published
            );
        }
        let _ = writeln!(out);
        let _ = writeln!(out, "attacher writes by request (whole run):");
        for (key, n) in &self.attacher_writes.by_request {
            let _ = writeln!(out, "  {key:<44} {n:>8}");
        }
        if self.own_writes != self.own_writes_seen {
            let _ = writeln!(
                out,
                "warning: the benchmark counted {} own writes but the API server saw {}",
                self.own_writes, self.own_writes_seen
            );
        }
        let agents: Vec<&str> = self
            .attacher_user_agents
            .iter()
            .map(|a| if a.is_empty() { "(none)" } else { a.as_str() })
            .collect();
        let _ = writeln!(out, "attacher user agents: {}", agents.join(", "));
        out
    }
}

/// Writes by request, summed over phases.
pub(crate) fn sum<'a>(parts: impl IntoIterator<Item = &'a Writes>) -> Writes {
    let mut total = Writes::default();
    for w in parts {
        total.merge(w);
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn table_shows_phases_floors_and_requests() {
        let writes = Writes {
            total: 30,
            failed: 1,
            by_request: BTreeMap::from([("patch volumeattachments/status".to_owned(), 10)]),
        };
        let report = Report {
            attacher_bin: "/bin/csi-attacher".into(),
            attacher_args: vec!["--kube-api-qps=5".into()],
            count: 10,
            nodes: 2,
            attach: Phase {
                seconds: 1.5,
                writes: writes.clone(),
            },
            attacher_writes: writes,
            peak_rss_bytes: Some(10 * 1024 * 1024),
            va_writes_per_attach: 2.0,
            own_writes: 4,
            own_writes_seen: 3,
            ..Report::default()
        };
        let t = report.table();
        assert!(t.contains("/bin/csi-attacher --kube-api-qps=5"), "{t}");
        assert!(
            t.contains("attach           1.50         30         3.00        1"),
            "{t}"
        );
        assert!(t.contains("10.0 MiB"), "{t}");
        assert!(t.contains("patch volumeattachments/status"), "{t}");
        assert!(t.contains("warning: the benchmark counted 4"), "{t}");
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["attach"]["writes"]["total"], 30);
        assert_eq!(json["peak_rss_bytes"], 10 * 1024 * 1024);
    }
}
