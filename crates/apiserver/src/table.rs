//! Server-side printing: `meta.k8s.io/v1` Tables for `kubectl get`, with the columns the real
//! server prints for each type.

use serde_json::{Value, json};

use crate::http_util::path_str;
use crate::request::Req;
use crate::resources::ResourceDef;

mod workloads;

type Cell = fn(&Value) -> Value;

struct Column {
    name: &'static str,
    kind: &'static str,
    priority: u8,
    cell: Cell,
}

const fn col(name: &'static str, cell: Cell) -> Column {
    Column {
        name,
        kind: "string",
        priority: 0,
        cell,
    }
}

fn or_none(v: String) -> Value {
    if v.is_empty() {
        json!("<none>")
    } else {
        json!(v)
    }
}

fn age(o: &Value) -> Value {
    let created = path_str(o, "metadata.creationTimestamp");
    let Ok(ts) = created.parse::<jiff::Timestamp>() else {
        return json!("<unknown>");
    };
    let secs = (jiff::Timestamp::now().as_second() - ts.as_second()).max(0);
    json!(human_duration(secs))
}

/// Kubernetes' `duration.HumanDuration` for ages: 45s, 5m3s, 3h, 2d5h, 400d.
pub(crate) fn human_duration(secs: i64) -> String {
    let (m, h, d) = (secs / 60, secs / 3600, secs / 86400);
    if secs < 120 {
        format!("{secs}s")
    } else if m < 10 {
        let rem = secs % 60;
        if rem == 0 {
            format!("{m}m")
        } else {
            format!("{m}m{rem}s")
        }
    } else if m < 180 {
        format!("{m}m")
    } else if h < 8 {
        let rem = m % 60;
        if rem == 0 {
            format!("{h}h")
        } else {
            format!("{h}h{rem}m")
        }
    } else if h < 48 {
        format!("{h}h")
    } else if h < 24 * 8 {
        let rem = h % 24;
        if rem == 0 {
            format!("{d}d")
        } else {
            format!("{d}d{rem}h")
        }
    } else if h < 24 * 365 * 2 {
        format!("{d}d")
    } else {
        format!("{}y", d / 365)
    }
}

/// `<ready>/<total>` of a pod's readiness gates (their conditions True), `<none>` without.
fn readiness_gates(o: &Value) -> Value {
    let Some(gates) = o["spec"]["readinessGates"]
        .as_array()
        .filter(|g| !g.is_empty())
    else {
        return json!("<none>");
    };
    let conditions = o["status"]["conditions"].as_array();
    let ready = gates
        .iter()
        .filter(|g| {
            conditions
                .into_iter()
                .flatten()
                .any(|c| c["type"] == g["conditionType"] && c["status"].as_str() == Some("True"))
        })
        .count();
    json!(format!("{ready}/{}", gates.len()))
}

fn join_strings(v: Option<&Value>) -> String {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default()
}

fn access_modes(v: Option<&Value>) -> String {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(|m| match m {
                    "ReadWriteOnce" => "RWO",
                    "ReadOnlyMany" => "ROX",
                    "ReadWriteMany" => "RWX",
                    "ReadWriteOncePod" => "RWOP",
                    other => other,
                })
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default()
}

fn columns(def: &ResourceDef) -> Vec<Column> {
    if let Some(cols) = workloads::columns(def) {
        return cols;
    }
    let name = col("Name", |o| json!(path_str(o, "metadata.name")));
    let age_col = col("Age", age);
    let mut cols = vec![name];
    match (def.group, def.plural) {
        ("", "namespaces") => cols.push(col("Status", |o| json!(path_str(o, "status.phase")))),
        ("", "nodes") => {
            cols.push(col("Status", |o| {
                let ready = o["status"]["conditions"]
                    .as_array()
                    .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
                    .map(|c| c["status"] == "True");
                json!(match ready {
                    Some(true) => "Ready",
                    Some(false) => "NotReady",
                    None => "Unknown",
                })
            }));
            cols.push(col("Roles", |_| json!("<none>")));
        }
        ("", "pods") => {
            cols.push(col("Ready", |o| {
                let total = o["spec"]["containers"].as_array().map_or(0, Vec::len);
                let ready = o["status"]["containerStatuses"]
                    .as_array()
                    .map_or(0, |a| a.iter().filter(|c| c["ready"] == true).count());
                json!(format!("{ready}/{total}"))
            }));
            cols.push(col("Status", |o| {
                if o["metadata"]["deletionTimestamp"].is_string() {
                    return json!("Terminating");
                }
                json!(path_str(o, "status.phase"))
            }));
            cols.push(Column {
                kind: "integer",
                ..col("Restarts", |o| {
                    let n: i64 = o["status"]["containerStatuses"].as_array().map_or(0, |a| {
                        a.iter().filter_map(|c| c["restartCount"].as_i64()).sum()
                    });
                    json!(n)
                })
            });
        }
        ("", "persistentvolumes") => {
            cols.push(col("Capacity", |o| {
                json!(path_str(o, "spec.capacity.storage"))
            }));
            cols.push(col("Access Modes", |o| {
                json!(access_modes(o["spec"].get("accessModes")))
            }));
            cols.push(col("Reclaim Policy", |o| {
                json!(path_str(o, "spec.persistentVolumeReclaimPolicy"))
            }));
            cols.push(col("Status", |o| json!(path_str(o, "status.phase"))));
            cols.push(col("Claim", |o| {
                let ns = path_str(o, "spec.claimRef.namespace");
                let n = path_str(o, "spec.claimRef.name");
                json!(if n.is_empty() {
                    String::new()
                } else {
                    format!("{ns}/{n}")
                })
            }));
            cols.push(col("StorageClass", |o| {
                json!(path_str(o, "spec.storageClassName"))
            }));
            cols.push(col("Reason", |o| json!(path_str(o, "status.reason"))));
        }
        ("", "persistentvolumeclaims") => {
            cols.push(col("Status", |o| json!(path_str(o, "status.phase"))));
            cols.push(col("Volume", |o| json!(path_str(o, "spec.volumeName"))));
            cols.push(col("Capacity", |o| {
                json!(path_str(o, "status.capacity.storage"))
            }));
            cols.push(col("Access Modes", |o| {
                json!(access_modes(o["status"].get("accessModes")))
            }));
            cols.push(col("StorageClass", |o| {
                json!(path_str(o, "spec.storageClassName"))
            }));
        }
        ("", "secrets") => {
            cols.push(col("Type", |o| json!(path_str(o, "type"))));
            cols.push(Column {
                kind: "integer",
                ..col("Data", |o| {
                    json!(o["data"].as_object().map_or(0, |m| m.len()))
                })
            });
        }
        ("", "events") | ("events.k8s.io", "events") => {
            cols.push(col("Type", |o| json!(path_str(o, "type"))));
            cols.push(col("Reason", |o| json!(path_str(o, "reason"))));
            cols.push(col("Object", |o| {
                let r = if o["regarding"].is_object() {
                    &o["regarding"]
                } else {
                    &o["involvedObject"]
                };
                json!(format!(
                    "{}/{}",
                    path_str(r, "kind").to_lowercase(),
                    path_str(r, "name")
                ))
            }));
            cols.push(col("Message", |o| {
                let m = path_str(o, "message");
                json!(if m.is_empty() { path_str(o, "note") } else { m })
            }));
        }
        ("storage.k8s.io", "volumeattachments") => {
            cols.push(col("Attacher", |o| json!(path_str(o, "spec.attacher"))));
            cols.push(col("PV", |o| {
                json!(path_str(o, "spec.source.persistentVolumeName"))
            }));
            cols.push(col("Node", |o| json!(path_str(o, "spec.nodeName"))));
            cols.push(Column {
                kind: "boolean",
                ..col("Attached", |o| json!(o["status"]["attached"] == true))
            });
        }
        ("storage.k8s.io", "csidrivers") => {
            cols.push(Column {
                kind: "boolean",
                ..col("AttachRequired", |o| o["spec"]["attachRequired"].clone())
            });
            cols.push(Column {
                kind: "boolean",
                ..col("PodInfoOnMount", |o| o["spec"]["podInfoOnMount"].clone())
            });
            cols.push(Column {
                kind: "boolean",
                ..col("StorageCapacity", |o| o["spec"]["storageCapacity"].clone())
            });
            cols.push(col("TokenRequests", |o| {
                let audiences: Vec<&str> = o["spec"]["tokenRequests"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|t| t["audience"].as_str())
                    .collect();
                json!(if audiences.is_empty() {
                    "<unset>".to_string()
                } else {
                    audiences.join(",")
                })
            }));
            cols.push(Column {
                kind: "boolean",
                ..col("RequiresRepublish", |o| {
                    o["spec"]["requiresRepublish"].clone()
                })
            });
            cols.push(col("Modes", |o| {
                json!(join_strings(o["spec"].get("volumeLifecycleModes")))
            }));
        }
        ("storage.k8s.io", "csinodes") => {
            cols.push(Column {
                kind: "integer",
                ..col("Drivers", |o| {
                    json!(o["spec"]["drivers"].as_array().map_or(0, Vec::len))
                })
            });
        }
        ("storage.k8s.io", "storageclasses") => {
            cols.push(col("Provisioner", |o| json!(path_str(o, "provisioner"))));
            cols.push(col("ReclaimPolicy", |o| {
                json!(path_str(o, "reclaimPolicy"))
            }));
            cols.push(col("VolumeBindingMode", |o| {
                json!(path_str(o, "volumeBindingMode"))
            }));
            cols.push(Column {
                kind: "boolean",
                ..col("AllowVolumeExpansion", |o| {
                    json!(o["allowVolumeExpansion"] == true)
                })
            });
        }
        ("coordination.k8s.io", "leases") => {
            cols.push(col("Holder", |o| json!(path_str(o, "spec.holderIdentity"))));
        }
        _ => {}
    }
    cols.push(age_col);
    if (def.group, def.plural) == ("", "pods") {
        cols.push(Column {
            priority: 1,
            ..col("IP", |o| or_none(path_str(o, "status.podIP")))
        });
        cols.push(Column {
            priority: 1,
            ..col("Node", |o| or_none(path_str(o, "spec.nodeName")))
        });
        cols.push(Column {
            priority: 1,
            ..col("Nominated Node", |o| {
                or_none(path_str(o, "status.nominatedNodeName"))
            })
        });
        cols.push(Column {
            priority: 1,
            ..col("Readiness Gates", readiness_gates)
        });
    }
    cols
}

/// A Table of `objs`. `with_columns` is false for watch events after the first, which carry
/// rows only, as the real server sends them.
pub(crate) fn build(
    def: &ResourceDef,
    objs: &[Value],
    list_meta: Value,
    req: &Req,
    with_columns: bool,
) -> Value {
    let cols = columns(def);
    let include = req.param("includeObject").unwrap_or("Metadata");
    let defs: Vec<Value> = if with_columns {
        cols.iter()
            .map(|c| {
                let mut d = json!({
                    "name": c.name,
                    "type": c.kind,
                    "format": "",
                    "description": format!("{} of the {}", c.name, def.kind),
                    "priority": c.priority,
                });
                if c.name == "Name" {
                    d["format"] = json!("name");
                }
                d
            })
            .collect()
    } else {
        Vec::new()
    };
    let rows: Vec<Value> = objs
        .iter()
        .map(|o| {
            let cells: Vec<Value> = cols.iter().map(|c| (c.cell)(o)).collect();
            let object = match include {
                "None" => Value::Null,
                "Object" => o.clone(),
                _ => json!({
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": o.get("metadata").cloned().unwrap_or(json!({})),
                }),
            };
            json!({"cells": cells, "object": object})
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_meta,
        "columnDefinitions": defs,
        "rows": rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources;

    #[test]
    fn human_durations() {
        assert_eq!(human_duration(5), "5s");
        assert_eq!(human_duration(150), "2m30s");
        assert_eq!(human_duration(60 * 20), "20m");
        assert_eq!(human_duration(3600 * 5), "5h");
        assert_eq!(human_duration(86400 * 3 + 3600), "3d1h");
        assert_eq!(human_duration(86400 * 30), "30d");
    }

    #[test]
    fn volume_attachment_table() {
        let def =
            resources::get(resources::find("storage.k8s.io", "v1", "volumeattachments").unwrap());
        let va = json!({
            "metadata": {"name": "va1", "creationTimestamp": "2020-01-01T00:00:00Z"},
            "spec": {"attacher": "ebs.csi.aws.com", "nodeName": "n1", "source": {"persistentVolumeName": "pv1"}},
            "status": {"attached": true}
        });
        let req = Req {
            method: http::Method::GET,
            query: Default::default(),
            accept: String::new(),
            content_type: String::new(),
            user_agent: String::new(),
            body: bytes::Bytes::new(),
        };
        let t = build(def, &[va], json!({"resourceVersion": "5"}), &req, true);
        let names: Vec<&str> = t["columnDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            vec!["Name", "Attacher", "PV", "Node", "Attached", "Age"]
        );
        assert_eq!(t["rows"][0]["cells"][0], "va1");
        assert_eq!(t["rows"][0]["cells"][4], true);
        assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
    }
}
