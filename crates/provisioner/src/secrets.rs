//! StorageClass secret parameters and their templates, as the Go sidecar documents them:
//!
//! | secret | namespace may use | name may use |
//! |---|---|---|
//! | provisioner | `${pv.name}`, `${pvc.namespace}` | `${pv.name}`, `${pvc.namespace}`, `${pvc.name}` |
//! | the others | `${pv.name}`, `${pvc.namespace}` | those, plus `${pvc.annotations['KEY']}` |
//!
//! The provisioner secret cannot use annotations: it is needed again to delete the volume,
//! long after the claim (and whatever its creator wrote into it) is gone.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, SecretReference};

use crate::Error;

/// Every `csi.storage.k8s.io/` parameter is the sidecar's, never the driver's.
pub const PARAMETER_PREFIX: &str = "csi.storage.k8s.io/";

/// The secrets a StorageClass may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecretKind {
    Provisioner,
    ControllerPublish,
    NodeStage,
    NodePublish,
    ControllerExpand,
    NodeExpand,
}

impl SecretKind {
    /// All kinds, provisioner first.
    pub const ALL: [SecretKind; 6] = [
        SecretKind::Provisioner,
        SecretKind::ControllerPublish,
        SecretKind::NodeStage,
        SecretKind::NodePublish,
        SecretKind::ControllerExpand,
        SecretKind::NodeExpand,
    ];

    fn stem(self) -> &'static str {
        match self {
            SecretKind::Provisioner => "provisioner",
            SecretKind::ControllerPublish => "controller-publish",
            SecretKind::NodeStage => "node-stage",
            SecretKind::NodePublish => "node-publish",
            SecretKind::ControllerExpand => "controller-expand",
            SecretKind::NodeExpand => "node-expand",
        }
    }

    /// `csi.storage.k8s.io/<stem>-secret-name`.
    pub fn name_key(self) -> String {
        format!("{PARAMETER_PREFIX}{}-secret-name", self.stem())
    }

    /// `csi.storage.k8s.io/<stem>-secret-namespace`.
    pub fn namespace_key(self) -> String {
        format!("{PARAMETER_PREFIX}{}-secret-namespace", self.stem())
    }

    fn name_may_use_annotations(self) -> bool {
        self != SecretKind::Provisioner
    }
}

/// The secret `kind` that `params` name for a volume `pv_name` of `pvc`, templates resolved;
/// `None` when the class names none. Name without namespace (or the reverse) is an error.
pub fn secret_ref(
    kind: SecretKind,
    params: &BTreeMap<String, String>,
    pv_name: &str,
    pvc: &PersistentVolumeClaim,
) -> Result<Option<SecretReference>, Error> {
    let name_key = kind.name_key();
    let namespace_key = kind.namespace_key();
    let (name_tpl, ns_tpl) = match (params.get(&name_key), params.get(&namespace_key)) {
        (None, None) => return Ok(None),
        (Some(n), Some(ns)) => (n, ns),
        _ => {
            return Err(Error::Secret(format!(
                "failed to get secret reference for {}: {name_key} and {namespace_key} must both be set or both be absent",
                kind.stem()
            )));
        }
    };
    let pvc_namespace = pvc.metadata.namespace.clone().unwrap_or_default();
    let mut ns_tokens = BTreeMap::from([
        ("pv.name".to_string(), pv_name.to_string()),
        ("pvc.namespace".to_string(), pvc_namespace.clone()),
    ]);
    let namespace = resolve(ns_tpl, &ns_tokens)
        .map_err(|bad| template_error(kind, &namespace_key, ns_tpl, &bad))?;
    ns_tokens.insert(
        "pvc.name".into(),
        pvc.metadata.name.clone().unwrap_or_default(),
    );
    if kind.name_may_use_annotations() {
        for (k, v) in pvc.metadata.annotations.iter().flatten() {
            ns_tokens.insert(format!("pvc.annotations['{k}']"), v.clone());
        }
    }
    let name = resolve(name_tpl, &ns_tokens)
        .map_err(|bad| template_error(kind, &name_key, name_tpl, &bad))?;
    if name.is_empty() || namespace.is_empty() {
        return Err(Error::Secret(format!(
            "failed to get secret reference for {}: {name_key} {name_tpl:?} and {namespace_key} {ns_tpl:?} resolve to an empty name or namespace",
            kind.stem()
        )));
    }
    Ok(Some(SecretReference {
        name: Some(name),
        namespace: Some(namespace),
    }))
}

fn template_error(kind: SecretKind, key: &str, template: &str, bad: &[String]) -> Error {
    Error::Secret(format!(
        "failed to get secret reference for {}: {key} {template:?}: invalid tokens: {bad:?} (allowed here: see docs/provisioner.md, \"Secrets\")",
        kind.stem()
    ))
}

/// Replaces every `${token}` from `tokens`; the tokens that are not there are the error.
fn resolve(template: &str, tokens: &BTreeMap<String, String>) -> Result<String, Vec<String>> {
    let mut out = String::new();
    let mut bad = Vec::new();
    let mut rest = template;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            bad.push(after.to_string());
            rest = "";
            break;
        };
        let token = &after[..end];
        match tokens.get(token) {
            Some(v) => out.push_str(v),
            None => bad.push(token.to_string()),
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    if bad.is_empty() { Ok(out) } else { Err(bad) }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pvc() -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some("data".into()),
                namespace: Some("team".into()),
                annotations: Some([("owner".to_string(), "alice".to_string())].into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn params(kind: SecretKind, name: &str, ns: &str) -> BTreeMap<String, String> {
        [
            (kind.name_key(), name.to_string()),
            (kind.namespace_key(), ns.to_string()),
        ]
        .into()
    }

    #[test]
    fn every_placeholder_resolves_where_allowed() {
        let k = SecretKind::NodePublish;
        let r = secret_ref(
            k,
            &params(
                k,
                "${pvc.name}-${pv.name}-${pvc.annotations['owner']}",
                "${pvc.namespace}",
            ),
            "pvc-1",
            &pvc(),
        )
        .unwrap()
        .unwrap();
        assert_eq!(r.name.as_deref(), Some("data-pvc-1-alice"));
        assert_eq!(r.namespace.as_deref(), Some("team"));
        let p = SecretKind::Provisioner;
        let r = secret_ref(
            p,
            &params(p, "${pvc.name}-${pvc.namespace}", "${pv.name}"),
            "pvc-1",
            &pvc(),
        )
        .unwrap()
        .unwrap();
        assert_eq!(r.name.as_deref(), Some("data-team"));
        assert_eq!(r.namespace.as_deref(), Some("pvc-1"));
        assert!(
            secret_ref(p, &BTreeMap::new(), "x", &pvc())
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn disallowed_placeholders_are_named() {
        let p = SecretKind::Provisioner;
        let e = secret_ref(
            p,
            &params(p, "${pvc.annotations['owner']}", "ns"),
            "pv",
            &pvc(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("pvc.annotations['owner']"), "{e}");
        let k = SecretKind::NodeStage;
        let e = secret_ref(k, &params(k, "s", "${pvc.name}"), "pv", &pvc()).unwrap_err();
        assert!(e.to_string().contains("\"pvc.name\""), "{e}");
        let e = secret_ref(k, &[(k.name_key(), "s".to_string())].into(), "pv", &pvc()).unwrap_err();
        assert!(e.to_string().contains("both"), "{e}");
    }
}
