//! JSON comparison for the vectors: absent, `null`, `{}` and `[]` are the same thing (Go's
//! encoder drops nil maps and lists but keeps empty non-nil ones).

use serde_json::{Map, Value};

/// `value` with every null, empty map and empty list removed from objects (recursively), and
/// the `apiVersion`/`kind` pair that k8s-openapi always writes dropped from the top level.
pub(crate) fn normalize(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut out = Map::new();
            for (k, v) in map {
                let v = normalize(v);
                if !is_empty(&v) {
                    out.insert(k.clone(), v);
                }
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(normalize).collect()),
        other => other.clone(),
    }
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

/// Drops the type metadata k8s-openapi adds; the Go vectors have an empty TypeMeta.
pub(crate) fn strip_type_meta(mut value: Value) -> Value {
    if let Value::Object(map) = &mut value {
        map.remove("apiVersion");
        map.remove("kind");
    }
    value
}

/// Equal under [`normalize`]; otherwise a readable list of the differing paths.
pub(crate) fn diff(expected: &Value, actual: &Value) -> Option<String> {
    let (e, a) = (normalize(expected), normalize(actual));
    if e == a || (is_empty(&e) && is_empty(&a)) {
        return None;
    }
    let mut lines = Vec::new();
    walk("", &e, &a, &mut lines);
    if lines.is_empty() {
        lines.push(format!("  expected: {e}\n  actual:   {a}"));
    }
    Some(lines.join("\n"))
}

fn walk(path: &str, e: &Value, a: &Value, out: &mut Vec<String>) {
    match (e, a) {
        (Value::Object(em), Value::Object(am)) => {
            let keys: std::collections::BTreeSet<&String> = em.keys().chain(am.keys()).collect();
            for k in keys {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                let null = Value::Null;
                walk(
                    &p,
                    em.get(k).unwrap_or(&null),
                    am.get(k).unwrap_or(&null),
                    out,
                );
            }
        }
        (Value::Array(ea), Value::Array(aa)) if ea.len() == aa.len() => {
            for (i, (x, y)) in ea.iter().zip(aa).enumerate() {
                walk(&format!("{path}[{i}]"), x, y, out);
            }
        }
        _ if e == a || (is_empty(e) && is_empty(a)) => {}
        _ => out.push(format!(
            "  {}: expected {e}, got {a}",
            if path.is_empty() { "(root)" } else { path }
        )),
    }
}

/// The value at a dotted path (`spec.csi.volumeHandle`), `null` when absent.
pub(crate) fn at_path<'a>(value: &'a Value, path: &str) -> &'a Value {
    static NULL: Value = Value::Null;
    let mut cur = value;
    for part in path.split('.') {
        match cur.get(part) {
            Some(v) => cur = v,
            None => return &NULL,
        }
    }
    cur
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn absent_and_empty_are_equal() {
        assert_eq!(
            diff(&json!({"a": {}, "b": [], "c": null}), &json!({})),
            None
        );
        assert_eq!(
            diff(&json!({"spec": {"x": {"y": {}}}}), &json!({"spec": {}})),
            None
        );
    }

    #[test]
    fn differences_name_the_path() {
        let d = diff(
            &json!({"spec": {"a": 1, "b": [1, 2]}}),
            &json!({"spec": {"a": 2, "b": [1, 3]}}),
        );
        let d = d.unwrap_or_default();
        assert!(d.contains("spec.a: expected 1, got 2"), "{d}");
        assert!(d.contains("spec.b[1]: expected 2, got 3"), "{d}");
        assert!(diff(&json!({"a": false}), &json!({})).is_some());
    }

    #[test]
    fn path_lookup() {
        let v = json!({"spec": {"csi": {"volumeHandle": "h"}}});
        assert_eq!(at_path(&v, "spec.csi.volumeHandle"), &json!("h"));
        assert_eq!(at_path(&v, "spec.nope"), &Value::Null);
    }
}
