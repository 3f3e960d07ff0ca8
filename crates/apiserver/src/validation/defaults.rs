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
        _ => {}
    }
}

fn pod_defaults(obj: &mut Value) {
    if let Some(spec) = obj_at(obj, "spec") {
        default(spec, "restartPolicy", json!("Always"));
        default(spec, "dnsPolicy", json!("ClusterFirst"));
        default(spec, "schedulerName", json!("default-scheduler"));
        default(spec, "terminationGracePeriodSeconds", json!(30));
        default(spec, "securityContext", json!({}));
        default(spec, "enableServiceLinks", json!(true));
        for list in ["containers", "initContainers"] {
            let Some(cs) = spec.get_mut(list).and_then(Value::as_array_mut) else {
                continue;
            };
            for c in cs.iter_mut().filter_map(Value::as_object_mut) {
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
            }
        }
    }
    if let Some(status) = obj_at(obj, "status") {
        default(status, "phase", json!("Pending"));
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
}
