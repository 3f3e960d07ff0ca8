//! Table columns for the deployment kinds (ServiceAccount, ConfigMap, Deployment, DaemonSet,
//! StatefulSet and
//! the RBAC types), as the real server prints them; wide columns have priority 1.

use serde_json::{Value, json};

use super::{Column, age, col, or_none};
use crate::http_util::path_str;
use crate::resources::ResourceDef;

fn int(v: &Value, path: &str) -> Value {
    let mut cur = v;
    for p in path.split('.') {
        cur = &cur[p];
    }
    json!(cur.as_i64().unwrap_or(0))
}

const fn integer(name: &'static str, cell: fn(&Value) -> Value) -> Column {
    Column {
        kind: "integer",
        ..col(name, cell)
    }
}

const fn wide(name: &'static str, cell: fn(&Value) -> Value) -> Column {
    Column {
        priority: 1,
        ..col(name, cell)
    }
}

fn containers_of(o: &Value, field: &str) -> Value {
    let names: Vec<&str> = o["spec"]["template"]["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c[field].as_str())
        .collect();
    json!(names.join(","))
}

/// `metav1.FormatLabelSelector`: `k=v,k in (a,b),!k`, `<none>` when empty.
fn selector(o: &Value) -> Value {
    let sel = &o["spec"]["selector"];
    let mut parts: Vec<String> = sel["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
        .collect();
    for e in sel["matchExpressions"].as_array().into_iter().flatten() {
        let key = e["key"].as_str().unwrap_or("");
        let values: Vec<&str> = e["values"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        parts.push(match e["operator"].as_str().unwrap_or("") {
            "In" => format!("{key} in ({})", values.join(",")),
            "NotIn" => format!("{key} notin ({})", values.join(",")),
            "Exists" => key.to_string(),
            "DoesNotExist" => format!("!{key}"),
            op => format!("{key} {op}"),
        });
    }
    or_none(parts.join(","))
}

fn subjects(o: &Value, kind: &str) -> Value {
    let names: Vec<String> = o["subjects"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["kind"] == kind)
        .map(|s| {
            let name = s["name"].as_str().unwrap_or("");
            match s["namespace"].as_str() {
                Some(ns) if kind == "ServiceAccount" => format!("{ns}/{name}"),
                _ => name.to_string(),
            }
        })
        .collect();
    json!(names.join(", "))
}

/// The full column list for the kinds this module knows, `None` for the others.
pub(super) fn columns(def: &ResourceDef) -> Option<Vec<Column>> {
    let name = col("Name", |o| json!(path_str(o, "metadata.name")));
    let cols = match (def.group, def.plural) {
        ("", "serviceaccounts") => vec![
            name,
            integer("Secrets", |o| {
                json!(o["secrets"].as_array().map_or(0, Vec::len))
            }),
            col("Age", age),
        ],
        ("", "configmaps") => vec![
            name,
            integer("Data", |o| {
                let n = |k: &str| o[k].as_object().map_or(0, |m| m.len());
                json!(n("data") + n("binaryData"))
            }),
            col("Age", age),
        ],
        ("apps", "deployments") => vec![
            name,
            col("Ready", |o| {
                json!(format!(
                    "{}/{}",
                    int(o, "status.readyReplicas"),
                    int(o, "spec.replicas")
                ))
            }),
            integer("Up-to-date", |o| int(o, "status.updatedReplicas")),
            integer("Available", |o| int(o, "status.availableReplicas")),
            col("Age", age),
            wide("Containers", |o| containers_of(o, "name")),
            wide("Images", |o| containers_of(o, "image")),
            wide("Selector", selector),
        ],
        ("apps", "daemonsets") => vec![
            name,
            integer("Desired", |o| int(o, "status.desiredNumberScheduled")),
            integer("Current", |o| int(o, "status.currentNumberScheduled")),
            integer("Ready", |o| int(o, "status.numberReady")),
            integer("Up-to-date", |o| int(o, "status.updatedNumberScheduled")),
            integer("Available", |o| int(o, "status.numberAvailable")),
            col("Node Selector", |o| {
                let parts: Vec<String> = o["spec"]["template"]["spec"]["nodeSelector"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                    .collect();
                or_none(parts.join(","))
            }),
            col("Age", age),
            wide("Containers", |o| containers_of(o, "name")),
            wide("Images", |o| containers_of(o, "image")),
            wide("Selector", selector),
        ],
        ("apps", "statefulsets") => vec![
            name,
            col("Ready", |o| {
                json!(format!(
                    "{}/{}",
                    int(o, "status.readyReplicas"),
                    int(o, "spec.replicas")
                ))
            }),
            col("Age", age),
            wide("Containers", |o| containers_of(o, "name")),
            wide("Images", |o| containers_of(o, "image")),
        ],
        ("rbac.authorization.k8s.io", "roles" | "clusterroles") => vec![
            name,
            Column {
                kind: "date",
                ..col("Created At", |o| {
                    json!(path_str(o, "metadata.creationTimestamp"))
                })
            },
        ],
        ("rbac.authorization.k8s.io", "rolebindings" | "clusterrolebindings") => vec![
            name,
            col("Role", |o| {
                json!(format!(
                    "{}/{}",
                    path_str(o, "roleRef.kind"),
                    path_str(o, "roleRef.name")
                ))
            }),
            col("Age", age),
            wide("Users", |o| subjects(o, "User")),
            wide("Groups", |o| subjects(o, "Group")),
            wide("ServiceAccounts", |o| subjects(o, "ServiceAccount")),
        ],
        _ => return None,
    };
    Some(cols)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources;

    fn cells(group: &str, plural: &str, obj: &Value) -> Vec<Value> {
        let def = resources::get(resources::find(group, "v1", plural).unwrap());
        columns(def)
            .unwrap()
            .iter()
            .map(|c| (c.cell)(obj))
            .collect()
    }

    #[test]
    fn deployment_and_binding_rows() {
        let d = json!({"metadata": {"name": "csi-attacher"},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "csi-attacher"},
                "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["a", "b"]}]},
                "template": {"spec": {"containers": [{"name": "a", "image": "x:1"}, {"name": "b", "image": "y:2"}]}}},
            "status": {"readyReplicas": 1}});
        let row = cells("apps", "deployments", &d);
        assert_eq!(row[1], "1/2");
        assert_eq!(row[5], "a,b");
        assert_eq!(row[6], "x:1,y:2");
        assert_eq!(row[7], "app=csi-attacher,tier notin (a,b)");
        let b = json!({"metadata": {"name": "b"}, "roleRef": {"kind": "ClusterRole", "name": "r"},
            "subjects": [{"kind": "ServiceAccount", "name": "sa", "namespace": "kube-system"}]});
        let row = cells("rbac.authorization.k8s.io", "clusterrolebindings", &b);
        assert_eq!(row[1], "ClusterRole/r");
        assert_eq!(row[5], "kube-system/sa");
        let sts = json!({"metadata": {"name": "csi-hostpathplugin"},
            "spec": {"replicas": 1, "template": {"spec": {"containers": [{"name": "a", "image": "x:1"}]}}}});
        let row = cells("apps", "statefulsets", &sts);
        assert_eq!(row[1], "0/1");
        assert_eq!(row[3], "a");
        let pods = resources::get(resources::find("", "v1", "pods").unwrap());
        assert!(columns(pods).is_none(), "pods keep the columns in table.rs");
    }
}
