//! Server-side apply and field ownership (`metadata.managedFields`), reduced to what clients
//! observe: an apply that would change a field another manager owns is a 409 Conflict unless
//! forced; fields a manager stops applying are removed when nobody else owns them; a non-apply
//! write moves the fields it changes to its own manager. Lists are atomic (owned whole).
//!
//! Ownership is recorded only on objects that have been written by server-side apply; objects
//! only ever written by create/update/patch carry no managedFields.

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

use super::smp;
use crate::http_util::now_rfc3339;
use crate::resources::ResourceDef;
use crate::status::ApiError;

type Path = Vec<String>;
type Fields = BTreeSet<Path>;

/// Fields the server owns; nobody manages them.
fn ignored(p: &Path) -> bool {
    let s: Vec<&str> = p.iter().map(String::as_str).collect();
    matches!(
        s.as_slice(),
        ["apiVersion"]
            | ["kind"]
            | [
                "metadata",
                "name"
                    | "namespace"
                    | "uid"
                    | "resourceVersion"
                    | "generation"
                    | "creationTimestamp"
                    | "deletionTimestamp"
                    | "deletionGracePeriodSeconds"
                    | "managedFields"
                    | "selfLink",
                ..
            ]
    )
}

fn collect(v: &Value, prefix: &mut Path, out: &mut Fields) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, child) in m {
                prefix.push(k.clone());
                collect(child, prefix, out);
                prefix.pop();
            }
        }
        _ => {
            if !prefix.is_empty() && !ignored(prefix) {
                out.insert(prefix.clone());
            }
        }
    }
}

fn leaves(v: &Value) -> Fields {
    let mut out = Fields::new();
    collect(v, &mut Vec::new(), &mut out);
    out
}

fn value_at<'a>(v: &'a Value, p: &Path) -> Option<&'a Value> {
    p.iter().try_fold(v, |cur, k| cur.get(k))
}

fn remove_at(v: &mut Value, p: &Path) {
    let Some((last, parents)) = p.split_last() else {
        return;
    };
    let mut cur = v;
    for k in parents {
        match cur.get_mut(k) {
            Some(next) => cur = next,
            None => return,
        }
    }
    if let Some(m) = cur.as_object_mut() {
        m.remove(last);
    }
}

fn to_v1(fields: &Fields) -> Value {
    let mut root = Map::new();
    for p in fields {
        let mut cur = &mut root;
        for k in p {
            let slot = cur.entry(format!("f:{k}")).or_insert_with(|| json!({}));
            if !slot.is_object() {
                *slot = json!({});
            }
            let Value::Object(next) = slot else { break };
            cur = next;
        }
    }
    Value::Object(root)
}

fn from_v1(v: &Value, prefix: &mut Path, out: &mut Fields) {
    let Some(m) = v.as_object() else { return };
    let children: Vec<(&String, &Value)> = m.iter().filter(|(k, _)| k.starts_with("f:")).collect();
    if children.is_empty() {
        if !prefix.is_empty() {
            out.insert(prefix.clone());
        }
        return;
    }
    for (k, child) in children {
        prefix.push(k[2..].to_string());
        from_v1(child, prefix, out);
        prefix.pop();
    }
}

#[derive(Debug, Clone)]
struct Entry {
    manager: String,
    operation: String,
    api_version: String,
    time: String,
    fields: Fields,
}

fn entries(obj: &Value) -> Vec<Entry> {
    let Some(list) = obj["metadata"]["managedFields"].as_array() else {
        return Vec::new();
    };
    list.iter()
        .map(|e| {
            let mut fields = Fields::new();
            from_v1(&e["fieldsV1"], &mut Vec::new(), &mut fields);
            Entry {
                manager: e["manager"].as_str().unwrap_or("").to_string(),
                operation: e["operation"].as_str().unwrap_or("Update").to_string(),
                api_version: e["apiVersion"].as_str().unwrap_or("").to_string(),
                time: e["time"].as_str().unwrap_or("").to_string(),
                fields,
            }
        })
        .collect()
}

/// Stores `list` (pruned to fields that exist in `obj`) as `obj`'s managedFields.
fn store(obj: &mut Value, mut list: Vec<Entry>) {
    let present = leaves(obj);
    for e in &mut list {
        e.fields
            .retain(|p| present.contains(p) || present.iter().any(|q| q.starts_with(p)));
    }
    list.retain(|e| !e.fields.is_empty());
    let rendered: Vec<Value> = list
        .iter()
        .map(|e| {
            json!({
                "manager": e.manager,
                "operation": e.operation,
                "apiVersion": e.api_version,
                "time": e.time,
                "fieldsType": "FieldsV1",
                "fieldsV1": to_v1(&e.fields),
            })
        })
        .collect();
    if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        if rendered.is_empty() {
            m.remove("managedFields");
        } else {
            m.insert("managedFields".into(), Value::Array(rendered));
        }
    }
}

/// Ownership bookkeeping for a non-apply write of `old` to `new` by `manager`.
pub(super) fn track_update(def: &ResourceDef, old: &Value, new: &mut Value, manager: &str) {
    let mut list = entries(old);
    if list.is_empty() {
        if let Some(m) = new.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("managedFields");
        }
        return;
    }
    let (before, after) = (leaves(old), leaves(new));
    let changed: Fields = before
        .symmetric_difference(&after)
        .cloned()
        .chain(
            after
                .iter()
                .filter(|p| value_at(old, p) != value_at(new, p))
                .cloned(),
        )
        .collect();
    for e in list.iter_mut().filter(|e| e.manager != manager) {
        e.fields.retain(|p| !changed.contains(p));
    }
    let mine = match list
        .iter()
        .position(|e| e.manager == manager && e.operation == "Update")
    {
        Some(i) => i,
        None => {
            list.push(Entry {
                manager: manager.to_string(),
                operation: "Update".into(),
                api_version: def.api_version(),
                time: String::new(),
                fields: Fields::new(),
            });
            list.len() - 1
        }
    };
    let added: Vec<Path> = changed
        .iter()
        .filter(|p| after.contains(*p))
        .cloned()
        .collect();
    if !added.is_empty() {
        list[mine].fields.extend(added);
        list[mine].time = now_rfc3339();
    }
    store(new, list);
}

/// The object a server-side apply of `applied` by `manager` produces from `old`.
pub(super) fn apply(
    def: &ResourceDef,
    old: Option<&Value>,
    applied: &Value,
    manager: &str,
    force: bool,
) -> Result<Value, ApiError> {
    let fields = leaves(applied);
    let mut list = old.map(entries).unwrap_or_default();
    let mut new = old.cloned().unwrap_or_else(|| json!({}));
    if let Some(old) = old {
        let mut conflicts: Vec<(String, Path)> = Vec::new();
        for e in list.iter().filter(|e| e.manager != manager) {
            for p in e.fields.intersection(&fields) {
                if value_at(old, p) != value_at(applied, p) {
                    conflicts.push((e.manager.clone(), p.clone()));
                }
            }
        }
        if !conflicts.is_empty() && !force {
            return Err(conflict(def, crate::http_util::name(old), &conflicts));
        }
        // Fields this manager applied before and no longer applies go, unless others own them.
        if let Some(prev) = list
            .iter()
            .find(|e| e.manager == manager && e.operation == "Apply")
        {
            let dropped: Vec<Path> = prev
                .fields
                .difference(&fields)
                .filter(|p| {
                    !list
                        .iter()
                        .any(|e| e.manager != manager && e.fields.contains(*p))
                })
                .cloned()
                .collect();
            for p in dropped {
                remove_at(&mut new, &p);
            }
        }
        if force {
            for e in list.iter_mut().filter(|e| e.manager != manager) {
                e.fields.retain(|p| !fields.contains(p));
            }
        }
    }
    smp::apply(&mut new, applied).map_err(ApiError::bad_request)?;
    list.retain(|e| !(e.manager == manager && e.operation == "Apply"));
    list.push(Entry {
        manager: manager.to_string(),
        operation: "Apply".into(),
        api_version: def.api_version(),
        time: now_rfc3339(),
        fields,
    });
    store(&mut new, list);
    Ok(new)
}

fn conflict(def: &ResourceDef, name: &str, conflicts: &[(String, Path)]) -> ApiError {
    let describe = |(m, p): &(String, Path)| {
        (
            format!("conflict with \"{m}\""),
            format!(".{}", p.join(".")),
        )
    };
    let lines: Vec<String> = conflicts
        .iter()
        .map(describe)
        .map(|(m, f)| format!("{m}: {f}"))
        .collect();
    let message = if lines.len() == 1 {
        format!("Apply failed with 1 conflict: {}", lines[0])
    } else {
        format!(
            "Apply failed with {} conflicts: {}",
            lines.len(),
            lines.join("\n")
        )
    };
    let causes: Vec<Value> = conflicts
        .iter()
        .map(describe)
        .map(|(m, f)| json!({"reason": "FieldManagerConflict", "message": m, "field": f}))
        .collect();
    ApiError {
        code: 409,
        reason: "Conflict",
        message,
        details: Some(
            json!({"name": name, "group": def.group, "kind": def.plural, "causes": causes}),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources;

    fn lease() -> &'static ResourceDef {
        resources::get(resources::find("coordination.k8s.io", "v1", "leases").unwrap())
    }

    #[test]
    fn apply_conflicts_with_other_managers_unless_forced() {
        let base = json!({"metadata": {"name": "l"}, "spec": {}});
        let a = apply(
            lease(),
            Some(&base),
            &json!({"spec": {"holderIdentity": "a", "leaseDurationSeconds": 10}}),
            "a",
            false,
        )
        .unwrap();
        assert_eq!(a["spec"]["holderIdentity"], "a");
        assert_eq!(
            a["metadata"]["managedFields"][0]["fieldsV1"],
            json!({"f:spec": {"f:holderIdentity": {}, "f:leaseDurationSeconds": {}}})
        );
        // Same value: shared ownership, no conflict.
        assert!(
            apply(
                lease(),
                Some(&a),
                &json!({"spec": {"leaseDurationSeconds": 10}}),
                "b",
                false
            )
            .is_ok()
        );
        let e = apply(
            lease(),
            Some(&a),
            &json!({"spec": {"holderIdentity": "b"}}),
            "b",
            false,
        )
        .unwrap_err();
        assert_eq!(e.code, 409);
        assert_eq!(
            e.message,
            "Apply failed with 1 conflict: conflict with \"a\": .spec.holderIdentity"
        );
        let forced = apply(
            lease(),
            Some(&a),
            &json!({"spec": {"holderIdentity": "b"}}),
            "b",
            true,
        )
        .unwrap();
        assert_eq!(forced["spec"]["holderIdentity"], "b");
        // Now "a" no longer owns holderIdentity; it can be changed by "b" again without force.
        assert!(
            apply(
                lease(),
                Some(&forced),
                &json!({"spec": {"holderIdentity": "c"}}),
                "b",
                false
            )
            .is_ok()
        );
    }

    #[test]
    fn updates_take_ownership_and_removed_fields_release_it() {
        let base = json!({"metadata": {"name": "l"}, "spec": {}});
        let a = apply(
            lease(),
            Some(&base),
            &json!({"spec": {"holderIdentity": "a", "renewTime": "t1"}}),
            "a",
            false,
        )
        .unwrap();
        // Someone else clears the holder with a merge-style update.
        let mut cleared = a.clone();
        cleared["spec"]
            .as_object_mut()
            .unwrap()
            .remove("holderIdentity");
        track_update(lease(), &a, &mut cleared, "b");
        // Nobody owns holderIdentity any more: "c" applies without a conflict.
        let c = apply(
            lease(),
            Some(&cleared),
            &json!({"spec": {"holderIdentity": "c"}}),
            "c",
            false,
        )
        .unwrap();
        assert_eq!(c["spec"]["holderIdentity"], "c");
        // An update that changes renewTime moves it to the updater.
        let mut renewed = c.clone();
        renewed["spec"]["renewTime"] = json!("t2");
        track_update(lease(), &c, &mut renewed, "c");
        let e = apply(
            lease(),
            Some(&renewed),
            &json!({"spec": {"renewTime": "t3"}}),
            "a",
            false,
        )
        .unwrap_err();
        assert!(e.message.contains("conflict with \"c\""), "{}", e.message);
    }

    #[test]
    fn a_manager_dropping_a_field_removes_it() {
        let base = json!({"metadata": {"name": "l"}, "spec": {}});
        let a = apply(
            lease(),
            Some(&base),
            &json!({"spec": {"holderIdentity": "a", "leaseDurationSeconds": 5}}),
            "a",
            false,
        )
        .unwrap();
        let a2 = apply(
            lease(),
            Some(&a),
            &json!({"spec": {"holderIdentity": "a"}}),
            "a",
            false,
        )
        .unwrap();
        assert!(a2["spec"].get("leaseDurationSeconds").is_none());
    }
}
