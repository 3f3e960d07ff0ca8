//! rbac.authorization.k8s.io/v1 rules: policy rules of Roles and ClusterRoles, the roleRef and
//! subjects of bindings (a binding without a roleRef is invalid; roleRef never changes). No
//! authorization runs here, so there is no escalation check either.

use serde_json::{Value, json};

use super::names;
use crate::status::FieldError;

pub(crate) const GROUP: &str = "rbac.authorization.k8s.io";

fn strs(v: &Value, key: &str) -> usize {
    v.get(key).and_then(Value::as_array).map_or(0, Vec::len)
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

/// `rules` of a Role (namespaced) or ClusterRole.
pub(super) fn rules(obj: &Value, namespaced: bool, errs: &mut Vec<FieldError>) {
    let rules = obj
        .get("rules")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    for (i, rule) in rules.iter().enumerate() {
        let at = format!("rules[{i}]");
        if strs(rule, "verbs") == 0 {
            errs.push(FieldError::required(
                format!("{at}.verbs"),
                "verbs must contain at least one value",
            ));
        }
        if strs(rule, "nonResourceURLs") > 0 {
            let urls = rule["nonResourceURLs"].clone();
            if namespaced {
                errs.push(FieldError::invalid(
                    format!("{at}.nonResourceURLs"),
                    urls.clone(),
                    "namespaced rules cannot apply to non-resource URLs",
                ));
            }
            if strs(rule, "apiGroups") + strs(rule, "resources") + strs(rule, "resourceNames") > 0 {
                errs.push(FieldError::invalid(
                    format!("{at}.nonResourceURLs"),
                    urls,
                    "rules cannot apply to both regular resources and non-resource URLs",
                ));
            }
            continue;
        }
        if strs(rule, "apiGroups") == 0 {
            errs.push(FieldError::required(
                format!("{at}.apiGroups"),
                "resource rules must supply at least one api group",
            ));
        }
        if strs(rule, "resources") == 0 {
            errs.push(FieldError::required(
                format!("{at}.resources"),
                "resource rules must supply at least one resource",
            ));
        }
    }
}

/// A RoleBinding (`namespaced`) or ClusterRoleBinding: roleRef and subjects.
pub(super) fn binding(obj: &Value, namespaced: bool, errs: &mut Vec<FieldError>) {
    let role_ref = obj.get("roleRef").cloned().unwrap_or(json!({}));
    let group = role_ref.get("apiGroup").cloned().unwrap_or(json!(""));
    if group != GROUP {
        errs.push(FieldError::not_supported(
            "roleRef.apiGroup",
            group,
            &[GROUP],
        ));
    }
    let kinds: &'static [&'static str] = if namespaced {
        &["Role", "ClusterRole"]
    } else {
        &["ClusterRole"]
    };
    let kind = str_of(&role_ref, "kind");
    if !kinds.contains(&kind) {
        errs.push(FieldError::not_supported(
            "roleRef.kind",
            json!(kind),
            kinds,
        ));
    }
    let name = str_of(&role_ref, "name");
    if name.is_empty() {
        errs.push(FieldError::required("roleRef.name", ""));
    } else {
        for p in names::path_segment_name(name) {
            errs.push(FieldError::invalid("roleRef.name", json!(name), p));
        }
    }
    let subjects = obj
        .get("subjects")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    for (i, s) in subjects.iter().enumerate() {
        subject(&format!("subjects[{i}]"), s, namespaced, errs);
    }
}

fn subject(at: &str, s: &Value, namespaced: bool, errs: &mut Vec<FieldError>) {
    let name = str_of(s, "name");
    if name.is_empty() {
        errs.push(FieldError::required(format!("{at}.name"), ""));
    }
    let group = str_of(s, "apiGroup");
    match str_of(s, "kind") {
        "ServiceAccount" => {
            if !name.is_empty() {
                for p in names::dns1123_subdomain(name) {
                    errs.push(FieldError::invalid(format!("{at}.name"), json!(name), p));
                }
            }
            if !group.is_empty() {
                errs.push(FieldError::not_supported(
                    format!("{at}.apiGroup"),
                    json!(group),
                    &[""],
                ));
            }
            if !namespaced && str_of(s, "namespace").is_empty() {
                errs.push(FieldError::required(format!("{at}.namespace"), ""));
            }
        }
        "User" | "Group" => {
            if group != GROUP {
                errs.push(FieldError::not_supported(
                    format!("{at}.apiGroup"),
                    json!(group),
                    &[GROUP],
                ));
            }
        }
        kind => errs.push(FieldError::not_supported(
            format!("{at}.kind"),
            json!(kind),
            &["ServiceAccount", "User", "Group"],
        )),
    }
}

/// A binding's roleRef never changes (delete and recreate the binding instead).
pub(super) fn binding_update(old: &Value, new: &Value, errs: &mut Vec<FieldError>) {
    if old.get("roleRef") != new.get("roleRef") {
        errs.push(FieldError::invalid(
            "roleRef",
            new.get("roleRef").cloned().unwrap_or(Value::Null),
            "cannot change roleRef",
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn messages(f: impl FnOnce(&mut Vec<FieldError>)) -> Vec<String> {
        let mut errs = Vec::new();
        f(&mut errs);
        errs.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn binding_needs_a_role_ref() {
        // What the defaulting leaves of a missing roleRef: only the group.
        let b = json!({"roleRef": {"apiGroup": GROUP}, "subjects": [{"kind": "ServiceAccount", "name": "csi-attacher"}]});
        assert_eq!(
            messages(|e| binding(&b, false, e)),
            vec![
                "roleRef.kind: Unsupported value: \"\": supported values: \"ClusterRole\"",
                "roleRef.name: Required value",
                "subjects[0].namespace: Required value",
            ]
        );
        let ok = json!({"roleRef": {"apiGroup": GROUP, "kind": "Role", "name": "system:leases"},
            "subjects": [{"kind": "ServiceAccount", "name": "csi-attacher"}, {"kind": "User", "name": "me", "apiGroup": GROUP}]});
        assert!(messages(|e| binding(&ok, true, e)).is_empty());
        assert_eq!(
            messages(|e| binding(&ok, false, e))[0],
            "roleRef.kind: Unsupported value: \"Role\": supported values: \"ClusterRole\""
        );
        let mut changed = ok.clone();
        changed["roleRef"]["name"] = json!("other");
        assert_eq!(
            messages(|e| binding_update(&ok, &changed, e)),
            vec![
                "roleRef: Invalid value: {\"apiGroup\":\"rbac.authorization.k8s.io\",\"kind\":\"Role\",\"name\":\"other\"}: cannot change roleRef"
            ]
        );
    }

    #[test]
    fn policy_rules() {
        let r = json!({"rules": [
            {"apiGroups": [""], "resources": ["persistentvolumes"], "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["pods"]},
            {"verbs": ["get"]},
            {"nonResourceURLs": ["/healthz"], "verbs": ["get"]}]});
        assert_eq!(
            messages(|e| rules(&r, true, e)),
            vec![
                "rules[1].verbs: Required value: verbs must contain at least one value",
                "rules[2].apiGroups: Required value: resource rules must supply at least one api group",
                "rules[2].resources: Required value: resource rules must supply at least one resource",
                "rules[3].nonResourceURLs: Invalid value: [\"/healthz\"]: namespaced rules cannot apply to non-resource URLs",
            ]
        );
        assert_eq!(messages(|e| rules(&r, false, e)).len(), 3);
    }
}
