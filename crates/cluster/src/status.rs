//! `csi-cluster status`: what the cluster on a data dir is doing, read from its API server
//! through the kubeconfig in the data dir: nodes (Ready, registered drivers), per node the
//! volumes attached and in use and the pods, VolumeAttachments, claims and volumes by phase,
//! and stuck operations (pods not Ready for more than 30 s, with the last Event saying why).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use kube::api::ListParams;
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::Error;

/// A pod that is not Ready after this long is reported as stuck.
const STUCK_AFTER: Duration = Duration::from_secs(30);

/// The Event reasons that say why a pod waits.
const WAIT_REASONS: &[&str] = &["FailedMount", "FailedAttachVolume", "FailedScheduling"];

/// Reads the cluster on `data_dir` and renders the report (`json`: one JSON document, else
/// text for people).
pub async fn status(data_dir: &Path, json: bool) -> Result<String, Error> {
    let kubeconfig = crate::kubeconfig::kubeconfig_path(data_dir);
    if !kubeconfig.exists() {
        return Err(Error::NotRunning {
            data_dir: data_dir.to_path_buf(),
            reason: format!("no kubeconfig at {}", kubeconfig.display()),
        });
    }
    let client = crate::kubeconfig::client(&kubeconfig, "csi-cluster-status").await?;
    let report = collect(&client).await?;
    Ok(if json {
        serde_json::to_string_pretty(&report).unwrap_or_default()
    } else {
        render(&report)
    })
}

async fn list<K>(client: &Client, what: &str) -> Result<Vec<K>, Error>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    Api::<K>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .map_err(|e| Error::kube(format!("listing {what} (is the cluster up?)"), e))
}

fn name(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    meta.name.clone().unwrap_or_default()
}

fn condition_true(pod: &Pod, kind: &str) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == kind && c.status == "True"))
}

/// Everything the report shows, as JSON.
async fn collect(client: &Client) -> Result<Value, Error> {
    let nodes: Vec<Node> = list(client, "nodes").await?;
    let csinodes: Vec<CSINode> = list(client, "CSINodes").await?;
    let pods: Vec<Pod> = list(client, "pods").await?;
    let vas: Vec<VolumeAttachment> = list(client, "VolumeAttachments").await?;
    let pvcs: Vec<PersistentVolumeClaim> = list(client, "PersistentVolumeClaims").await?;
    let pvs: Vec<PersistentVolume> = list(client, "PersistentVolumes").await?;
    let events: Vec<Event> = list(client, "Events").await?;

    let node_reports: Vec<Value> = nodes
        .iter()
        .map(|n| {
            let node_name = name(&n.metadata);
            let status = n.status.clone().unwrap_or_default();
            let ready = status
                .conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            let drivers: Vec<String> = csinodes
                .iter()
                .filter(|c| c.metadata.name.as_deref() == Some(node_name.as_str()))
                .flat_map(|c| c.spec.drivers.iter().map(|d| d.name.clone()))
                .collect();
            let attached: Vec<String> = status
                .volumes_attached
                .iter()
                .flatten()
                .map(|a| a.name.clone())
                .collect();
            let in_use = status.volumes_in_use.clone().unwrap_or_default();
            let node_pods: Vec<Value> = pods
                .iter()
                .filter(|p| {
                    p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node_name.as_str())
                })
                .map(pod_summary)
                .collect();
            json!({
                "name": node_name,
                "ready": ready,
                "drivers": drivers,
                "volumesAttached": attached,
                "volumesInUse": in_use,
                "pods": node_pods,
            })
        })
        .collect();
    let unscheduled: Vec<Value> = pods
        .iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none())
        .map(pod_summary)
        .collect();
    let attachments: Vec<Value> = vas
        .iter()
        .map(|va| {
            let status = va.status.clone().unwrap_or_default();
            json!({
                "name": name(&va.metadata),
                "attacher": va.spec.attacher,
                "pv": va.spec.source.persistent_volume_name,
                "node": va.spec.node_name,
                "attached": status.attached,
                "error": status.attach_error.and_then(|e| e.message)
                    .or_else(|| status.detach_error.and_then(|e| e.message)),
            })
        })
        .collect();
    let phase_counts = |phases: Vec<String>| -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        for p in phases {
            *counts.entry(p).or_insert(0) += 1;
        }
        counts
    };
    let pvc_phases = phase_counts(
        pvcs.iter()
            .map(|c| {
                c.status
                    .as_ref()
                    .and_then(|s| s.phase.clone())
                    .unwrap_or_default()
            })
            .collect(),
    );
    let pv_phases = phase_counts(
        pvs.iter()
            .map(|v| {
                v.status
                    .as_ref()
                    .and_then(|s| s.phase.clone())
                    .unwrap_or_default()
            })
            .collect(),
    );
    let now = jiff::Timestamp::now();
    let stuck: Vec<Value> = pods
        .iter()
        .filter(|p| !condition_true(p, "Ready") && p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            p.metadata.creation_timestamp.as_ref().is_some_and(|t| {
                let age = now.as_second().saturating_sub(t.0.as_second());
                u64::try_from(age).is_ok_and(|age| age > STUCK_AFTER.as_secs())
            })
        })
        .map(|p| {
            let pod_name = name(&p.metadata);
            let ns = p.metadata.namespace.clone().unwrap_or_default();
            let last = events
                .iter()
                .filter(|e| {
                    e.involved_object.name.as_deref() == Some(pod_name.as_str())
                        && e.involved_object.namespace.as_deref() == Some(ns.as_str())
                        && e.reason
                            .as_deref()
                            .is_some_and(|r| WAIT_REASONS.contains(&r))
                })
                .max_by_key(|e| {
                    e.last_timestamp
                        .as_ref()
                        .map(|t| t.0)
                        .or_else(|| e.event_time.as_ref().map(|t| t.0))
                });
            json!({
                "pod": format!("{ns}/{pod_name}"),
                "node": p.spec.as_ref().and_then(|s| s.node_name.clone()),
                "reason": last.and_then(|e| e.reason.clone()),
                "message": last.and_then(|e| e.message.clone()),
            })
        })
        .collect();
    Ok(json!({
        "nodes": node_reports,
        "unscheduledPods": unscheduled,
        "volumeAttachments": attachments,
        "persistentVolumeClaims": pvc_phases,
        "persistentVolumes": pv_phases,
        "stuck": stuck,
    }))
}

fn pod_summary(p: &Pod) -> Value {
    json!({
        "name": format!(
            "{}/{}",
            p.metadata.namespace.clone().unwrap_or_default(),
            name(&p.metadata)
        ),
        "phase": p.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default(),
        "ready": condition_true(p, "Ready"),
        "terminating": p.metadata.deletion_timestamp.is_some(),
    })
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn list_or_none(items: &[String]) -> String {
    if items.is_empty() {
        "none".into()
    } else {
        items.join(", ")
    }
}

/// The text form.
fn render(report: &Value) -> String {
    let mut out = String::new();
    let mut line = |s: String| {
        out.push_str(&s);
        out.push('\n');
    };
    let empty = Vec::new();
    let nodes = report["nodes"].as_array().unwrap_or(&empty);
    line(format!("Nodes ({}):", nodes.len()));
    for n in nodes {
        let ready = if n["ready"].as_bool() == Some(true) {
            "Ready"
        } else {
            "NotReady"
        };
        line(format!(
            "  {} {ready}  drivers: {}",
            n["name"].as_str().unwrap_or_default(),
            list_or_none(&strings(&n["drivers"]))
        ));
        line(format!(
            "    volumes attached: {}",
            list_or_none(&strings(&n["volumesAttached"]))
        ));
        line(format!(
            "    volumes in use:   {}",
            list_or_none(&strings(&n["volumesInUse"]))
        ));
        for p in n["pods"].as_array().unwrap_or(&empty) {
            line(format!("    pod {}", pod_line(p)));
        }
    }
    let unscheduled = report["unscheduledPods"].as_array().unwrap_or(&empty);
    if !unscheduled.is_empty() {
        line(format!("Unscheduled pods ({}):", unscheduled.len()));
        for p in unscheduled {
            line(format!("  {}", pod_line(p)));
        }
    }
    let vas = report["volumeAttachments"].as_array().unwrap_or(&empty);
    line(format!("VolumeAttachments ({}):", vas.len()));
    for va in vas {
        line(format!(
            "  {} {} pv={} node={} attached={}{}",
            va["name"].as_str().unwrap_or_default(),
            va["attacher"].as_str().unwrap_or_default(),
            va["pv"].as_str().unwrap_or("-"),
            va["node"].as_str().unwrap_or_default(),
            va["attached"].as_bool().unwrap_or(false),
            va["error"]
                .as_str()
                .map(|e| format!(" error: {e}"))
                .unwrap_or_default()
        ));
    }
    for (key, title) in [
        ("persistentVolumeClaims", "PersistentVolumeClaims"),
        ("persistentVolumes", "PersistentVolumes"),
    ] {
        let counts: Vec<String> = report[key]
            .as_object()
            .map(|m| m.iter().map(|(phase, n)| format!("{phase} {n}")).collect())
            .unwrap_or_default();
        line(format!("{title}: {}", list_or_none(&counts)));
    }
    let stuck = report["stuck"].as_array().unwrap_or(&empty);
    line(format!("Stuck (not Ready after 30 s): {}", stuck.len()));
    for s in stuck {
        line(format!(
            "  {} on {}: {}",
            s["pod"].as_str().unwrap_or_default(),
            s["node"].as_str().unwrap_or("no node"),
            match (s["reason"].as_str(), s["message"].as_str()) {
                (Some(r), Some(m)) => format!("{r}: {m}"),
                _ => "no FailedMount/FailedAttachVolume/FailedScheduling Event".into(),
            }
        ));
    }
    out
}

fn pod_line(p: &Value) -> String {
    format!(
        "{} {}{}{}",
        p["name"].as_str().unwrap_or_default(),
        p["phase"].as_str().unwrap_or_default(),
        if p["ready"].as_bool() == Some(true) {
            " Ready"
        } else {
            ""
        },
        if p["terminating"].as_bool() == Some(true) {
            " (terminating)"
        } else {
            ""
        }
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn the_text_report_names_nodes_volumes_and_stuck_pods() {
        let report = json!({
            "nodes": [{"name": "node-0", "ready": true, "drivers": ["ebs.csi.aws.com"],
                       "volumesAttached": ["kubernetes.io/csi/ebs.csi.aws.com^vol-1"],
                       "volumesInUse": [], "pods": [{"name": "default/p", "phase": "Running",
                       "ready": true, "terminating": false}]}],
            "unscheduledPods": [],
            "volumeAttachments": [{"name": "csi-1", "attacher": "ebs.csi.aws.com", "pv": "pv-1",
                                   "node": "node-0", "attached": true, "error": null}],
            "persistentVolumeClaims": {"Bound": 1},
            "persistentVolumes": {"Bound": 1},
            "stuck": [{"pod": "default/q", "node": "node-0", "reason": "FailedMount",
                       "message": "waiting for attach"}],
        });
        let text = render(&report);
        assert!(
            text.contains("node-0 Ready  drivers: ebs.csi.aws.com"),
            "{text}"
        );
        assert!(
            text.contains("kubernetes.io/csi/ebs.csi.aws.com^vol-1"),
            "{text}"
        );
        assert!(text.contains("pod default/p Running Ready"), "{text}");
        assert!(text.contains("csi-1 ebs.csi.aws.com pv=pv-1 node=node-0 attached=true"));
        assert!(text.contains("PersistentVolumeClaims: Bound 1"), "{text}");
        assert!(text.contains("default/q on node-0: FailedMount: waiting for attach"));
    }
}
