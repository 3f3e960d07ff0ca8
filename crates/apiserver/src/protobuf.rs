//! Request bodies in Kubernetes' protobuf encoding (`application/vnd.kubernetes.protobuf`),
//! which kubectl's `create <generator>` commands (`create namespace`, `create secret`, ...)
//! and `create token` post, decoded into the JSON the rest of the server works on. Only the kinds those commands
//! make and this server serves are known: a body of another kind, or with a field not listed
//! here, is refused (415) rather than stored without it. Zero values are absent, as JSON's
//! `omitempty` leaves them out (Go's encoder writes them).

use base64::Engine;
use serde_json::{Map, Value, json};

/// The 4 bytes before every Kubernetes protobuf object.
const MAGIC: &[u8] = b"k8s\0";

#[derive(Clone, Copy)]
enum F {
    Str,
    Int,
    Bool,
    Msg(&'static [Field]),
    RepStr,
    RepMsg(&'static [Field]),
    MapStr,
    MapBytes,
}

type Field = (u64, &'static str, F);

const META: &[Field] = &[
    (1, "name", F::Str),
    (2, "generateName", F::Str),
    (3, "namespace", F::Str),
    (4, "selfLink", F::Str),
    (5, "uid", F::Str),
    (6, "resourceVersion", F::Str),
    (7, "generation", F::Int),
    // creationTimestamp (8) and deletionTimestamp (9) are the server's: empty from clients.
    (11, "labels", F::MapStr),
    (12, "annotations", F::MapStr),
    (14, "finalizers", F::RepStr),
];
const NAMESPACE: &[Field] = &[
    (1, "metadata", F::Msg(META)),
    (2, "spec", F::Msg(&[(1, "finalizers", F::RepStr)])),
    (3, "status", F::Msg(&[(1, "phase", F::Str)])),
];
const OBJECT_REF: &[Field] = &[
    (1, "kind", F::Str),
    (2, "namespace", F::Str),
    (3, "name", F::Str),
    (4, "uid", F::Str),
    (5, "apiVersion", F::Str),
    (6, "resourceVersion", F::Str),
    (7, "fieldPath", F::Str),
];
const SERVICE_ACCOUNT: &[Field] = &[
    (1, "metadata", F::Msg(META)),
    (2, "secrets", F::RepMsg(OBJECT_REF)),
    (3, "imagePullSecrets", F::RepMsg(&[(1, "name", F::Str)])),
    (4, "automountServiceAccountToken", F::Bool),
];
const SECRET: &[Field] = &[
    (1, "metadata", F::Msg(META)),
    (2, "data", F::MapBytes),
    (3, "type", F::Str),
    (4, "stringData", F::MapStr),
    (5, "immutable", F::Bool),
];
const CONFIG_MAP: &[Field] = &[
    (1, "metadata", F::Msg(META)),
    (2, "data", F::MapStr),
    (3, "binaryData", F::MapBytes),
    (4, "immutable", F::Bool),
];
const POLICY_RULE: &[Field] = &[
    (1, "verbs", F::RepStr),
    (2, "apiGroups", F::RepStr),
    (3, "resources", F::RepStr),
    (4, "resourceNames", F::RepStr),
    (5, "nonResourceURLs", F::RepStr),
];
const LABEL_SELECTOR: &[Field] = &[
    (1, "matchLabels", F::MapStr),
    (
        2,
        "matchExpressions",
        F::RepMsg(&[
            (1, "key", F::Str),
            (2, "operator", F::Str),
            (3, "values", F::RepStr),
        ]),
    ),
];
const ROLE: &[Field] = &[
    (1, "metadata", F::Msg(META)),
    (2, "rules", F::RepMsg(POLICY_RULE)),
];
const CLUSTER_ROLE: &[Field] = &[
    (1, "metadata", F::Msg(META)),
    (2, "rules", F::RepMsg(POLICY_RULE)),
    (
        3,
        "aggregationRule",
        F::Msg(&[(1, "clusterRoleSelectors", F::RepMsg(LABEL_SELECTOR))]),
    ),
];
const BINDING: &[Field] = &[
    (1, "metadata", F::Msg(META)),
    (
        2,
        "subjects",
        F::RepMsg(&[
            (1, "kind", F::Str),
            (2, "apiGroup", F::Str),
            (3, "name", F::Str),
            (4, "namespace", F::Str),
        ]),
    ),
    (
        3,
        "roleRef",
        F::Msg(&[
            (1, "apiGroup", F::Str),
            (2, "kind", F::Str),
            (3, "name", F::Str),
        ]),
    ),
];

/// What `kubectl create token` (and the kubelet) post to `serviceaccounts/NAME/token`.
const TOKEN_REQUEST: &[Field] = &[
    (1, "metadata", F::Msg(META)),
    (
        2,
        "spec",
        F::Msg(&[
            (1, "audiences", F::RepStr),
            (
                3,
                "boundObjectRef",
                F::Msg(&[
                    (1, "kind", F::Str),
                    (2, "apiVersion", F::Str),
                    (3, "name", F::Str),
                    (4, "uid", F::Str),
                ]),
            ),
            (4, "expirationSeconds", F::Int),
        ]),
    ),
];

fn schema(api_version: &str, kind: &str) -> Option<&'static [Field]> {
    Some(match (api_version, kind) {
        ("v1", "Namespace") => NAMESPACE,
        ("v1", "ServiceAccount") => SERVICE_ACCOUNT,
        ("v1", "Secret") => SECRET,
        ("v1", "ConfigMap") => CONFIG_MAP,
        ("authentication.k8s.io/v1", "TokenRequest") => TOKEN_REQUEST,
        ("rbac.authorization.k8s.io/v1", "Role") => ROLE,
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => CLUSTER_ROLE,
        ("rbac.authorization.k8s.io/v1", "RoleBinding" | "ClusterRoleBinding") => BINDING,
        _ => return None,
    })
}

/// One protobuf field: its number and its value (a varint, or length-delimited bytes).
enum Wire<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
}

struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *self.buf.get(self.at).ok_or("truncated varint")?;
            self.at += 1;
            v |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err("varint too long".into())
    }

    fn next(&mut self) -> Result<Option<(u64, Wire<'a>)>, String> {
        if self.at >= self.buf.len() {
            return Ok(None);
        }
        let key = self.varint()?;
        let value = match key & 7 {
            0 => Wire::Varint(self.varint()?),
            2 => {
                let len = usize::try_from(self.varint()?).map_err(|_| "length overflow")?;
                let end = self
                    .at
                    .checked_add(len)
                    .filter(|e| *e <= self.buf.len())
                    .ok_or("truncated field")?;
                let bytes = &self.buf[self.at..end];
                self.at = end;
                Wire::Bytes(bytes)
            }
            w => return Err(format!("wire type {w} is not used by Kubernetes objects")),
        };
        Ok(Some((key >> 3, value)))
    }
}

fn fields(buf: &[u8]) -> Result<Vec<(u64, Wire<'_>)>, String> {
    let mut r = Reader { buf, at: 0 };
    let mut out = Vec::new();
    while let Some(f) = r.next()? {
        out.push(f);
    }
    Ok(out)
}

fn text(b: &[u8]) -> Result<String, String> {
    String::from_utf8(b.to_vec()).map_err(|_| "a string field is not UTF-8".to_string())
}

/// A map entry message: key (1) and value (2).
fn entry(b: &[u8], bytes: bool) -> Result<(String, Value), String> {
    let (mut k, mut v) = (String::new(), Value::String(String::new()));
    for (n, w) in fields(b)? {
        match (n, w) {
            (1, Wire::Bytes(x)) => k = text(x)?,
            (2, Wire::Bytes(x)) if bytes => {
                v = json!(base64::engine::general_purpose::STANDARD.encode(x))
            }
            (2, Wire::Bytes(x)) => v = json!(text(x)?),
            _ => return Err("malformed map entry".into()),
        }
    }
    Ok((k, v))
}

fn message(b: &[u8], schema: &[Field], at: &str) -> Result<Map<String, Value>, String> {
    let mut out = Map::new();
    for (n, w) in fields(b)? {
        let Some((_, name, f)) = schema.iter().find(|(num, _, _)| *num == n) else {
            // Go writes every field, zero or not: a zero one says nothing.
            let zero = match w {
                Wire::Varint(v) => v == 0,
                Wire::Bytes(x) => x.is_empty() || message_is_zero(x),
            };
            if zero {
                continue;
            }
            return Err(format!("field {n} of {at} is not supported"));
        };
        let here = format!("{at}.{name}");
        match (*f, w) {
            (F::Str, Wire::Bytes(x)) => {
                if !x.is_empty() {
                    out.insert((*name).into(), json!(text(x)?));
                }
            }
            (F::Int, Wire::Varint(v)) => {
                if v != 0 {
                    // int32/int64 fields: two's complement in 64 bits.
                    out.insert((*name).into(), json!(v as i64));
                }
            }
            (F::Bool, Wire::Varint(v)) => {
                out.insert((*name).into(), json!(v != 0));
            }
            (F::Msg(s), Wire::Bytes(x)) => {
                let m = message(x, s, &here)?;
                if !m.is_empty() {
                    out.insert((*name).into(), Value::Object(m));
                }
            }
            (F::RepStr, Wire::Bytes(x)) => push(&mut out, name, json!(text(x)?)),
            (F::RepMsg(s), Wire::Bytes(x)) => {
                push(&mut out, name, Value::Object(message(x, s, &here)?))
            }
            (F::MapStr | F::MapBytes, Wire::Bytes(x)) => {
                let (k, v) = entry(x, matches!(f, F::MapBytes))?;
                let map = out.entry(*name).or_insert_with(|| json!({}));
                if let Some(m) = map.as_object_mut() {
                    m.insert(k, v);
                }
            }
            _ => return Err(format!("{here} has the wrong wire type")),
        }
    }
    Ok(out)
}

fn push(out: &mut Map<String, Value>, name: &str, v: Value) {
    let list = out.entry(name).or_insert_with(|| json!([]));
    if let Some(a) = list.as_array_mut() {
        a.push(v);
    }
}

/// Whether `b` parses as a message whose every field is zero (an empty struct Go wrote).
fn message_is_zero(b: &[u8]) -> bool {
    fields(b).is_ok_and(|fs| {
        fs.iter().all(|(_, w)| match w {
            Wire::Varint(v) => *v == 0,
            Wire::Bytes(x) => x.is_empty() || message_is_zero(x),
        })
    })
}

/// Decodes a protobuf request body into the object's JSON; `Err` says what is not supported.
pub(crate) fn decode(body: &[u8]) -> Result<Value, String> {
    let rest = body
        .strip_prefix(MAGIC)
        .ok_or("the protobuf body does not start with the Kubernetes magic number")?;
    let (mut api_version, mut kind, mut raw) = (String::new(), String::new(), None);
    for (n, w) in fields(rest)? {
        match (n, w) {
            (1, Wire::Bytes(tm)) => {
                for (m, v) in fields(tm)? {
                    match (m, v) {
                        (1, Wire::Bytes(x)) => api_version = text(x)?,
                        (2, Wire::Bytes(x)) => kind = text(x)?,
                        _ => {}
                    }
                }
            }
            (2, Wire::Bytes(x)) => raw = Some(x),
            (3 | 4, Wire::Bytes([])) => {}
            (3 | 4, _) => return Err("encoded protobuf bodies are not supported".into()),
            _ => {}
        }
    }
    let s = schema(&api_version, &kind).ok_or_else(|| {
        format!(
            "protobuf bodies of {api_version} {kind} are not supported by apiserver-lite; send JSON"
        )
    })?;
    let mut obj = message(raw.unwrap_or_default(), s, &kind)?;
    obj.insert("apiVersion".into(), json!(api_version));
    obj.insert("kind".into(), json!(kind));
    Ok(Value::Object(obj))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn len_field(n: u64, b: &[u8]) -> Vec<u8> {
        let mut v = vec![((n << 3) | 2) as u8, b.len() as u8];
        v.extend_from_slice(b);
        v
    }

    /// What kubectl 1.32's `create secret generic s1 --from-literal=a=b` posts.
    #[test]
    fn decodes_what_kubectl_create_posts() {
        let meta = [
            len_field(1, b"s1"),
            len_field(2, b""),
            vec![7 << 3, 0],
            len_field(8, b""),
        ]
        .concat();
        let data = [len_field(1, b"a"), len_field(2, b"b")].concat();
        let secret = [len_field(1, &meta), len_field(2, &data), len_field(3, b"")].concat();
        let tm = [len_field(1, b"v1"), len_field(2, b"Secret")].concat();
        let body = [
            MAGIC.to_vec(),
            len_field(1, &tm),
            len_field(2, &secret),
            len_field(3, b""),
            len_field(4, b""),
        ]
        .concat();
        assert_eq!(
            decode(&body).unwrap(),
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s1"},
                "data": {"a": "Yg=="}})
        );
        let tm = [len_field(1, b"apps/v1"), len_field(2, b"Deployment")].concat();
        let other = [MAGIC.to_vec(), len_field(1, &tm)].concat();
        assert!(decode(&other).unwrap_err().contains("apps/v1 Deployment"));
        let unknown = [
            MAGIC.to_vec(),
            len_field(1, &[len_field(1, b"v1"), len_field(2, b"Secret")].concat()),
            len_field(2, &len_field(9, b"x")),
        ]
        .concat();
        assert_eq!(
            decode(&unknown).unwrap_err(),
            "field 9 of Secret is not supported"
        );
    }
}
