//! Validation with the real server's field paths and messages: metadata rules for every type and
//! the type-specific rules our components and kubectl can observe.

mod apps;
mod defaults;
mod kinds;
pub(crate) mod names;
mod pod_spec;
mod rbac;

use serde_json::{Value, json};

use crate::resources::ResourceDef;
use crate::status::FieldError;

pub(crate) use defaults::{DS_TEMPLATE_GENERATION, apply_defaults};

/// Validates a new object (already defaulted, name and namespace settled).
/// The message kube-apiserver's decoder gives for a malformed resource quantity.
pub(crate) const QUANTITY_MSG: &str =
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";

/// Whether `q` is a quantity as the real decoder's syntax check takes it (a number, or a
/// string of digits and dots, then suffix letters and an exponent).
fn is_quantity(q: &Value) -> bool {
    let Some(s) = q.as_str() else {
        return q.is_number();
    };
    let b = s.as_bytes();
    let mut i = usize::from(matches!(b.first(), Some(b'+' | b'-')));
    let digits = i;
    while i < b.len() && (b[i].is_ascii_digit() || b[i] == b'.') {
        i += 1;
    }
    if i == digits {
        return false;
    }
    while i < b.len() && b"eEinumkKMGTP".contains(&b[i]) {
        i += 1;
    }
    if i < b.len() && (b[i] == b'+' || b[i] == b'-') {
        i += 1;
    }
    b[i..].iter().all(u8::is_ascii_digit)
}

/// Whether every resource quantity of `obj` (a PV's capacity, a claim's requests and limits,
/// containers' resources) parses; kube-apiserver refuses the whole body otherwise, before
/// any validation.
pub(crate) fn quantities_ok(def: &ResourceDef, obj: &Value) -> bool {
    let maps: Vec<&Value> = match (def.group, def.plural) {
        ("", "persistentvolumes") => vec![&obj["spec"]["capacity"]],
        ("", "persistentvolumeclaims") => vec![
            &obj["spec"]["resources"]["requests"],
            &obj["spec"]["resources"]["limits"],
            &obj["status"]["capacity"],
        ],
        ("", "pods") | ("apps", _) => {
            let spec = if def.plural == "pods" {
                &obj["spec"]
            } else {
                &obj["spec"]["template"]["spec"]
            };
            ["containers", "initContainers"]
                .iter()
                .filter_map(|l| spec[*l].as_array())
                .flatten()
                .flat_map(|c| [&c["resources"]["limits"], &c["resources"]["requests"]])
                .collect()
        }
        _ => Vec::new(),
    };
    maps.iter()
        .filter_map(|m| m.as_object())
        .flat_map(|m| m.values())
        .all(is_quantity)
}

pub(crate) fn validate_create(def: &ResourceDef, obj: &Value) -> Vec<FieldError> {
    let mut errs = validate_meta(def, obj);
    errs.extend(kinds::validate(def, obj));
    errs
}

/// Validates an update of `old` to `new` (both full objects).
pub(crate) fn validate_update(def: &ResourceDef, old: &Value, new: &Value) -> Vec<FieldError> {
    let mut errs = validate_meta(def, new);
    errs.extend(kinds::validate(def, new));
    errs.extend(kinds::validate_update(def, old, new));
    errs
}

fn validate_meta(def: &ResourceDef, obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let meta = obj.get("metadata").cloned().unwrap_or(json!({}));
    let name = meta.get("name").and_then(Value::as_str).unwrap_or("");
    if name.is_empty() {
        errs.push(FieldError::required(
            "metadata.name",
            "name or generateName is required",
        ));
    } else {
        let problems = match def.plural {
            "namespaces" => names::dns1123_label(name),
            "csidrivers" => {
                let mut p = names::dns1123_subdomain(&name.to_lowercase());
                if name.len() > 63 {
                    p.insert(0, "must be no more than 63 characters".into());
                }
                p
            }
            // Event names are generated from object names and timestamps, and RBAC names carry
            // colons (`system:...`): the real server only requires a path segment for them.
            _ if def.plural == "events" || def.group == "rbac.authorization.k8s.io" => {
                names::path_segment_name(name)
            }
            _ => names::dns1123_subdomain(name),
        };
        for p in problems {
            errs.push(FieldError::invalid("metadata.name", json!(name), p));
        }
    }
    if def.namespaced {
        let ns = meta.get("namespace").and_then(Value::as_str).unwrap_or("");
        if ns.is_empty() {
            errs.push(FieldError::required("metadata.namespace", ""));
        }
    }
    if let Some(l) = meta.get("labels") {
        labels("metadata.labels", l, &mut errs);
    }
    if let Some(ann) = meta.get("annotations") {
        match ann.as_object() {
            Some(map) => {
                let mut total = 0usize;
                for (k, v) in map {
                    for p in names::qualified_name(&k.to_lowercase()) {
                        errs.push(FieldError::invalid("metadata.annotations", json!(k), p));
                    }
                    total += k.len() + v.as_str().map_or(0, str::len);
                    if !v.is_string() {
                        errs.push(FieldError::invalid(
                            "metadata.annotations",
                            v.clone(),
                            "annotation values must be strings",
                        ));
                    }
                }
                if total > 256 * 1024 {
                    errs.push(FieldError::too_long(
                        "metadata.annotations",
                        json!(""),
                        256 * 1024,
                    ));
                }
            }
            None if ann.is_null() => {}
            None => errs.push(FieldError::invalid(
                "metadata.annotations",
                ann.clone(),
                "must be a map",
            )),
        }
    }
    if let Some(fins) = meta.get("finalizers").filter(|f| !f.is_null()) {
        match fins.as_array() {
            Some(list) => {
                for (i, f) in list.iter().enumerate() {
                    let field = format!("metadata.finalizers[{i}]");
                    match f.as_str() {
                        Some(s) => {
                            for p in names::qualified_name(s) {
                                errs.push(FieldError::invalid(field.clone(), json!(s), p));
                            }
                        }
                        None => {
                            errs.push(FieldError::invalid(field, f.clone(), "must be a string"))
                        }
                    }
                }
            }
            None => errs.push(FieldError::invalid(
                "metadata.finalizers",
                fins.clone(),
                "must be a list",
            )),
        }
    }
    errs
}

/// Label keys and values (object labels, pod template labels, selectors' matchLabels).
pub(super) fn labels(field: &str, labels: &Value, errs: &mut Vec<FieldError>) {
    match labels.as_object() {
        Some(map) => {
            for (k, v) in map {
                for p in names::qualified_name(k) {
                    errs.push(FieldError::invalid(field, json!(k), p));
                }
                match v.as_str() {
                    Some(s) => {
                        for p in names::label_value(s) {
                            errs.push(FieldError::invalid(field, json!(s), p));
                        }
                    }
                    None => errs.push(FieldError::invalid(
                        field,
                        v.clone(),
                        "label values must be strings",
                    )),
                }
            }
        }
        None if labels.is_null() => {}
        None => errs.push(FieldError::invalid(field, labels.clone(), "must be a map")),
    }
}

#[cfg(test)]
mod quantity_tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn quantities_as_the_real_decoder_takes_them() {
        for ok in ["4Gi", "100m", "1e3", "0.5", "+1", "1E-3", "8"] {
            assert!(is_quantity(&json!(ok)), "{ok}");
        }
        assert!(is_quantity(&json!(3)));
        for bad in ["lots", "", "Gi", "1 Gi", "1Gi!"] {
            assert!(!is_quantity(&json!(bad)), "{bad}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources;

    fn def(plural: &str) -> &'static ResourceDef {
        let r = resources::RESOURCES
            .iter()
            .position(|r| r.plural == plural)
            .unwrap();
        resources::get(r)
    }

    #[test]
    fn metadata_rules() {
        let ok = json!({"metadata": {"name": "a", "labels": {"app": "x"}, "finalizers": ["kubernetes.io/pv-protection"]}});
        assert!(validate_meta(def("nodes"), &ok).is_empty());
        let bad = json!({"metadata": {"name": "A_b", "labels": {"bad key!": "x", "k": "-v"}, "finalizers": ["a/b/c"]}});
        let errs = validate_meta(def("nodes"), &bad);
        let fields: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
        assert!(fields.contains(&"metadata.name"));
        assert!(fields.contains(&"metadata.labels"));
        assert!(fields.contains(&"metadata.finalizers[0]"));
        let ns = json!({"metadata": {"name": "a.b"}});
        assert_eq!(validate_meta(def("namespaces"), &ns).len(), 1);
        let pod = json!({"metadata": {"name": "p"}});
        assert_eq!(
            validate_meta(def("pods"), &pod)[0].field,
            "metadata.namespace"
        );
        let csi = json!({"metadata": {"name": "ebs.csi.aws.com"}});
        assert!(validate_meta(def("csidrivers"), &csi).is_empty());
    }
}
