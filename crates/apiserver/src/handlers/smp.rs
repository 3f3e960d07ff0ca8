//! Strategic merge patch for the types this server serves.
//!
//! Maps merge as in a JSON merge patch (`null` deletes). Lists follow the Kubernetes patch
//! strategies of the fields we serve: lists of objects with a merge key (`containers` by name,
//! `volumeMounts` by mountPath, `conditions` by type, CSINode `drivers` by name, ...) merge
//! element by element, `metadata.finalizers` is a set (union), every other list is replaced.
//! The directives kubectl sends are honoured: `$patch: replace|delete`, `$retainKeys`,
//! `$deleteFromPrimitiveList/<field>`; `$setElementOrder/<field>` only orders, and is ignored.

use serde_json::{Map, Value};

/// Fields whose lists merge by the given key (the `patchMergeKey` of the Kubernetes types).
fn merge_key(field: &str) -> Option<&'static str> {
    Some(match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets"
        | "drivers"
        | "resourceClaims"
        | "readinessGates" => "name",
        "ownerReferences" => "uid",
        "conditions" => "type",
        "volumeMounts" => "mountPath",
        "volumeDevices" => "devicePath",
        "ports" => "containerPort",
        "hostAliases" => "ip",
        "topologySpreadConstraints" => "topologyKey",
        _ => return None,
    })
}

/// Lists of scalars that merge as sets.
fn is_set_list(field: &str) -> bool {
    field == "finalizers"
}

fn is_directive(k: &str) -> bool {
    k.starts_with('$')
}

/// A patch value with its directives removed (what is stored when it is inserted whole).
fn clean(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !is_directive(k))
                .map(|(k, v)| (k.clone(), clean(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(
            a.iter()
                .filter(|i| i.get("$patch").is_none())
                .map(clean)
                .collect(),
        ),
        other => other.clone(),
    }
}

fn patch_directive(v: &Value) -> Option<&str> {
    v.get("$patch").and_then(Value::as_str)
}

/// Applies a strategic merge patch to `target`.
pub(crate) fn apply(target: &mut Value, patch: &Value) -> Result<(), String> {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return Ok(());
    };
    match patch_directive(patch) {
        Some("replace") => {
            *target = clean(patch);
            return Ok(());
        }
        Some("delete") => {
            *target = Value::Null;
            return Ok(());
        }
        Some("merge") | None => {}
        Some(other) => return Err(format!("unknown patch type: {other}")),
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(t) = target else {
        return Ok(());
    };
    for (k, v) in p {
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            let drop: Vec<&Value> = v.as_array().map(|a| a.iter().collect()).unwrap_or_default();
            if let Some(Value::Array(list)) = t.get_mut(field) {
                list.retain(|x| !drop.contains(&x));
            }
            continue;
        }
        if is_directive(k) {
            continue;
        }
        match v {
            Value::Null => {
                t.remove(k);
            }
            Value::Object(_) if patch_directive(v) == Some("delete") => {
                t.remove(k);
            }
            Value::Array(items) => {
                let merged = match (t.get_mut(k), merge_key(k)) {
                    (Some(Value::Array(cur)), Some(key)) => {
                        merge_keyed(cur, items, key)?;
                        true
                    }
                    (Some(Value::Array(cur)), None) if is_set_list(k) => {
                        for i in items {
                            if !cur.contains(i) {
                                cur.push(i.clone());
                            }
                        }
                        true
                    }
                    _ => false,
                };
                if !merged {
                    t.insert(k.clone(), clean(v));
                }
            }
            Value::Object(_) => {
                let slot = t.entry(k.clone()).or_insert(Value::Null);
                apply(slot, v)?;
                if slot.is_null() {
                    t.remove(k);
                }
            }
            scalar => {
                t.insert(k.clone(), scalar.clone());
            }
        }
    }
    if let Some(Value::Array(keep)) = p.get("$retainKeys") {
        let keep: Vec<&str> = keep.iter().filter_map(Value::as_str).collect();
        t.retain(|k, _| keep.contains(&k.as_str()));
    }
    Ok(())
}

fn merge_keyed(cur: &mut Vec<Value>, items: &[Value], key: &str) -> Result<(), String> {
    if items.iter().any(|i| patch_directive(i) == Some("replace")) {
        *cur = items
            .iter()
            .filter(|i| patch_directive(i).is_none())
            .map(clean)
            .collect();
        return Ok(());
    }
    for item in items {
        let Some(kv) = item.get(key) else {
            // No merge key: nothing to match; the element is appended as given.
            cur.push(clean(item));
            continue;
        };
        let pos = cur.iter().position(|c| c.get(key) == Some(kv));
        match (pos, patch_directive(item)) {
            (Some(i), Some("delete")) => {
                cur.remove(i);
            }
            (None, Some("delete")) => {}
            (Some(i), _) => apply(&mut cur[i], item)?,
            (None, _) => cur.push(clean(item)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn patched(target: Value, patch: Value) -> Value {
        let mut t = target;
        apply(&mut t, &patch).unwrap();
        t
    }

    #[test]
    fn maps_merge_and_null_deletes() {
        let t = json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"x": 1}});
        let r = patched(
            t,
            json!({"metadata": {"labels": {"a": null, "c": "3"}}, "spec": {"y": 2}}),
        );
        assert_eq!(
            r,
            json!({"metadata": {"labels": {"b": "2", "c": "3"}}, "spec": {"x": 1, "y": 2}})
        );
    }

    #[test]
    fn keyed_lists_merge_and_sets_union() {
        let t = json!({"metadata": {"finalizers": ["a"]}, "spec": {"containers": [{"name": "c", "image": "1"}, {"name": "d", "image": "1"}], "tolerations": [{"key": "x"}]}});
        let r = patched(
            t,
            json!({
                "metadata": {"finalizers": ["b", "a"]},
                "spec": {
                    "$setElementOrder/containers": [{"name": "c"}, {"name": "d"}],
                    "containers": [{"name": "c", "image": "2"}, {"name": "d", "$patch": "delete"}, {"name": "e", "image": "3"}],
                    "tolerations": [{"key": "y"}]
                }
            }),
        );
        assert_eq!(r["metadata"]["finalizers"], json!(["a", "b"]));
        assert_eq!(
            r["spec"]["containers"],
            json!([{"name": "c", "image": "2"}, {"name": "e", "image": "3"}])
        );
        assert_eq!(r["spec"]["tolerations"], json!([{"key": "y"}]));
    }

    #[test]
    fn directives() {
        let t = json!({"metadata": {"finalizers": ["a", "b"]}, "spec": {"m": {"x": 1, "y": 2}, "keep": {"p": 1, "q": 2}}});
        let r = patched(
            t,
            json!({
                "metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]},
                "spec": {"m": {"$patch": "replace", "z": 3}, "keep": {"$retainKeys": ["p"], "p": 5}}
            }),
        );
        assert_eq!(r["metadata"]["finalizers"], json!(["b"]));
        assert_eq!(r["spec"]["m"], json!({"z": 3}));
        assert_eq!(r["spec"]["keep"], json!({"p": 5}));
        let mut bad = json!({});
        assert!(apply(&mut bad, &json!({"$patch": "explode"})).is_err());
    }
}
