//! The invariants, each read from a source the components do not control: ec2-sim's
//! attachment record, the kernel's mount table, the API server's objects and ec2-sim's backing
//! files. A check that races with a legitimate change (a pod deleted between two reads)
//! re-reads before it calls a violation.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::{Api, Client};

/// The node agent's annotation with each volume's host path (as the kubelet's
/// `pods/<uid>/volumes/...` path, which is what a container would see mounted).
const VOLUME_PATHS: &str = "csi.rs/volume-paths";

/// One broken invariant.
#[derive(Debug, Clone)]
pub struct Violation {
    /// Since the schedule started.
    pub at: Duration,
    pub invariant: &'static str,
    pub detail: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "[{:>7.1}s] {}: {}",
            self.at.as_secs_f64(),
            self.invariant,
            self.detail
        )
    }
}

pub(crate) const DETACHED_WHILE_MOUNTED: &str = "no volume detached while its device is mounted";
pub(crate) const DOUBLE_ATTACH: &str = "no volume attached to two instances";
pub(crate) const READY_WITHOUT_VOLUME: &str = "no pod Ready without its volume mounted";
pub(crate) const BOUND_VOLUME_GONE: &str = "no Bound claim's volume deleted";
pub(crate) const DATA: &str = "every file written is read back";
pub(crate) const STRAY_MOUNT: &str = "no mount without a pod that wants it (settled)";
pub(crate) const LEAK: &str = "nothing left after everything is deleted";
pub(crate) const SETTLE: &str = "the cluster settles once the faults stop";

/// Counts checks and collects violations.
pub(crate) struct Checker {
    start: Instant,
    ec2_volumes: PathBuf,
    /// ec2-sim record positions already looked at.
    seen_seq: Option<u64>,
    pub(crate) checks: u64,
    pub(crate) violations: Vec<Violation>,
    /// A probe (a check repeated until it holds): collects without printing.
    quiet: bool,
}

impl Checker {
    pub(crate) fn new(start: Instant, data_dir: &Path) -> Self {
        Self {
            start,
            ec2_volumes: data_dir.join("ec2").join("volumes"),
            seen_seq: None,
            checks: 0,
            violations: Vec::new(),
            quiet: false,
        }
    }

    /// A checker whose violations are only collected (the caller reports the last ones).
    pub(crate) fn probe(start: Instant, data_dir: &Path) -> Self {
        Self {
            quiet: true,
            ..Self::new(start, data_dir)
        }
    }

    pub(crate) fn violate(&mut self, invariant: &'static str, detail: String) {
        let v = Violation {
            at: self.start.elapsed(),
            invariant,
            detail,
        };
        if !self.quiet {
            tracing::error!(invariant, detail = %v.detail, "chaos: invariant violated");
            eprintln!("VIOLATION {v}");
        }
        self.violations.push(v);
    }

    /// ec2-sim's record since the last look: no detach finished under a mounted device, no
    /// second holder of a volume that is not Multi-Attach.
    pub(crate) fn ec2_history(&mut self, sim: &ec2_sim::Simulator) {
        let h = sim.attachment_history();
        let after = self.seen_seq;
        let new = |seq: u64| after.is_none_or(|s| seq > s);
        for e in h.events.iter().filter(|e| new(e.seq)) {
            self.checks += 2;
            if e.device_in_use {
                let detail = format!(
                    "{} detached from {} while its device was mounted (record #{})",
                    e.volume_id, e.instance_id, e.seq
                );
                self.violate(DETACHED_WHILE_MOUNTED, detail);
            }
        }
        for m in h.double_attachments().into_iter().filter(|m| new(m.seq)) {
            let detail = format!(
                "{} held by {} at once (record #{})",
                m.volume_id,
                m.instances.join(" and "),
                m.seq
            );
            self.violate(DOUBLE_ATTACH, detail);
        }
        if let Some(last) = h.events.last() {
            self.seen_seq = Some(last.seq);
        }
    }

    /// Every pod that is Ready and not being deleted has each volume's host path mounted. A
    /// pod that changed between the list and the mount table is read again first.
    pub(crate) async fn ready_pods_mounted(&mut self, client: &Client, pods: &[Pod]) {
        let mounts = mount_points();
        let api: Api<Pod> = Api::default_namespaced(client.clone());
        for pod in pods.iter().filter(|p| is_ready(p)) {
            for (volume, path) in volume_paths(pod) {
                self.checks += 1;
                if mounts.contains(&path) {
                    continue;
                }
                let name = pod.metadata.name.clone().unwrap_or_default();
                // Still the same pod, still Ready, not being deleted: then it is Ready without
                // its volume (the agent unmounts only after a deletion started).
                let Ok(Some(now)) = api.get_opt(&name).await else {
                    continue;
                };
                if now.metadata.uid == pod.metadata.uid && is_ready(&now) {
                    let detail = format!(
                        "pod {name} on {} is Ready but volume {volume} ({}) is not mounted",
                        node_of(&now),
                        path.display()
                    );
                    self.violate(READY_WITHOUT_VOLUME, detail);
                }
            }
        }
    }

    /// Every Bound claim that is not being deleted has its PV, and an EBS PV its volume's
    /// backing file in ec2-sim (the data itself).
    pub(crate) async fn bound_claims_have_volumes(
        &mut self,
        client: &Client,
        claims: &[PersistentVolumeClaim],
    ) {
        let pvs: Api<PersistentVolume> = Api::all(client.clone());
        let claims_api: Api<PersistentVolumeClaim> = Api::default_namespaced(client.clone());
        for c in claims.iter().filter(|c| is_bound(c)) {
            let Some(pv_name) = c.spec.as_ref().and_then(|s| s.volume_name.clone()) else {
                continue;
            };
            self.checks += 1;
            let gone = match pvs.get_opt(&pv_name).await {
                Ok(None) => Some(format!("PV {pv_name} is gone")),
                Ok(Some(pv)) => ebs_handle(&pv).and_then(|h| {
                    self.checks += 1;
                    let file = self.ec2_volumes.join(format!("{h}.img"));
                    (!file.exists()).then(|| {
                        format!("PV {pv_name}'s EC2 volume {h} is gone ({})", file.display())
                    })
                }),
                Err(_) => None,
            };
            let Some(gone) = gone else { continue };
            let name = c.metadata.name.clone().unwrap_or_default();
            if let Ok(Some(now)) = claims_api.get_opt(&name).await
                && now.metadata.uid == c.metadata.uid
                && is_bound(&now)
            {
                self.violate(BOUND_VOLUME_GONE, format!("claim {name} is Bound: {gone}"));
            }
        }
    }

    /// Settled: every CSI mount of every node belongs to a pod that is on that node and not
    /// being deleted: a pod's publish mount by its UID, a staging mount by the volume handle
    /// in the `vol_data.json` beside it.
    pub(crate) fn no_stray_mounts(
        &mut self,
        data_dir: &Path,
        pods: &[Pod],
        pvs: &[PersistentVolume],
    ) {
        let handles: BTreeMap<String, String> = pvs
            .iter()
            .filter_map(|pv| {
                let csi = pv.spec.as_ref()?.csi.as_ref()?;
                Some((pv.metadata.name.clone()?, csi.volume_handle.clone()))
            })
            .collect();
        // node → pod UIDs and the handles their volumes use.
        let mut wanted: BTreeMap<String, (BTreeSet<String>, BTreeSet<String>)> = BTreeMap::new();
        for p in pods
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
        {
            let entry = wanted.entry(node_of(p)).or_default();
            entry.0.extend(p.metadata.uid.clone());
            for claim in claim_names(p) {
                if let Some(h) = claim_volume(&claim, pvs).and_then(|v| handles.get(&v)) {
                    entry.1.insert(h.clone());
                }
            }
        }
        let nodes = data_dir.join("nodes");
        for m in mount_points() {
            let Ok(rel) = m.strip_prefix(&nodes) else {
                continue;
            };
            let parts: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            let strs: Vec<&str> = parts.iter().map(String::as_str).collect();
            match strs.as_slice() {
                [
                    node,
                    "kubelet",
                    "pods",
                    uid,
                    "volumes",
                    "kubernetes.io~csi",
                    spec,
                    "mount",
                ] => {
                    self.checks += 1;
                    let ok = wanted.get(*node).is_some_and(|w| w.0.contains(*uid));
                    if !ok {
                        let detail = format!(
                            "{node}: {spec} still published for pod {uid}, which is gone ({})",
                            m.display()
                        );
                        self.violate(STRAY_MOUNT, detail);
                    }
                }
                [
                    node,
                    "kubelet",
                    "plugins",
                    "kubernetes.io",
                    "csi",
                    driver,
                    _,
                    "globalmount",
                ] => {
                    self.checks += 1;
                    let handle = staged_handle(&m);
                    let ok = handle
                        .as_ref()
                        .is_some_and(|h| wanted.get(*node).is_some_and(|w| w.1.contains(h)));
                    if !ok {
                        let detail = format!(
                            "{node}: {driver} volume {} still staged with no pod on the node using it ({})",
                            handle.as_deref().unwrap_or("(no vol_data.json)"),
                            m.display()
                        );
                        self.violate(STRAY_MOUNT, detail);
                    }
                }
                _ => {}
            }
        }
    }
}

/// The PV whose `claimRef` names `default/<claim>`.
fn claim_volume(claim: &str, pvs: &[PersistentVolume]) -> Option<String> {
    pvs.iter().find_map(|pv| {
        let r = pv.spec.as_ref()?.claim_ref.as_ref()?;
        (r.name.as_deref() == Some(claim) && r.namespace.as_deref() == Some("default"))
            .then(|| pv.metadata.name.clone())
            .flatten()
    })
}

fn claim_names(p: &Pod) -> Vec<String> {
    p.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| {
            v.persistent_volume_claim
                .as_ref()
                .map(|c| c.claim_name.clone())
        })
        .collect()
}

/// The handle in the `vol_data.json` next to a `globalmount`.
fn staged_handle(globalmount: &Path) -> Option<String> {
    let file = globalmount.parent()?.join("vol_data.json");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(file).ok()?).ok()?;
    v.get("volumeHandle")?.as_str().map(str::to_string)
}

/// The EBS volume ID of an `ebs.csi.aws.com` PV.
pub(crate) fn ebs_handle(pv: &PersistentVolume) -> Option<String> {
    let csi = pv.spec.as_ref()?.csi.as_ref()?;
    (csi.driver == crate::EBS_DRIVER).then(|| csi.volume_handle.clone())
}

pub(crate) fn is_bound(c: &PersistentVolumeClaim) -> bool {
    c.metadata.deletion_timestamp.is_none()
        && c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
}

/// Ready and not being deleted.
pub(crate) fn is_ready(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

pub(crate) fn node_of(p: &Pod) -> String {
    p.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default()
}

/// The host path of each volume of a pod, from the node agent's annotation.
pub(crate) fn volume_paths(p: &Pod) -> Vec<(String, PathBuf)> {
    let Some(text) = p
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(VOLUME_PATHS))
    else {
        return Vec::new();
    };
    let Ok(map) = serde_json::from_str::<BTreeMap<String, String>>(text) else {
        return Vec::new();
    };
    map.into_iter()
        .map(|(k, v)| (k, PathBuf::from(v)))
        .collect()
}

/// Every mount point on the host, from `/proc/self/mountinfo` (mount-utils' parser, which
/// undoes the octal escapes); empty if it cannot be read.
pub(crate) fn mount_points() -> BTreeSet<PathBuf> {
    let bytes = std::fs::read("/proc/self/mountinfo").unwrap_or_default();
    mount_utils::findmnt::parse(&bytes)
        .unwrap_or_default()
        .into_iter()
        .map(|e| e.mount_point)
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn readiness_and_binding_need_no_deletion() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .unwrap();
        assert!(is_ready(&pod));
        let mut deleting = pod.clone();
        deleting.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now()),
        );
        assert!(!is_ready(&deleting));
        let claim: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "c"}, "status": {"phase": "Bound"}
        }))
        .unwrap();
        assert!(is_bound(&claim));
    }
}
