//! Reading Kubernetes objects for `csi-translate`: YAML or JSON, one object, a multi-document
//! YAML stream, or a `List` (what `kubectl get pv,sc -o yaml` prints). JSON is read by the YAML
//! parser too, so both go through one path.
//!
//! Errors name the document (and list item) and, for a field of the wrong type, its JSON path.

use std::io::Read;

use k8s_openapi::api::core::v1::{PersistentVolume, Pod, Volume};
use k8s_openapi::api::storage::v1::StorageClass;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::{Error, Result};

/// One object read from the input, with a label for messages.
#[derive(Debug, Clone)]
pub(crate) struct Document {
    /// e.g. `document 2 (PersistentVolume "pv-a")` or `document 1, item 3 (StorageClass "gp2")`.
    pub label: String,
    /// `kind`, empty when the object has none.
    pub kind: String,
    /// `metadata.name` (for a bare Volume: `name`), empty when absent.
    pub name: String,
    /// The object as JSON.
    pub value: Value,
}

impl Document {
    /// The object as a typed value, or an error naming this document and the field.
    pub fn typed<T: DeserializeOwned>(&self) -> Result<T> {
        serde_path_to_error::deserialize(&self.value).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            Error::Input {
                document: self.label.clone(),
                message: if path == "." {
                    inner.to_string()
                } else {
                    format!("field {path}: {inner}")
                },
            }
        })
    }

    /// An error about this document.
    pub fn error(&self, message: impl Into<String>) -> Error {
        Error::Input {
            document: self.label.clone(),
            message: message.into(),
        }
    }

    pub fn pv(&self) -> Result<PersistentVolume> {
        self.expect_kind(&["PersistentVolume"])?;
        self.typed()
    }

    pub fn storage_class(&self) -> Result<StorageClass> {
        self.expect_kind(&["StorageClass"])?;
        self.typed()
    }

    pub fn pod(&self) -> Result<Pod> {
        self.expect_kind(&["Pod"])?;
        self.typed()
    }

    pub fn volume(&self) -> Result<Volume> {
        self.expect_kind(&[])?;
        self.typed()
    }

    /// A missing kind is accepted as "the kind the command expects".
    fn expect_kind(&self, kinds: &[&str]) -> Result<()> {
        if self.kind.is_empty() || kinds.contains(&self.kind.as_str()) {
            return Ok(());
        }
        let wanted = if kinds.is_empty() {
            "a bare Volume (no kind)".to_string()
        } else {
            kinds.join(" or ")
        };
        Err(self.error(format!("kind is {:?}, expected {wanted}", self.kind)))
    }
}

/// The text of `path`, or of standard input for `-`.
pub(crate) fn read_source(path: &str) -> Result<String> {
    let io = |error| Error::Io {
        path: path.to_string(),
        error,
    };
    if path == "-" {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s).map_err(io)?;
        Ok(s)
    } else {
        std::fs::read_to_string(path).map_err(io)
    }
}

/// Every object in `text`; `List`s are flattened, empty documents skipped.
pub(crate) fn parse_documents(text: &str, origin: &str) -> Result<Vec<Document>> {
    let values: Vec<Value> = serde_saphyr::from_multiple(text).map_err(|e| Error::Input {
        document: origin.to_string(),
        message: format!("not valid YAML or JSON: {e}"),
    })?;
    let mut docs = Vec::new();
    for (i, value) in values.into_iter().enumerate() {
        let where_ = if text.trim_start().starts_with('{') || text.trim_start().starts_with('[') {
            origin.to_string()
        } else {
            format!("{origin} document {}", i + 1)
        };
        match value {
            Value::Null => {}
            Value::Object(_) if is_list(&value) => {
                let items = value
                    .get("items")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                for (j, item) in items.into_iter().enumerate() {
                    docs.push(document(format!("{where_}, item {}", j + 1), item)?);
                }
            }
            Value::Array(items) => {
                for (j, item) in items.into_iter().enumerate() {
                    docs.push(document(format!("{where_}, item {}", j + 1), item)?);
                }
            }
            other => docs.push(document(where_, other)?),
        }
    }
    Ok(docs)
}

fn is_list(v: &Value) -> bool {
    let kind = v.get("kind").and_then(Value::as_str).unwrap_or("");
    (kind == "List" || kind.ends_with("List")) && v.get("items").is_some_and(Value::is_array)
}

fn document(where_: String, value: Value) -> Result<Document> {
    if !value.is_object() {
        return Err(Error::Input {
            document: where_,
            message: format!(
                "expected a Kubernetes object (a mapping), got {}",
                type_name(&value)
            ),
        });
    }
    let kind = match value.get("kind") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(k)) => k.clone(),
        Some(other) => {
            return Err(Error::Input {
                document: where_,
                message: format!("field kind: expected a string, got {}", type_name(other)),
            });
        }
    };
    let name = value
        .pointer("/metadata/name")
        .or_else(|| value.get("name"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let label = match (kind.is_empty(), name.is_empty()) {
        (false, false) => format!("{where_} ({kind} {name:?})"),
        (false, true) => format!("{where_} ({kind})"),
        (true, false) => format!("{where_} ({name:?})"),
        (true, true) => where_,
    };
    Ok(Document {
        label,
        kind,
        name,
        value,
    })
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multi_document_yaml_and_lists_are_flattened() {
        let text = "---\nkind: PersistentVolume\nmetadata: {name: a}\n---\napiVersion: v1\nkind: List\nitems:\n- kind: StorageClass\n  metadata: {name: b}\n  provisioner: x\n- kind: PersistentVolume\n  metadata: {name: c}\n";
        let docs = parse_documents(text, "in.yaml").unwrap();
        let labels: Vec<&str> = docs.iter().map(|d| d.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "in.yaml document 1 (PersistentVolume \"a\")",
                "in.yaml document 2, item 1 (StorageClass \"b\")",
                "in.yaml document 2, item 2 (PersistentVolume \"c\")",
            ]
        );
        // An empty document in a stream is no object.
        let docs = parse_documents("---\n---\nkind: StorageClass\n---\n", "e").unwrap();
        assert_eq!(docs.len(), 1);
    }

    #[test]
    fn json_is_read_too() {
        let docs = parse_documents(r#"{"kind":"StorageClass","metadata":{"name":"gp2"},"provisioner":"kubernetes.io/aws-ebs"}"#, "-").unwrap();
        assert_eq!(docs.len(), 1);
        assert_eq!(
            docs[0].storage_class().unwrap().provisioner,
            "kubernetes.io/aws-ebs"
        );
    }

    #[test]
    fn a_field_of_the_wrong_type_is_named() {
        let text = "kind: PersistentVolume\nmetadata: {name: bad}\nspec:\n  awsElasticBlockStore:\n    volumeID: vol-1\n    partition: first\n";
        let docs = parse_documents(text, "f.yaml").unwrap();
        let err = docs[0].pv().unwrap_err().to_string();
        assert!(
            err.contains("f.yaml document 1 (PersistentVolume \"bad\")"),
            "{err}"
        );
        assert!(err.contains("spec.awsElasticBlockStore.partition"), "{err}");
    }

    #[test]
    fn wrong_kind_and_broken_yaml_are_errors() {
        let docs = parse_documents("kind: Service\nmetadata: {name: s}\n", "f").unwrap();
        let err = docs[0].pv().unwrap_err().to_string();
        assert!(
            err.contains("kind is \"Service\", expected PersistentVolume"),
            "{err}"
        );
        let err = parse_documents("a: [1, 2\n", "g.yaml")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("g.yaml: not valid YAML or JSON"), "{err}");
        let err = parse_documents("- 1\n- 2\n", "h").unwrap_err().to_string();
        assert!(
            err.contains("h document 1, item 1: expected a Kubernetes object"),
            "{err}"
        );
    }
}
