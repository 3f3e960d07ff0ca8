//! An object as the store keeps it: its JSON text, not a `serde_json::Value` tree.
//!
//! A `Value` costs 7–12 times the size of its text: every JSON object is a B-tree node of
//! ~630 bytes however few keys it has, and every key and string is a heap allocation of its own.
//! At 1,000 pods on 10 nodes the store's objects (pods, claims, volumes, attachments and ~5,600
//! Events) took ~85 MiB of heap as `Value`s and take ~10 MiB as text (docs/benchmarks.md).
//!
//! Reads answer with the text as it is (a GET, a list, a watch event and the write log no
//! longer copy or re-serialize the object); a write parses the current object (tens of µs for a
//! pod), as etcd-backed kube-apiserver decodes what it read from etcd. The key, resourceVersion
//! and uid are kept beside the text, so the lookups that happen on every request (a bound
//! token's owner, a list's continue key, a snapshot's versions) parse nothing.

use serde::{Serialize, Serializer};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::http_util::{name, namespace};

/// An object's key within its resource: (namespace, name); namespace is empty when cluster-scoped.
pub(crate) type Key = (String, String);

pub(crate) fn key_of(obj: &Value) -> Key {
    (namespace(obj).to_string(), name(obj).to_string())
}

/// One stored version of an object.
pub(crate) struct Stored {
    json: Box<RawValue>,
    key: Key,
    rv: u64,
    uid: Option<Box<str>>,
}

impl Stored {
    /// `obj` as stored: serialized once, here.
    pub fn new(obj: &Value) -> Self {
        let json = serde_json::value::to_raw_value(obj).unwrap_or_else(|e| {
            // A `Value` always serializes (its map keys are strings); kept total anyway.
            tracing::error!(error = %e, "serializing an object for the store failed");
            RawValue::NULL.to_owned()
        });
        let meta = obj.get("metadata");
        let rv = meta
            .and_then(|m| m.get("resourceVersion"))
            .and_then(Value::as_str)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let uid = meta
            .and_then(|m| m.get("uid"))
            .and_then(Value::as_str)
            .map(Box::from);
        Self {
            json,
            key: key_of(obj),
            rv,
            uid,
        }
    }

    /// The object as a `Value`, parsed from its text.
    pub fn value(&self) -> Value {
        serde_json::from_str(self.json.get()).unwrap_or_else(|e| {
            // The text was written by `new` from a `Value`, so it parses; kept total anyway.
            tracing::error!(error = %e, "a stored object does not parse");
            Value::Null
        })
    }

    /// The object's JSON text.
    pub fn json(&self) -> &str {
        self.json.get()
    }

    /// (namespace, name); the namespace is empty when cluster-scoped.
    pub fn key(&self) -> &Key {
        &self.key
    }

    pub fn name(&self) -> &str {
        &self.key.1
    }

    pub fn namespace(&self) -> &str {
        &self.key.0
    }

    /// `metadata.resourceVersion` as a number (0 when absent).
    pub fn rv(&self) -> u64 {
        self.rv
    }

    pub fn uid(&self) -> Option<&str> {
        self.uid.as_deref()
    }
}

/// Serializes as the object itself (its text, verbatim).
impl Serialize for Stored {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.json.serialize(s)
    }
}

impl std::fmt::Debug for Stored {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stored")
            .field("key", &self.key)
            .field("rv", &self.rv)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_object_comes_back_as_it_went_in_and_serializes_verbatim() {
        let obj = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "resourceVersion": "42", "uid": "u-1",
                         "labels": {"a": "b"}},
            "spec": {"nodeName": "n", "containers": [{"name": "c", "image": "i"}]},
        });
        let s = Stored::new(&obj);
        assert_eq!(s.value(), obj);
        assert_eq!(s.key(), &("ns".to_string(), "p".to_string()));
        assert_eq!(
            (s.name(), s.namespace(), s.rv(), s.uid()),
            ("p", "ns", 42, Some("u-1"))
        );
        // Inside another document it is the object, not a string holding it.
        let out: Value = serde_json::from_str(
            &serde_json::to_string(&json!({"items": [serde_json::to_value(&s).unwrap()]})).unwrap(),
        )
        .unwrap();
        assert_eq!(out["items"][0], obj);
        assert_eq!(serde_json::to_string(&s).unwrap(), s.json());
    }

    #[test]
    fn a_cluster_scoped_object_without_version_has_an_empty_namespace_and_version_0() {
        let s = Stored::new(&json!({"metadata": {"name": "n"}}));
        assert_eq!(
            (s.namespace(), s.name(), s.rv(), s.uid()),
            ("", "n", 0, None)
        );
    }
}
