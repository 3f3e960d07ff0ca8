//! Type-specific rules: VolumeAttachment, CSIDriver, CSINode, StorageClass, PV, PVC, Pod, Secret,
//! ConfigMap; the apps and RBAC kinds are in their own modules and dispatched from here.

use base64::Engine;
use serde_json::{Value, json};

use super::names;
use crate::resources::ResourceDef;
use crate::status::FieldError;

const ACCESS_MODES: &[&str] = &[
    "ReadOnlyMany",
    "ReadWriteMany",
    "ReadWriteOnce",
    "ReadWriteOncePod",
];
const RECLAIM: &[&str] = &["Delete", "Recycle", "Retain"];
const VOLUME_MODES: &[&str] = &["Block", "Filesystem"];
const LIFECYCLE_MODES: &[&str] = &["Ephemeral", "Persistent"];
const FS_GROUP_POLICIES: &[&str] = &["File", "None", "ReadWriteOnceWithFSType"];
const BINDING_MODES: &[&str] = &["Immediate", "WaitForFirstConsumer"];

/// The PersistentVolume source fields; exactly one must be set.
const PV_SOURCES: &[&str] = &[
    "awsElasticBlockStore",
    "azureDisk",
    "azureFile",
    "cephfs",
    "cinder",
    "csi",
    "fc",
    "flexVolume",
    "flocker",
    "gcePersistentDisk",
    "glusterfs",
    "hostPath",
    "iscsi",
    "local",
    "nfs",
    "photonPersistentDisk",
    "portworxVolume",
    "quobyte",
    "rbd",
    "scaleIO",
    "storageos",
    "vsphereVolume",
];

fn s<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    let mut cur = v;
    for p in path {
        cur = cur.get(*p)?;
    }
    if cur.is_null() { None } else { Some(cur) }
}

fn str_at<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    s(v, path).and_then(Value::as_str).unwrap_or("")
}

fn csi_driver_name(field: &str, name: &str, errs: &mut Vec<FieldError>) {
    if name.is_empty() {
        errs.push(FieldError::required(field, ""));
        return;
    }
    if name.len() > 63 {
        errs.push(FieldError::too_long(field, json!(name), 63));
    }
    for p in names::dns1123_subdomain(&name.to_lowercase()) {
        errs.push(FieldError::invalid(field, json!(name), p));
    }
}

/// Kubernetes' `validateProvisioner`: a qualified name once lowercased, so in-tree provisioners
/// such as `kubernetes.io/aws-ebs` are accepted (a CSI driver name alone is not enough).
fn provisioner_name(name: &str, errs: &mut Vec<FieldError>) {
    if name.is_empty() {
        errs.push(FieldError::required("provisioner", ""));
        return;
    }
    for p in names::qualified_name(&name.to_lowercase()) {
        errs.push(FieldError::invalid("provisioner", json!(name), p));
    }
}

fn enum_value(
    field: &str,
    v: Option<&Value>,
    allowed: &'static [&'static str],
    errs: &mut Vec<FieldError>,
) {
    if let Some(v) = v {
        if !v.as_str().is_some_and(|x| allowed.contains(&x)) {
            errs.push(FieldError::not_supported(field, v.clone(), allowed));
        }
    }
}

fn access_modes(field: &str, v: Option<&Value>, errs: &mut Vec<FieldError>) {
    match v.and_then(Value::as_array) {
        Some(list) if !list.is_empty() => {
            for m in list {
                enum_value(field, Some(m), ACCESS_MODES, errs);
            }
        }
        _ => errs.push(FieldError::required(
            field,
            "at least 1 access mode is required",
        )),
    }
}

pub(super) fn validate(def: &ResourceDef, obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    match (def.group, def.plural) {
        ("storage.k8s.io", "volumeattachments") => volume_attachment(obj, &mut errs),
        ("storage.k8s.io", "csidrivers") => {
            enum_value(
                "spec.fsGroupPolicy",
                s(obj, &["spec", "fsGroupPolicy"]),
                FS_GROUP_POLICIES,
                &mut errs,
            );
            if let Some(modes) = s(obj, &["spec", "volumeLifecycleModes"]).and_then(Value::as_array)
            {
                for m in modes {
                    enum_value(
                        "spec.volumeLifecycleModes",
                        Some(m),
                        LIFECYCLE_MODES,
                        &mut errs,
                    );
                }
            }
        }
        ("storage.k8s.io", "csinodes") => {
            if let Some(drivers) = s(obj, &["spec", "drivers"]).and_then(Value::as_array) {
                for (i, d) in drivers.iter().enumerate() {
                    csi_driver_name(
                        &format!("spec.drivers[{i}].name"),
                        str_at(d, &["name"]),
                        &mut errs,
                    );
                    if str_at(d, &["nodeID"]).is_empty() {
                        errs.push(FieldError::required(
                            format!("spec.drivers[{i}].nodeID"),
                            "",
                        ));
                    }
                }
            } else if s(obj, &["spec", "drivers"]).is_none() && s(obj, &["spec"]).is_none() {
                errs.push(FieldError::required("spec.drivers", ""));
            }
        }
        ("storage.k8s.io", "storageclasses") => {
            provisioner_name(str_at(obj, &["provisioner"]), &mut errs);
            enum_value(
                "reclaimPolicy",
                s(obj, &["reclaimPolicy"]),
                &["Delete", "Retain"],
                &mut errs,
            );
            enum_value(
                "volumeBindingMode",
                s(obj, &["volumeBindingMode"]),
                BINDING_MODES,
                &mut errs,
            );
        }
        ("", "persistentvolumes") => persistent_volume(obj, &mut errs),
        ("", "persistentvolumeclaims") => {
            access_modes(
                "spec.accessModes",
                s(obj, &["spec", "accessModes"]),
                &mut errs,
            );
            if s(obj, &["spec", "resources", "requests", "storage"]).is_none() {
                errs.push(FieldError::required("spec.resources[storage]", ""));
            }
            enum_value(
                "spec.volumeMode",
                s(obj, &["spec", "volumeMode"]),
                VOLUME_MODES,
                &mut errs,
            );
        }
        ("", "pods") => {
            let spec = s(obj, &["spec"]).cloned().unwrap_or(json!({}));
            super::pod_spec::validate("spec", &spec, &mut errs);
        }
        ("", "configmaps") => config_map(obj, &mut errs),
        ("apps", "deployments") => super::apps::deployment(obj, &mut errs),
        ("apps", "daemonsets") => super::apps::daemonset(obj, &mut errs),
        ("apps", "statefulsets") => super::apps::statefulset(obj, &mut errs),
        (super::rbac::GROUP, "roles") => super::rbac::rules(obj, true, &mut errs),
        (super::rbac::GROUP, "clusterroles") => super::rbac::rules(obj, false, &mut errs),
        (super::rbac::GROUP, "rolebindings") => super::rbac::binding(obj, true, &mut errs),
        (super::rbac::GROUP, "clusterrolebindings") => super::rbac::binding(obj, false, &mut errs),
        ("", "secrets") => {
            if let Some(data) = s(obj, &["data"]).and_then(Value::as_object) {
                for (k, v) in data {
                    let key_ok = !k.is_empty()
                        && k.chars()
                            .all(|c| c.is_ascii_alphanumeric() || "-._".contains(c));
                    if !key_ok {
                        errs.push(FieldError::invalid(
                            "data",
                            json!(k),
                            "a valid config key must consist of alphanumeric characters, '-', '_' or '.'",
                        ));
                    }
                    let decoded = v
                        .as_str()
                        .map(|b| base64::engine::general_purpose::STANDARD.decode(b).is_ok());
                    if decoded != Some(true) {
                        errs.push(FieldError::invalid(
                            format!("data[{k}]"),
                            v.clone(),
                            "must be base64-encoded bytes",
                        ));
                    }
                }
            }
        }
        _ => {}
    }
    errs
}

/// ConfigMap keys (`data` and `binaryData` together) and the 1 MiB size limit.
fn config_map(obj: &Value, errs: &mut Vec<FieldError>) {
    let mut total = 0usize;
    let data = s(obj, &["data"]).and_then(Value::as_object);
    let binary = s(obj, &["binaryData"]).and_then(Value::as_object);
    for (field, map) in [("data", data), ("binaryData", binary)] {
        for (k, v) in map.into_iter().flatten() {
            for p in names::config_key(k) {
                errs.push(FieldError::invalid(format!("{field}[{k}]"), json!(k), p));
            }
            if field == "binaryData" && data.is_some_and(|d| d.contains_key(k)) {
                errs.push(FieldError::invalid(
                    format!("binaryData[{k}]"),
                    json!(k),
                    "duplicate of key present in data",
                ));
            }
            total += k.len() + v.as_str().map_or(0, str::len);
        }
    }
    if total > 1024 * 1024 {
        errs.push(FieldError::too_long("", json!(""), 1024 * 1024));
    }
}

fn volume_attachment(obj: &Value, errs: &mut Vec<FieldError>) {
    csi_driver_name("spec.attacher", str_at(obj, &["spec", "attacher"]), errs);
    let node = str_at(obj, &["spec", "nodeName"]);
    if node.is_empty() {
        errs.push(FieldError::required("spec.nodeName", ""));
    } else {
        for p in names::dns1123_subdomain(node) {
            errs.push(FieldError::invalid("spec.nodeName", json!(node), p));
        }
    }
    let pv = s(obj, &["spec", "source", "persistentVolumeName"]);
    let inline = s(obj, &["spec", "source", "inlineVolumeSpec"]);
    const ONE: &str = "must specify exactly one of inlineVolumeSpec and persistentVolumeName";
    match (pv, inline) {
        (None, None) => errs.push(FieldError::required("spec.source", ONE)),
        (Some(_), Some(_)) => errs.push(FieldError::forbidden("spec.source", ONE)),
        (Some(p), None) => {
            if p.as_str().is_none_or(str::is_empty) {
                errs.push(FieldError::required(
                    "spec.source.persistentVolumeName",
                    "must specify non empty persistentVolumeName",
                ));
            }
        }
        (None, Some(spec)) => {
            if s(spec, &["csi"]).is_none() {
                errs.push(FieldError::required(
                    "spec.source.inlineVolumeSpec.csi",
                    "must specify a CSI volume source",
                ));
            }
        }
    }
    if let Some(msg) = s(obj, &["status", "attachError", "message"]) {
        if msg.as_str().is_some_and(|m| m.len() > 1024) {
            errs.push(FieldError::too_long(
                "status.attachError.message",
                msg.clone(),
                1024,
            ));
        }
    }
}

fn persistent_volume(obj: &Value, errs: &mut Vec<FieldError>) {
    access_modes("spec.accessModes", s(obj, &["spec", "accessModes"]), errs);
    match s(obj, &["spec", "capacity"]).and_then(Value::as_object) {
        Some(cap) if cap.contains_key("storage") => {}
        _ => errs.push(FieldError::required("spec.capacity", "")),
    }
    enum_value(
        "spec.persistentVolumeReclaimPolicy",
        s(obj, &["spec", "persistentVolumeReclaimPolicy"]),
        RECLAIM,
        errs,
    );
    enum_value(
        "spec.volumeMode",
        s(obj, &["spec", "volumeMode"]),
        VOLUME_MODES,
        errs,
    );
    let spec = s(obj, &["spec"]).cloned().unwrap_or(json!({}));
    let sources: Vec<&&str> = PV_SOURCES
        .iter()
        .filter(|k| s(&spec, &[k]).is_some())
        .collect();
    match sources.len() {
        0 => errs.push(FieldError::required("spec", "must specify a volume type")),
        1 => {}
        _ => errs.push(FieldError::forbidden(
            "spec",
            "may not specify more than 1 volume type",
        )),
    }
    if let Some(csi) = s(&spec, &["csi"]) {
        csi_driver_name("spec.csi.driver", str_at(csi, &["driver"]), errs);
        if str_at(csi, &["volumeHandle"]).is_empty() {
            errs.push(FieldError::required("spec.csi.volumeHandle", ""));
        }
    }
}

fn pv_source(obj: &Value) -> Value {
    let mut out = serde_json::Map::new();
    for k in PV_SOURCES {
        if let Some(v) = s(obj, &["spec", k]) {
            out.insert((*k).to_string(), v.clone());
        }
    }
    Value::Object(out)
}

fn immutable(field: &str, old: Option<&Value>, new: Option<&Value>, errs: &mut Vec<FieldError>) {
    if old != new {
        errs.push(FieldError::invalid(
            field,
            new.cloned().unwrap_or(Value::Null),
            "field is immutable",
        ));
    }
}

fn without(v: Option<&Value>, paths: &[&[&str]]) -> Value {
    let mut v = v.cloned().unwrap_or(json!({}));
    for path in paths {
        let (last, parents) = match path.split_last() {
            Some(x) => x,
            None => continue,
        };
        let parent: String = parents.iter().map(|p| format!("/{p}")).collect();
        if let Some(m) = v.pointer_mut(&parent).and_then(Value::as_object_mut) {
            m.remove(*last);
        }
    }
    v
}

pub(super) fn validate_update(def: &ResourceDef, old: &Value, new: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    match (def.group, def.plural) {
        ("storage.k8s.io", "volumeattachments") if s(old, &["spec"]) != s(new, &["spec"]) => {
            errs.push(FieldError::invalid(
                "spec",
                json!("object"),
                "field is immutable",
            ));
        }
        ("storage.k8s.io", "csidrivers") => {
            // The real server names the field `spec.attachedRequired` in this error (sic):
            // kubectl users see that path from kube-apiserver v1.26, so they see it here too.
            immutable(
                "spec.attachedRequired",
                s(old, &["spec", "attachRequired"]),
                s(new, &["spec", "attachRequired"]),
                &mut errs,
            );
            immutable(
                "spec.volumeLifecycleModes",
                s(old, &["spec", "volumeLifecycleModes"]),
                s(new, &["spec", "volumeLifecycleModes"]),
                &mut errs,
            );
        }
        ("storage.k8s.io", "storageclasses") => {
            for f in [
                "parameters",
                "provisioner",
                "reclaimPolicy",
                "volumeBindingMode",
            ] {
                if s(old, &[f]) != s(new, &[f]) {
                    errs.push(FieldError::forbidden(
                        f,
                        format!("updates to {f} are forbidden."),
                    ));
                }
            }
        }
        ("", "persistentvolumes") if pv_source(old) != pv_source(new) => {
            errs.push(FieldError::forbidden(
                "spec.persistentvolumesource",
                "spec.persistentvolumesource is immutable after creation",
            ));
        }
        ("", "persistentvolumeclaims") => {
            // Binding sets volumeName once; expansion changes the storage request.
            let mut paths: Vec<&[&str]> =
                vec![&["resources", "requests"], &["volumeAttributesClassName"]];
            if str_at(old, &["spec", "volumeName"]).is_empty() {
                paths.push(&["volumeName"]);
            }
            // A claim created without a class may get one later (the PV controller's
            // retroactive default StorageClass); a class once set stays.
            if old["spec"]["storageClassName"].is_null() {
                paths.push(&["storageClassName"]);
            }
            if without(s(old, &["spec"]), &paths) != without(s(new, &["spec"]), &paths) {
                errs.push(FieldError::forbidden(
                    "spec",
                    "spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims",
                ));
            }
        }
        ("", "pods") => {
            let strip = |v: &Value| {
                let mut spec = without(
                    s(v, &["spec"]),
                    &[
                        &["activeDeadlineSeconds"],
                        &["tolerations"],
                        &["terminationGracePeriodSeconds"],
                    ],
                );
                for list in ["containers", "initContainers"] {
                    if let Some(cs) = spec.get_mut(list).and_then(Value::as_array_mut) {
                        for c in cs {
                            if let Some(m) = c.as_object_mut() {
                                m.remove("image");
                            }
                        }
                    }
                }
                spec
            };
            if strip(old) != strip(new) {
                errs.push(FieldError::forbidden(
                    "spec",
                    "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)",
                ));
            }
        }
        ("apps", "deployments" | "daemonsets" | "statefulsets") => {
            super::apps::update(old, new, &mut errs)
        }
        (super::rbac::GROUP, "rolebindings" | "clusterrolebindings") => {
            super::rbac::binding_update(old, new, &mut errs)
        }
        ("", "secrets") if s(old, &["type"]) != s(new, &["type"]) => {
            errs.push(FieldError::invalid(
                "type",
                new["type"].clone(),
                "field is immutable",
            ));
        }
        _ => {}
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources;

    fn def(group: &str, plural: &str) -> &'static ResourceDef {
        resources::get(resources::find(group, "v1", plural).unwrap())
    }

    fn fields(errs: &[FieldError]) -> Vec<&str> {
        errs.iter().map(|e| e.field.as_str()).collect()
    }

    #[test]
    fn volume_attachment_rules() {
        let va = def("storage.k8s.io", "volumeattachments");
        let ok = json!({"spec": {"attacher": "ebs.csi.aws.com", "nodeName": "n1", "source": {"persistentVolumeName": "pv1"}}});
        assert!(validate(va, &ok).is_empty());
        let none = json!({"spec": {"source": {}}});
        assert_eq!(
            fields(&validate(va, &none)),
            vec!["spec.attacher", "spec.nodeName", "spec.source"]
        );
        let both = json!({"spec": {"attacher": "a", "nodeName": "n", "source": {"persistentVolumeName": "p", "inlineVolumeSpec": {"csi": {}}}}});
        assert_eq!(
            validate(va, &both)[0].body(),
            "Forbidden: must specify exactly one of inlineVolumeSpec and persistentVolumeName"
        );
        let mut changed = ok.clone();
        changed["spec"]["nodeName"] = json!("n2");
        assert_eq!(fields(&validate_update(va, &ok, &changed)), vec!["spec"]);
        let mut status_only = ok.clone();
        status_only["status"] = json!({"attached": true});
        assert!(validate_update(va, &ok, &status_only).is_empty());
    }

    #[test]
    fn csidriver_attach_required_is_immutable() {
        let d = def("storage.k8s.io", "csidrivers");
        let old = json!({"spec": {"attachRequired": true}});
        let new = json!({"spec": {"attachRequired": false}});
        let errs = validate_update(d, &old, &new);
        assert_eq!(
            errs[0].to_string(),
            "spec.attachedRequired: Invalid value: false: field is immutable"
        );
        let bad = json!({"spec": {"volumeLifecycleModes": ["Forever"]}});
        assert_eq!(
            fields(&validate(d, &bad)),
            vec!["spec.volumeLifecycleModes"]
        );
    }

    #[test]
    fn pv_and_pvc_basics() {
        let pv = def("", "persistentvolumes");
        let ok = json!({"spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-1"}}});
        assert!(validate(pv, &ok).is_empty());
        let none = json!({"spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["Sometimes"]}});
        assert_eq!(
            fields(&validate(pv, &none)),
            vec!["spec.accessModes", "spec"]
        );
        let mut moved = ok.clone();
        moved["spec"]["csi"]["volumeHandle"] = json!("vol-2");
        assert_eq!(
            fields(&validate_update(pv, &ok, &moved)),
            vec!["spec.persistentvolumesource"]
        );

        let pvc = def("", "persistentvolumeclaims");
        let claim = json!({"spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}});
        assert!(validate(pvc, &claim).is_empty());
        let mut bound = claim.clone();
        bound["spec"]["volumeName"] = json!("pv1");
        bound["spec"]["resources"]["requests"]["storage"] = json!("2Gi");
        assert!(validate_update(pvc, &claim, &bound).is_empty());
        let mut rebound = bound.clone();
        rebound["spec"]["volumeName"] = json!("pv2");
        assert_eq!(
            fields(&validate_update(pvc, &bound, &rebound)),
            vec!["spec"]
        );
        assert_eq!(
            fields(&validate(pvc, &json!({"spec": {}}))),
            vec!["spec.accessModes", "spec.resources[storage]"]
        );
    }

    #[test]
    fn pods_and_secrets() {
        let pod = def("", "pods");
        let p = json!({"spec": {"containers": [{"name": "c", "image": "busybox"}]}});
        assert!(validate(pod, &p).is_empty());
        let mut img = p.clone();
        img["spec"]["containers"][0]["image"] = json!("busybox:2");
        assert!(validate_update(pod, &p, &img).is_empty());
        let mut node = p.clone();
        node["spec"]["nodeName"] = json!("n");
        assert_eq!(fields(&validate_update(pod, &p, &node)), vec!["spec"]);
        assert_eq!(
            fields(&validate(pod, &json!({"spec": {}}))),
            vec!["spec.containers"]
        );
        let secret = def("", "secrets");
        assert_eq!(
            fields(&validate(secret, &json!({"data": {"k": "%%%"}}))),
            vec!["data[k]"]
        );
        assert!(validate(secret, &json!({"data": {"k": "aGk="}})).is_empty());
    }
}
