//! Label and field selectors with the real server's syntax and errors.

use serde_json::Value;

use crate::http_util::path_str;
use crate::resources::ResourceDef;

#[derive(Debug, Clone, PartialEq)]
enum LabelReq {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
    Gt(String, i64),
    Lt(String, i64),
}

/// A parsed `labelSelector`; every requirement must hold.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct LabelSelector(Vec<LabelReq>);

/// Splits on commas that are not inside `( )`.
fn split_top(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' => {
                depth += 1;
                cur.push(c);
            }
            ')' => {
                depth -= 1;
                cur.push(c);
            }
            ',' if depth == 0 => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    out.push(cur);
    out
}

/// The `( v1, v2 )` after `in`/`notin`; errors name the token found as the real lexer does.
fn parse_set(rest: &str) -> Result<Vec<String>, String> {
    let rest = rest.trim();
    let Some(open) = rest.strip_prefix('(') else {
        let token: String = rest
            .chars()
            .take_while(|c| !c.is_whitespace() && *c != ',' && *c != ')')
            .collect();
        return Err(format!(
            "unable to parse requirement: found '{token}', expected: '('"
        ));
    };
    let inner = open
        .strip_suffix(')')
        .ok_or_else(|| "unable to parse requirement: found '', expected: ',' or ')'".to_string())?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(Self(reqs));
        }
        for part in split_top(s) {
            let p = part.trim();
            if p.is_empty() {
                return Err(format!(
                    "unable to parse requirement: empty requirement in '{s}'"
                ));
            }
            let req = if let Some(key) = p.strip_prefix('!') {
                LabelReq::NotExists(check_key(key.trim())?)
            } else if let Some((k, v)) = p.split_once("!=") {
                LabelReq::NotEq(check_key(k.trim())?, v.trim().to_string())
            } else if let Some((k, v)) = p.split_once("==") {
                LabelReq::Eq(check_key(k.trim())?, v.trim().to_string())
            } else if let Some((k, v)) = p.split_once('=') {
                LabelReq::Eq(check_key(k.trim())?, v.trim().to_string())
            } else if let Some(idx) = p.find(" notin ") {
                LabelReq::NotIn(check_key(p[..idx].trim())?, parse_set(&p[idx + 7..])?)
            } else if let Some(idx) = p.find(" in ") {
                LabelReq::In(check_key(p[..idx].trim())?, parse_set(&p[idx + 4..])?)
            } else if let Some((k, v)) = p.split_once('>') {
                LabelReq::Gt(check_key(k.trim())?, parse_int(v, p)?)
            } else if let Some((k, v)) = p.split_once('<') {
                LabelReq::Lt(check_key(k.trim())?, parse_int(v, p)?)
            } else {
                LabelReq::Exists(check_key(p)?)
            };
            reqs.push(req);
        }
        Ok(Self(reqs))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.get("metadata").and_then(|m| m.get("labels"));
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            LabelReq::Eq(k, v) => get(k) == Some(v.as_str()),
            LabelReq::NotEq(k, v) => get(k) != Some(v.as_str()),
            LabelReq::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelReq::NotIn(k, vs) => get(k).is_none_or(|x| !vs.iter().any(|v| v == x)),
            LabelReq::Exists(k) => get(k).is_some(),
            LabelReq::NotExists(k) => get(k).is_none(),
            LabelReq::Gt(k, n) => get(k)
                .and_then(|x| x.parse::<i64>().ok())
                .is_some_and(|x| x > *n),
            LabelReq::Lt(k, n) => get(k)
                .and_then(|x| x.parse::<i64>().ok())
                .is_some_and(|x| x < *n),
        })
    }
}

fn parse_int(v: &str, whole: &str) -> Result<i64, String> {
    v.trim()
        .parse()
        .map_err(|_| format!("unable to parse requirement: for 'Gt', 'Lt' operators, the value must be an integer: '{whole}'"))
}

fn check_key(k: &str) -> Result<String, String> {
    let ok = !k.is_empty()
        && k.len() <= 317
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c));
    if ok {
        Ok(k.to_string())
    } else {
        Err(format!(
            "unable to parse requirement: invalid label key \"{k}\""
        ))
    }
}

/// A parsed `fieldSelector` over the labels the resource supports.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct FieldSelector(Vec<(String, bool, String)>);

impl FieldSelector {
    pub fn parse(s: &str, def: &ResourceDef) -> Result<Self, String> {
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(Self(reqs));
        }
        for part in s.split(',') {
            let p = part.trim();
            let (k, eq, v) = if let Some((k, v)) = p.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = p.split_once("==") {
                (k, true, v)
            } else if let Some((k, v)) = p.split_once('=') {
                (k, true, v)
            } else {
                return Err(format!("invalid selector: '{s}'; can't understand '{p}'"));
            };
            let k = k.trim();
            let supported =
                k == "metadata.name" || k == "metadata.namespace" || def.field_labels.contains(&k);
            if !supported {
                return Err(format!("field label not supported: {k}"));
            }
            reqs.push((k.to_string(), eq, v.trim().to_string()));
        }
        Ok(Self(reqs))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The name this selector pins (`metadata.name=x`), which lets a list skip a scan.
    pub fn pinned_name(&self) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, eq, _)| *eq && k == "metadata.name")
            .map(|(_, _, v)| v.as_str())
    }

    /// Decided by the name and namespace alone: `Some(false)` when a requirement on them fails,
    /// `Some(true)` when they are all it asks about, `None` when the object must be looked at.
    fn by_key(&self, namespace: &str, name: &str) -> Option<bool> {
        let mut rest = false;
        for (k, eq, v) in &self.0 {
            let actual = match k.as_str() {
                "metadata.name" => name,
                "metadata.namespace" => namespace,
                _ => {
                    rest = true;
                    continue;
                }
            };
            if (actual == v) != *eq {
                return Some(false);
            }
        }
        (!rest).then_some(true)
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(k, eq, v)| {
            // `source` on core events means `source.component`, as the real server maps it.
            let actual = if k == "source" {
                path_str(obj, "source.component")
            } else {
                path_str(obj, k)
            };
            (actual == *v) == *eq
        })
    }
}

/// Both selectors of a list or watch.
#[derive(Debug, Clone, Default)]
pub(crate) struct Selectors {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl Selectors {
    /// True when nothing is selected against: every object matches.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }

    /// [`FieldSelector::by_key`] for both selectors: `None` when the object must be parsed
    /// to decide (a label or a field past its name and namespace).
    pub fn by_key(&self, namespace: &str, name: &str) -> Option<bool> {
        match self.fields.by_key(namespace, name) {
            Some(false) => Some(false),
            Some(true) if self.labels.is_empty() => Some(true),
            _ => None,
        }
    }

    pub fn matches(&self, obj: &Value) -> bool {
        (self.labels.is_empty() || self.labels.matches(obj))
            && (self.fields.is_empty() || self.fields.matches(obj))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "a", "namespace": "ns", "labels": labels}, "spec": {"nodeName": "n1"}})
    }

    #[test]
    fn label_selector_operators() {
        let o = obj(json!({"app": "web", "tier": "front", "n": "5"}));
        let t = |s: &str| LabelSelector::parse(s).unwrap().matches(&o);
        assert!(t("app=web"));
        assert!(t("app==web,tier=front"));
        assert!(!t("app!=web"));
        assert!(t("app in (web, db)"));
        assert!(!t("app notin (web,db)"));
        assert!(t("tier"));
        assert!(!t("!tier"));
        assert!(t("!missing"));
        assert!(t("n>3"));
        assert!(!t("n<3"));
        assert!(t("app in (web,db),tier in (front)"));
        assert!(t(""));
        assert!(LabelSelector::parse("a b c").is_err());
        // kube-apiserver v1.26's words for an unopened and an unclosed set.
        assert_eq!(
            LabelSelector::parse("x in web").unwrap_err(),
            "unable to parse requirement: found 'web', expected: '('"
        );
        assert_eq!(
            LabelSelector::parse("a in (b").unwrap_err(),
            "unable to parse requirement: found '', expected: ',' or ')'"
        );
    }

    #[test]
    fn field_selector_checks_supported_fields() {
        let pods = resources::get(resources::find("", "v1", "pods").unwrap());
        let o = obj(json!({}));
        let f = FieldSelector::parse("spec.nodeName=n1,metadata.namespace=ns", pods).unwrap();
        assert!(f.matches(&o));
        let f = FieldSelector::parse("spec.nodeName!=n1", pods).unwrap();
        assert!(!f.matches(&o));
        assert_eq!(
            FieldSelector::parse("metadata.name=a", pods)
                .unwrap()
                .pinned_name(),
            Some("a")
        );
        let err = FieldSelector::parse("spec.foo=x", pods).unwrap_err();
        assert!(err.contains("field label not supported: spec.foo"), "{err}");
        let pvs = resources::get(resources::find("", "v1", "persistentvolumes").unwrap());
        assert!(FieldSelector::parse("spec.nodeName=x", pvs).is_err());
    }

    #[test]
    fn a_selector_on_name_and_namespace_only_is_decided_without_the_object() {
        let pods = resources::get(resources::find("", "v1", "pods").unwrap());
        let sel = |fields: &str, labels: &str| Selectors {
            labels: LabelSelector::parse(labels).unwrap(),
            fields: FieldSelector::parse(fields, pods).unwrap(),
        };
        assert_eq!(sel("", "").by_key("ns", "a"), Some(true));
        assert_eq!(sel("metadata.name=a", "").by_key("ns", "a"), Some(true));
        assert_eq!(sel("metadata.name=a", "").by_key("ns", "b"), Some(false));
        assert_eq!(sel("metadata.name!=a", "").by_key("ns", "a"), Some(false));
        assert_eq!(
            sel("metadata.namespace=ns,metadata.name=a", "").by_key("ns", "a"),
            Some(true)
        );
        assert_eq!(
            sel("metadata.namespace=other", "").by_key("ns", "a"),
            Some(false)
        );
        // Anything past the key needs the object, unless the key already rules it out.
        assert_eq!(sel("spec.nodeName=n1", "").by_key("ns", "a"), None);
        assert_eq!(sel("metadata.name=a", "app=web").by_key("ns", "a"), None);
        assert_eq!(
            sel("metadata.name=b", "app=web").by_key("ns", "a"),
            Some(false)
        );
        // Where it decides, it decides as the full match does.
        let o = obj(json!({"app": "web"}));
        for (f, l) in [
            ("metadata.name=a", ""),
            ("metadata.name=b", ""),
            ("metadata.name=b", "app=web"),
        ] {
            let s = sel(f, l);
            if let Some(d) = s.by_key("ns", "a") {
                assert_eq!(d, s.matches(&o), "{f} {l}");
            }
        }
    }
}
