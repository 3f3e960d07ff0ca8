//! Mutating admission that kube-apiserver enables by default and that clients rely on:
//! DefaultStorageClass, which gives a new claim without `spec.storageClassName` the default
//! StorageClass (a claim that says `""` asked for no class and keeps it); for a new pod,
//! ServiceAccount (the `default` account), Priority (0 without a class) and
//! DefaultTolerationSeconds (5 minutes on not-ready and unreachable nodes), and the QoS class
//! the real server computes on create; a new namespace's `spec.finalizers: [kubernetes]`;
//! StorageObjectInUseProtection's finalizers on a new claim or volume (where enabled, see
//! `Config::storage_object_in_use_protection`).

use serde_json::{Value, json};

use crate::app::App;
use crate::resources::{self, ResourceDef};

/// The annotations that mark a default class (GA and the beta one still honoured).
const DEFAULT_CLASS_ANNOTATIONS: [&str; 2] = [
    "storageclass.kubernetes.io/is-default-class",
    "storageclass.beta.kubernetes.io/is-default-class",
];

/// Runs the admission plugins that apply to a new object of `def`.
pub(super) fn on_create(app: &App, def: &ResourceDef, obj: &mut Value) {
    if def.group.is_empty() && def.plural == "persistentvolumeclaims" {
        default_storage_class(app, obj);
        if app.config.storage_object_in_use_protection {
            add_finalizer(obj, "kubernetes.io/pvc-protection");
        }
    }
    if def.group.is_empty()
        && def.plural == "persistentvolumes"
        && app.config.storage_object_in_use_protection
    {
        add_finalizer(obj, "kubernetes.io/pv-protection");
    }
    if def.group.is_empty() && def.plural == "pods" {
        pod(obj);
    }
    if def.group.is_empty() && def.plural == "namespaces" {
        // The real server's namespace strategy: the namespace controller's finalizer, which
        // kcm removes once the namespace is empty (apiserver-lite does not wait for it).
        let spec = &mut obj["spec"];
        let list = &mut spec["finalizers"];
        if !list.is_array() {
            *list = json!([]);
        }
        if let Some(a) = list.as_array_mut() {
            if !a.iter().any(|f| f == "kubernetes") {
                a.push(json!("kubernetes"));
            }
        }
    }
}

/// StorageObjectInUseProtection (on by default in kube-apiserver): every new claim and volume
/// gets its protection finalizer at create, so it exists before any pod can use it; the
/// pvc-protection and pv-protection controllers only add it where it is missing and remove it.
fn add_finalizer(obj: &mut Value, finalizer: &str) {
    let list = &mut obj["metadata"]["finalizers"];
    if !list.is_array() {
        *list = json!([]);
    }
    if let Some(a) = list.as_array_mut() {
        if !a.iter().any(|f| f == finalizer) {
            a.push(json!(finalizer));
        }
    }
}

/// The built-in priority classes' values (any other class is taken as given).
const SYSTEM_PRIORITIES: [(&str, i64); 2] = [
    ("system-node-critical", 2_000_001_000),
    ("system-cluster-critical", 2_000_000_000),
];

/// What kube-apiserver's default admission adds to a new pod. Unlike the real ServiceAccount
/// plugin this neither requires the account to exist nor mounts its token volume
/// (`kube-api-access-*`): apiserver-lite runs no controller that creates accounts.
fn pod(pod: &mut Value) {
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    let sa = spec
        .get("serviceAccountName")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .unwrap_or("default")
        .to_string();
    spec.insert("serviceAccountName".into(), json!(sa));
    spec.insert("serviceAccount".into(), json!(sa));
    if spec.get("priority").is_none_or(Value::is_null) {
        let class = spec
            .get("priorityClassName")
            .and_then(Value::as_str)
            .unwrap_or("");
        let value = if class.is_empty() {
            Some(0)
        } else {
            SYSTEM_PRIORITIES
                .iter()
                .find(|(n, _)| *n == class)
                .map(|(_, v)| *v)
        };
        if let Some(v) = value {
            spec.insert("priority".into(), json!(v));
            spec.entry("preemptionPolicy")
                .or_insert_with(|| json!("PreemptLowerPriority"));
        }
    }
    let tolerations = spec.entry("tolerations").or_insert_with(|| json!([]));
    if !tolerations.is_array() {
        *tolerations = json!([]);
    }
    if let Some(list) = tolerations.as_array_mut() {
        for taint in [
            "node.kubernetes.io/not-ready",
            "node.kubernetes.io/unreachable",
        ] {
            if !list.iter().any(|t| tolerates_no_execute(t, taint)) {
                list.push(
                    json!({"key": taint, "operator": "Exists", "effect": "NoExecute",
                    "tolerationSeconds": 300}),
                );
            }
        }
    }
    let qos = qos_class(spec);
    if let Some(status) = pod
        .as_object_mut()
        .map(|m| m.entry("status").or_insert_with(|| json!({})))
    {
        if let Some(status) = status.as_object_mut() {
            status.insert("qosClass".into(), json!(qos));
        }
    }
}

/// Whether toleration `t` already tolerates the NoExecute taint `key`.
fn tolerates_no_execute(t: &Value, key: &str) -> bool {
    let effect = t["effect"].as_str().unwrap_or("");
    let k = t["key"].as_str().unwrap_or("");
    (effect.is_empty() || effect == "NoExecute")
        && (k == key || (k.is_empty() && t["operator"].as_str() == Some("Exists")))
}

/// BestEffort without any cpu/memory request or limit; Guaranteed when every container limits
/// cpu and memory and requests exactly that (requests were defaulted from limits); else
/// Burstable. Quantities are compared as written.
fn qos_class(spec: &serde_json::Map<String, Value>) -> &'static str {
    let containers: Vec<&Value> = ["containers", "initContainers"]
        .iter()
        .filter_map(|l| spec.get(*l).and_then(Value::as_array))
        .flatten()
        .collect();
    let res = |c: &Value, kind: &str, r: &str| {
        c["resources"][kind][r]
            .as_str()
            .map(str::to_string)
            .or_else(|| c["resources"][kind][r].as_i64().map(|n| n.to_string()))
    };
    let mut any = false;
    let mut guaranteed = true;
    for c in &containers {
        for r in ["cpu", "memory"] {
            let (req, lim) = (res(c, "requests", r), res(c, "limits", r));
            any |= req.is_some() || lim.is_some();
            guaranteed &= lim.is_some() && req == lim;
        }
    }
    match (any, guaranteed) {
        (false, _) => "BestEffort",
        (true, true) => "Guaranteed",
        (true, false) => "Burstable",
    }
}

fn default_storage_class(app: &App, claim: &mut Value) {
    if !claim["spec"]["storageClassName"].is_null() {
        return;
    }
    let Some(res) = resources::find("storage.k8s.io", "v1", "storageclasses") else {
        return;
    };
    let Ok((_, classes)) = app.store.list(res, None, None, None) else {
        return;
    };
    let classes: Vec<Value> = classes.iter().map(|c| c.value()).collect();
    if let Some(name) = pick_default(classes.iter()) {
        claim["spec"]["storageClassName"] = json!(name);
    }
}

/// The default class: marked by annotation; of several, the newest (then by name), as
/// Kubernetes chooses since 1.26.
fn pick_default<'a>(classes: impl Iterator<Item = &'a Value>) -> Option<String> {
    classes
        .filter(|c| {
            DEFAULT_CLASS_ANNOTATIONS
                .iter()
                .any(|a| c["metadata"]["annotations"][*a].as_str() == Some("true"))
        })
        .map(|c| {
            (
                c["metadata"]["creationTimestamp"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                c["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        // Newest first; among equals, the first name.
        .max_by(|a, b| a.0.cmp(&b.0).then_with(|| b.1.cmp(&a.1)))
        .map(|(_, name)| name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(name: &str, created: &str, annotation: Option<&str>) -> Value {
        let mut c = json!({"metadata": {"name": name, "creationTimestamp": created}});
        if let Some(a) = annotation {
            c["metadata"]["annotations"] = json!({a: "true"});
        }
        c
    }

    #[test]
    fn the_newest_marked_class_is_the_default() {
        let classes = [
            class(
                "old",
                "2026-01-01T00:00:00Z",
                Some(DEFAULT_CLASS_ANNOTATIONS[0]),
            ),
            class(
                "new",
                "2026-02-01T00:00:00Z",
                Some(DEFAULT_CLASS_ANNOTATIONS[1]),
            ),
            class("unmarked", "2026-03-01T00:00:00Z", None),
        ];
        assert_eq!(pick_default(classes.iter()).as_deref(), Some("new"));
        let tie = [
            class(
                "b",
                "2026-01-01T00:00:00Z",
                Some(DEFAULT_CLASS_ANNOTATIONS[0]),
            ),
            class(
                "a",
                "2026-01-01T00:00:00Z",
                Some(DEFAULT_CLASS_ANNOTATIONS[0]),
            ),
        ];
        assert_eq!(pick_default(tie.iter()).as_deref(), Some("a"));
        assert_eq!(pick_default(classes[2..].iter()), None);
    }

    #[test]
    fn new_claims_and_volumes_get_their_protection_finalizer_once() {
        let mut claim = json!({"metadata": {"name": "c"}});
        add_finalizer(&mut claim, "kubernetes.io/pvc-protection");
        assert_eq!(
            claim["metadata"]["finalizers"],
            json!(["kubernetes.io/pvc-protection"])
        );
        let mut volume = json!({"metadata": {"finalizers": ["example.com/mine"]}});
        add_finalizer(&mut volume, "kubernetes.io/pv-protection");
        add_finalizer(&mut volume, "kubernetes.io/pv-protection");
        assert_eq!(
            volume["metadata"]["finalizers"],
            json!(["example.com/mine", "kubernetes.io/pv-protection"])
        );
    }

    #[test]
    fn pods_get_what_the_real_admission_adds() {
        let mut p = json!({"spec": {"containers": [{"name": "a"}],
            "tolerations": [{"key": "node.kubernetes.io/unreachable", "operator": "Exists",
                "effect": "NoExecute", "tolerationSeconds": 5}]}});
        pod(&mut p);
        assert_eq!(p["spec"]["serviceAccountName"], "default");
        assert_eq!(p["spec"]["serviceAccount"], "default");
        assert_eq!(p["spec"]["priority"], 0);
        assert_eq!(p["spec"]["preemptionPolicy"], "PreemptLowerPriority");
        let keys: Vec<(&str, i64)> = p["spec"]["tolerations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                (
                    t["key"].as_str().unwrap(),
                    t["tolerationSeconds"].as_i64().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            keys,
            [
                ("node.kubernetes.io/unreachable", 5),
                ("node.kubernetes.io/not-ready", 300)
            ]
        );
        assert_eq!(p["status"]["qosClass"], "BestEffort");

        let both = json!({"cpu": "100m", "memory": "64Mi"});
        let mut g = json!({"spec": {"priorityClassName": "system-node-critical",
            "containers": [{"name": "a", "resources": {"limits": both, "requests": both}}]}});
        pod(&mut g);
        assert_eq!(g["spec"]["priority"], 2_000_001_000);
        assert_eq!(g["status"]["qosClass"], "Guaranteed");
        let mut b = json!({"spec": {"priorityClassName": "mine",
            "containers": [{"name": "a", "resources": {"requests": {"cpu": "1"}}}]}});
        pod(&mut b);
        assert!(b["spec"]["priority"].is_null());
        assert_eq!(b["status"]["qosClass"], "Burstable");
    }
}
