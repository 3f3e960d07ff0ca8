//! The defaults the real server fills in and that clients rely on (CSIDriver.attachRequired=true,
//! PV reclaim policy, pod restart policy, ...). Applied to every object written, as the real
//! server defaults on every decode.

use base64::Engine;
use serde_json::{Map, Value, json};

use crate::resources::ResourceDef;

fn obj_at<'a>(v: &'a mut Value, key: &str) -> Option<&'a mut Map<String, Value>> {
    let m = v.as_object_mut()?;
    let entry = m.entry(key).or_insert_with(|| json!({}));
    if entry.is_null() {
        *entry = json!({});
    }
    entry.as_object_mut()
}

fn default(m: &mut Map<String, Value>, key: &str, value: Value) {
    let slot = m.entry(key).or_insert(Value::Null);
    if slot.is_null() {
        *slot = value;
    }
}

pub(crate) fn apply_defaults(def: &ResourceDef, obj: &mut Value) {
    match (def.group, def.plural) {
        ("storage.k8s.io", "csidrivers") => {
            if let Some(spec) = obj_at(obj, "spec") {
                default(spec, "attachRequired", json!(true));
                default(spec, "podInfoOnMount", json!(false));
                default(spec, "requiresRepublish", json!(false));
                default(spec, "storageCapacity", json!(false));
                default(spec, "seLinuxMount", json!(false));
                default(spec, "fsGroupPolicy", json!("ReadWriteOnceWithFSType"));
                default(spec, "volumeLifecycleModes", json!(["Persistent"]));
            }
        }
        ("storage.k8s.io", "storageclasses") => {
            if let Some(m) = obj.as_object_mut() {
                default(m, "reclaimPolicy", json!("Delete"));
                default(m, "volumeBindingMode", json!("Immediate"));
            }
        }
        ("", "persistentvolumes") => {
            if let Some(spec) = obj_at(obj, "spec") {
                default(spec, "persistentVolumeReclaimPolicy", json!("Retain"));
                default(spec, "volumeMode", json!("Filesystem"));
            }
            if let Some(status) = obj_at(obj, "status") {
                default(status, "phase", json!("Pending"));
            }
        }
        ("", "persistentvolumeclaims") => {
            if let Some(spec) = obj_at(obj, "spec") {
                default(spec, "volumeMode", json!("Filesystem"));
            }
            if let Some(status) = obj_at(obj, "status") {
                default(status, "phase", json!("Pending"));
            }
        }
        ("", "namespaces") => {
            if let Some(status) = obj_at(obj, "status") {
                default(status, "phase", json!("Active"));
            }
        }
        ("", "secrets") => {
            if let Some(m) = obj.as_object_mut() {
                default(m, "type", json!("Opaque"));
                // stringData is write-only: it is merged into data, as the real server does.
                if let Some(Value::Object(sd)) = m.remove("stringData") {
                    let data = m.entry("data").or_insert_with(|| json!({}));
                    if !data.is_object() {
                        *data = json!({});
                    }
                    if let Some(d) = data.as_object_mut() {
                        for (k, v) in sd {
                            let text = v.as_str().unwrap_or_default();
                            let enc = base64::engine::general_purpose::STANDARD.encode(text);
                            d.insert(k, json!(enc));
                        }
                    }
                }
            }
        }
        ("", "pods") => pod_defaults(obj),
        ("apps", "deployments") => {
            if let Some(spec) = obj_at(obj, "spec") {
                default(spec, "replicas", json!(1));
                default(spec, "revisionHistoryLimit", json!(10));
                default(spec, "progressDeadlineSeconds", json!(600));
                let strategy = spec.entry("strategy").or_insert_with(|| json!({}));
                if let Some(st) = strategy.as_object_mut() {
                    default(st, "type", json!("RollingUpdate"));
                    if st.get("type") == Some(&json!("RollingUpdate")) {
                        let ru = st.entry("rollingUpdate").or_insert_with(|| json!({}));
                        if let Some(ru) = ru.as_object_mut() {
                            default(ru, "maxUnavailable", json!("25%"));
                            default(ru, "maxSurge", json!("25%"));
                        }
                    }
                }
            }
            template_defaults(obj);
        }
        ("apps", "daemonsets") => {
            if let Some(spec) = obj_at(obj, "spec") {
                default(spec, "revisionHistoryLimit", json!(10));
                let strategy = spec.entry("updateStrategy").or_insert_with(|| json!({}));
                if let Some(st) = strategy.as_object_mut() {
                    default(st, "type", json!("RollingUpdate"));
                    if st.get("type") == Some(&json!("RollingUpdate")) {
                        let ru = st.entry("rollingUpdate").or_insert_with(|| json!({}));
                        if let Some(ru) = ru.as_object_mut() {
                            default(ru, "maxUnavailable", json!(1));
                            default(ru, "maxSurge", json!(0));
                        }
                    }
                }
            }
            template_defaults(obj);
        }
        ("apps", "statefulsets") => {
            if let Some(spec) = obj_at(obj, "spec") {
                default(spec, "replicas", json!(1));
                default(spec, "revisionHistoryLimit", json!(10));
                default(spec, "podManagementPolicy", json!("OrderedReady"));
                default(
                    spec,
                    "persistentVolumeClaimRetentionPolicy",
                    json!({"whenDeleted": "Retain", "whenScaled": "Retain"}),
                );
                let strategy = spec.entry("updateStrategy").or_insert_with(|| json!({}));
                if let Some(st) = strategy.as_object_mut() {
                    default(st, "type", json!("RollingUpdate"));
                    if st.get("type") == Some(&json!("RollingUpdate")) {
                        let ru = st.entry("rollingUpdate").or_insert_with(|| json!({}));
                        if let Some(ru) = ru.as_object_mut() {
                            default(ru, "partition", json!(0));
                        }
                    }
                }
            }
            template_defaults(obj);
        }
        ("rbac.authorization.k8s.io", "rolebindings" | "clusterrolebindings") => {
            rbac_binding_defaults(obj)
        }
        // The real server always answers `status.attached` (a plain bool there).
        ("storage.k8s.io", "volumeattachments") => {
            if let Some(status) = obj_at(obj, "status") {
                default(status, "attached", json!(false));
            }
        }
        _ => {}
    }
    // The workloads' status fields that kube-apiserver always answers (not `omitempty`
    // there), so a new workload reads back with zero counts, as from the real server.
    let zeros: &[&str] = match (def.group, def.plural) {
        ("apps", "deployments") => &[],
        ("apps", "daemonsets") => &[
            "currentNumberScheduled",
            "numberMisscheduled",
            "desiredNumberScheduled",
            "numberReady",
        ],
        ("apps", "statefulsets") => &["replicas", "availableReplicas"],
        _ => return,
    };
    if let Some(status) = obj_at(obj, "status") {
        for f in zeros {
            default(status, f, json!(0));
        }
    }
    if def.plural == "daemonsets" {
        if let Some(meta) = obj_at(obj, "metadata") {
            if let Some(annotations) = obj_at_map(meta, "annotations") {
                default_str(annotations, DS_TEMPLATE_GENERATION, "1");
            }
        }
    }
}

/// The annotation through which apps/v1 DaemonSets carry their template generation; the real
/// server sets it on create and counts it up when the pod template changes.
pub(crate) const DS_TEMPLATE_GENERATION: &str = "deprecated.daemonset.template.generation";

fn obj_at_map<'a>(m: &'a mut Map<String, Value>, key: &str) -> Option<&'a mut Map<String, Value>> {
    let entry = m.entry(key).or_insert_with(|| json!({}));
    if entry.is_null() {
        *entry = json!({});
    }
    entry.as_object_mut()
}

fn default_str(m: &mut Map<String, Value>, key: &str, value: &str) {
    if m.get(key).and_then(Value::as_str).is_none() {
        m.insert(key.to_string(), json!(value));
    }
}

/// roleRef.apiGroup is the RBAC group unless said; a subject's apiGroup follows its kind.
fn rbac_binding_defaults(obj: &mut Value) {
    if let Some(role_ref) = obj_at(obj, "roleRef") {
        let empty = role_ref
            .get("apiGroup")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty);
        if empty {
            role_ref.insert("apiGroup".into(), json!("rbac.authorization.k8s.io"));
        }
    }
    let Some(subjects) = obj.get_mut("subjects").and_then(Value::as_array_mut) else {
        return;
    };
    for s in subjects.iter_mut().filter_map(Value::as_object_mut) {
        let group = match s.get("kind").and_then(Value::as_str) {
            Some("User" | "Group") => "rbac.authorization.k8s.io",
            _ => continue,
        };
        let slot = s.entry("apiGroup").or_insert(Value::Null);
        if slot.as_str().is_none_or(str::is_empty) {
            *slot = json!(group);
        }
    }
}

/// A workload's pod template gets the pod spec defaults (not the pod-only ones).
fn template_defaults(obj: &mut Value) {
    let Some(template) = obj
        .get_mut("spec")
        .and_then(|s| s.get_mut("template"))
        .filter(|t| t.is_object())
    else {
        return;
    };
    if let Some(spec) = obj_at(template, "spec") {
        pod_spec_defaults(spec);
    }
}

fn pod_defaults(obj: &mut Value) {
    if let Some(spec) = obj_at(obj, "spec") {
        pod_spec_defaults(spec);
        default(spec, "enableServiceLinks", json!(true));
        // A pod's (not a template's) containers request what they limit, unless they say.
        for list in ["containers", "initContainers"] {
            for c in spec
                .get_mut(list)
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                let Some(limits) = c
                    .pointer("/resources/limits")
                    .and_then(Value::as_object)
                    .cloned()
                else {
                    continue;
                };
                if let Some(requests) = c
                    .get_mut("resources")
                    .and_then(Value::as_object_mut)
                    .and_then(|r| obj_at_map(r, "requests"))
                {
                    for (k, v) in limits {
                        requests.entry(k).or_insert(v);
                    }
                }
            }
        }
    }
    if let Some(status) = obj_at(obj, "status") {
        default(status, "phase", json!("Pending"));
    }
}

fn pod_spec_defaults(spec: &mut Map<String, Value>) {
    // `serviceAccount` is the deprecated alias of `serviceAccountName`: the real server fills
    // either from the other and answers both.
    let named = |v: Option<&Value>| {
        v.and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    if let Some(sa) = named(spec.get("serviceAccountName")).or(named(spec.get("serviceAccount"))) {
        spec.insert("serviceAccountName".into(), json!(sa));
        spec.insert("serviceAccount".into(), json!(sa));
    }
    default(spec, "restartPolicy", json!("Always"));
    default(spec, "dnsPolicy", json!("ClusterFirst"));
    default(spec, "schedulerName", json!("default-scheduler"));
    default(spec, "terminationGracePeriodSeconds", json!(30));
    default(spec, "securityContext", json!({}));
    for list in ["containers", "initContainers"] {
        let Some(cs) = spec.get_mut(list).and_then(Value::as_array_mut) else {
            continue;
        };
        for c in cs.iter_mut().filter_map(Value::as_object_mut) {
            container_defaults(c);
        }
    }
    let Some(volumes) = spec.get_mut("volumes").and_then(Value::as_array_mut) else {
        return;
    };
    for v in volumes.iter_mut().filter_map(Value::as_object_mut) {
        for source in ["configMap", "secret", "downwardAPI", "projected"] {
            if let Some(src) = v.get_mut(source).and_then(Value::as_object_mut) {
                default(src, "defaultMode", json!(420));
            }
        }
        if let Some(hp) = v.get_mut("hostPath").and_then(Value::as_object_mut) {
            default(hp, "type", json!(""));
        }
    }
}

fn container_defaults(c: &mut Map<String, Value>) {
    default(c, "terminationMessagePath", json!("/dev/termination-log"));
    default(c, "terminationMessagePolicy", json!("File"));
    let image = c.get("image").and_then(Value::as_str).unwrap_or("");
    let last = image.rsplit('/').next().unwrap_or("");
    let latest = !last.contains(':') || last.ends_with(":latest");
    let policy = if latest && !image.contains('@') {
        "Always"
    } else {
        "IfNotPresent"
    };
    default(c, "imagePullPolicy", json!(policy));
    default(c, "resources", json!({}));
    if let Some(ports) = c.get_mut("ports").and_then(Value::as_array_mut) {
        for p in ports.iter_mut().filter_map(Value::as_object_mut) {
            default(p, "protocol", json!("TCP"));
        }
    }
    if let Some(env) = c.get_mut("env").and_then(Value::as_array_mut) {
        for e in env.iter_mut() {
            if let Some(fr) = e
                .pointer_mut("/valueFrom/fieldRef")
                .and_then(Value::as_object_mut)
            {
                default(fr, "apiVersion", json!("v1"));
            }
        }
    }
    for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
        let Some(p) = c.get_mut(probe).and_then(Value::as_object_mut) else {
            continue;
        };
        default(p, "timeoutSeconds", json!(1));
        default(p, "periodSeconds", json!(10));
        default(p, "successThreshold", json!(1));
        default(p, "failureThreshold", json!(3));
        if let Some(get) = p.get_mut("httpGet").and_then(Value::as_object_mut) {
            default(get, "scheme", json!("HTTP"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources;

    fn def(group: &str, plural: &str) -> &'static ResourceDef {
        resources::get(resources::find(group, "v1", plural).unwrap())
    }

    #[test]
    fn defaults_clients_rely_on() {
        let mut d = json!({"metadata": {"name": "x"}, "spec": {"attachRequired": false}});
        apply_defaults(def("storage.k8s.io", "csidrivers"), &mut d);
        assert_eq!(d["spec"]["attachRequired"], false);
        assert_eq!(d["spec"]["podInfoOnMount"], false);
        let mut d2 = json!({"metadata": {"name": "x"}});
        apply_defaults(def("storage.k8s.io", "csidrivers"), &mut d2);
        assert_eq!(d2["spec"]["attachRequired"], true);

        let mut pod = json!({"spec": {"containers": [{"name": "c", "image": "busybox:1.36"}, {"name": "d", "image": "nginx"}]}});
        apply_defaults(def("", "pods"), &mut pod);
        assert_eq!(pod["spec"]["restartPolicy"], "Always");
        assert_eq!(
            pod["spec"]["containers"][0]["imagePullPolicy"],
            "IfNotPresent"
        );
        assert_eq!(pod["spec"]["containers"][1]["imagePullPolicy"], "Always");
        assert_eq!(pod["status"]["phase"], "Pending");

        let mut secret = json!({"stringData": {"k": "hi"}});
        apply_defaults(def("", "secrets"), &mut secret);
        assert_eq!(secret["data"]["k"], "aGk=");
        assert_eq!(secret["type"], "Opaque");
        assert!(secret.get("stringData").is_none());
    }

    #[test]
    fn workload_and_binding_defaults() {
        let mut d = json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "x:1",
            "ports": [{"containerPort": 8080}], "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8080}},
            "env": [{"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}]}],
            "volumes": [{"name": "v", "emptyDir": {}}]}}}});
        apply_defaults(def("apps", "deployments"), &mut d);
        assert_eq!(d["spec"]["replicas"], 1);
        assert_eq!(d["spec"]["strategy"]["rollingUpdate"]["maxSurge"], "25%");
        let pod = &d["spec"]["template"]["spec"];
        assert_eq!(pod["restartPolicy"], "Always");
        assert!(pod.get("enableServiceLinks").is_none(), "pods only");
        let c = &pod["containers"][0];
        assert_eq!(c["ports"][0]["protocol"], "TCP");
        assert_eq!(c["livenessProbe"]["periodSeconds"], 10);
        assert_eq!(c["livenessProbe"]["httpGet"]["scheme"], "HTTP");
        assert_eq!(c["env"][0]["valueFrom"]["fieldRef"]["apiVersion"], "v1");

        let mut sts = json!({"spec": {}});
        apply_defaults(def("apps", "statefulsets"), &mut sts);
        assert_eq!(sts["spec"]["podManagementPolicy"], "OrderedReady");
        assert_eq!(
            sts["spec"]["updateStrategy"]["rollingUpdate"]["partition"],
            0
        );

        let mut ds = json!({"spec": {"updateStrategy": {"type": "OnDelete"}}});
        apply_defaults(def("apps", "daemonsets"), &mut ds);
        assert!(ds["spec"]["updateStrategy"].get("rollingUpdate").is_none());

        let mut b = json!({"subjects": [{"kind": "User", "name": "u"}, {"kind": "ServiceAccount", "name": "s"}]});
        apply_defaults(
            def("rbac.authorization.k8s.io", "clusterrolebindings"),
            &mut b,
        );
        assert_eq!(b["roleRef"]["apiGroup"], "rbac.authorization.k8s.io");
        assert_eq!(b["subjects"][0]["apiGroup"], "rbac.authorization.k8s.io");
        assert!(b["subjects"][1].get("apiGroup").is_none());
    }
}
