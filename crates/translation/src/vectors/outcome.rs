//! What calling an upstream function produced, as JSON: shared by the public functions' rows
//! and the rest of the cases. A leaf below both.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use serde_json::{Value, json};

use super::compare::{at_path, diff, strip_type_meta};

/// What a call produced: a value (the result, or for Go functions with several results the
/// non-error ones as a record) and/or an error text.
#[derive(Default)]
pub(super) struct Outcome {
    pub(super) value: Option<Value>,
    pub(super) error: Option<String>,
    /// Results by function name (and the other names upstream's tests give them), for rows
    /// whose `expected` is keyed that way.
    pub(super) named: BTreeMap<String, Value>,
    /// Names in `named` whose function failed (their value is Go's zero value).
    pub(super) errored: BTreeSet<String>,
}

impl Outcome {
    pub(super) fn ok(value: Value) -> Self {
        Self {
            value: Some(value),
            ..Self::default()
        }
    }
    pub(super) fn err(error: impl ToString) -> Self {
        Self {
            error: Some(error.to_string()),
            ..Self::default()
        }
    }
    pub(super) fn from<T: Serialize>(r: crate::Result<T>) -> Self {
        match r {
            Ok(v) => Self::ok(to_json(&v)),
            Err(e) => Self::err(e),
        }
    }
    /// A Go `(record..., error)` result: the record is there also on error.
    pub(super) fn record(value: Value, error: Option<crate::Error>) -> Self {
        Self {
            value: Some(value),
            error: error.map(|e| e.to_string()),
            ..Self::default()
        }
    }

    /// The result at `path`: a name in `named` (optionally followed by a dotted path into it),
    /// else a dotted path into the value.
    pub(super) fn lookup(&self, path: &str) -> &Value {
        static NULL: Value = Value::Null;
        if let Some(v) = self.named.get(path) {
            return v;
        }
        if let Some((head, rest)) = path.split_once('.') {
            if let Some(v) = self.named.get(head) {
                return at_path(v, rest);
            }
        }
        self.value.as_ref().map_or(&NULL, |v| at_path(v, path))
    }

    /// `expected` compared key by key with [`Self::lookup`]; a failed function's entry matches
    /// `null` and `""` (what Go returns with an error).
    pub(super) fn keyed_diff(&self, expected: &serde_json::Map<String, Value>) -> Vec<String> {
        let mut problems = Vec::new();
        for (path, want) in expected {
            if path == "error" {
                continue;
            }
            let head = path.split('.').next().unwrap_or("");
            if self.errored.contains(head) && (want.is_null() || want == &json!("")) {
                continue;
            }
            if let Some(d) = diff(want, self.lookup(path)) {
                problems.push(format!("{path}:\n{d}"));
            }
        }
        problems
    }

    /// Whole-result comparison: the value equals `expected`, or `expected` is an object of
    /// named results that all match.
    pub(super) fn full_diff(&self, expected: &Value) -> Option<String> {
        let value = self.value.clone().unwrap_or(Value::Null);
        let d = diff(expected, &value)?;
        if let Value::Object(fields) = expected {
            let all_named = !fields.is_empty()
                && fields.keys().all(|k| {
                    k == "error" || self.named.contains_key(k.split('.').next().unwrap_or(""))
                });
            if all_named {
                let problems = self.keyed_diff(fields);
                return (!problems.is_empty()).then(|| problems.join("\n"));
            }
        }
        Some(d)
    }
}

pub(super) fn to_json<T: Serialize>(v: &T) -> Value {
    strip_type_meta(serde_json::to_value(v).unwrap_or(Value::Null))
}
