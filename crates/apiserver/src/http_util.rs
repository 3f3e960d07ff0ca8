//! Small helpers shared by the handlers: JSON responses and object metadata access.

use axum::body::Body;
use axum::response::Response;
use http::{HeaderValue, StatusCode, header};
use serde_json::Value;

pub(crate) fn json_response<T: serde::Serialize + ?Sized>(code: StatusCode, body: &T) -> Response {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    let mut resp = Response::new(Body::from(bytes));
    *resp.status_mut() = code;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

pub(crate) fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")?.get(field)?.as_str()
}

pub(crate) fn name(obj: &Value) -> &str {
    meta_str(obj, "name").unwrap_or("")
}

pub(crate) fn namespace(obj: &Value) -> &str {
    meta_str(obj, "namespace").unwrap_or("")
}

/// `metadata` as a mutable map, created when missing or not an object.
pub(crate) fn meta_mut(obj: &mut Value) -> &mut serde_json::Map<String, Value> {
    if !obj.is_object() {
        *obj = Value::Object(serde_json::Map::new());
    }
    let Value::Object(map) = obj else {
        unreachable!("made an object above")
    };
    let meta = map
        .entry("metadata")
        .or_insert_with(|| Value::Object(serde_json::Map::new()));
    if !meta.is_object() {
        *meta = Value::Object(serde_json::Map::new());
    }
    let Value::Object(m) = meta else {
        unreachable!("made an object above")
    };
    m
}

/// Reads a dotted path (`spec.nodeName`) as a string, the way field selectors see it.
pub(crate) fn path_str(obj: &Value, path: &str) -> String {
    let mut cur = obj;
    for part in path.split('.') {
        match cur.get(part) {
            Some(v) => cur = v,
            None => return String::new(),
        }
    }
    match cur {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// Now as the RFC 3339 seconds timestamp Kubernetes writes (`2024-01-02T03:04:05Z`).
pub(crate) fn now_rfc3339() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn paths_and_meta() {
        let mut o = json!({"metadata": {"name": "a"}, "spec": {"nodeName": "n1", "x": true}});
        assert_eq!(name(&o), "a");
        assert_eq!(namespace(&o), "");
        assert_eq!(path_str(&o, "spec.nodeName"), "n1");
        assert_eq!(path_str(&o, "spec.x"), "true");
        assert_eq!(path_str(&o, "spec.missing"), "");
        meta_mut(&mut o).insert("namespace".into(), json!("ns"));
        assert_eq!(namespace(&o), "ns");
        let mut weird = json!(5);
        meta_mut(&mut weird).insert("name".into(), json!("b"));
        assert_eq!(name(&weird), "b");
        assert!(now_rfc3339().ends_with('Z'));
    }
}
