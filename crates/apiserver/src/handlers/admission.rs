//! Mutating admission that kube-apiserver enables by default and that clients rely on:
//! DefaultStorageClass, which gives a new claim without `spec.storageClassName` the default
//! StorageClass (a claim that says `""` asked for no class and keeps it).

use serde_json::{Value, json};

use crate::resources::{self, ResourceDef};
use crate::server::App;

/// The annotations that mark a default class (GA and the beta one still honoured).
const DEFAULT_CLASS_ANNOTATIONS: [&str; 2] = [
    "storageclass.kubernetes.io/is-default-class",
    "storageclass.beta.kubernetes.io/is-default-class",
];

/// Runs the admission plugins that apply to a new object of `def`.
pub(super) fn on_create(app: &App, def: &ResourceDef, obj: &mut Value) {
    if def.group.is_empty() && def.plural == "persistentvolumeclaims" {
        default_storage_class(app, obj);
    }
}

fn default_storage_class(app: &App, claim: &mut Value) {
    if !claim["spec"]["storageClassName"].is_null() {
        return;
    }
    let Some(res) = resources::find("storage.k8s.io", "v1", "storageclasses") else {
        return;
    };
    let Ok((_, classes)) = app.store.list(res, None, None, None) else {
        return;
    };
    if let Some(name) = pick_default(classes.iter().map(|c| &**c)) {
        claim["spec"]["storageClassName"] = json!(name);
    }
}

/// The default class: marked by annotation; of several, the newest (then by name), as
/// Kubernetes chooses since 1.26.
fn pick_default<'a>(classes: impl Iterator<Item = &'a Value>) -> Option<String> {
    classes
        .filter(|c| {
            DEFAULT_CLASS_ANNOTATIONS
                .iter()
                .any(|a| c["metadata"]["annotations"][*a].as_str() == Some("true"))
        })
        .map(|c| {
            (
                c["metadata"]["creationTimestamp"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                c["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        // Newest first; among equals, the first name.
        .max_by(|a, b| a.0.cmp(&b.0).then_with(|| b.1.cmp(&a.1)))
        .map(|(_, name)| name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(name: &str, created: &str, annotation: Option<&str>) -> Value {
        let mut c = json!({"metadata": {"name": name, "creationTimestamp": created}});
        if let Some(a) = annotation {
            c["metadata"]["annotations"] = json!({a: "true"});
        }
        c
    }

    #[test]
    fn the_newest_marked_class_is_the_default() {
        let classes = [
            class(
                "old",
                "2026-01-01T00:00:00Z",
                Some(DEFAULT_CLASS_ANNOTATIONS[0]),
            ),
            class(
                "new",
                "2026-02-01T00:00:00Z",
                Some(DEFAULT_CLASS_ANNOTATIONS[1]),
            ),
            class("unmarked", "2026-03-01T00:00:00Z", None),
        ];
        assert_eq!(pick_default(classes.iter()).as_deref(), Some("new"));
        let tie = [
            class(
                "b",
                "2026-01-01T00:00:00Z",
                Some(DEFAULT_CLASS_ANNOTATIONS[0]),
            ),
            class(
                "a",
                "2026-01-01T00:00:00Z",
                Some(DEFAULT_CLASS_ANNOTATIONS[0]),
            ),
        ];
        assert_eq!(pick_default(tie.iter()).as_deref(), Some("a"));
        assert_eq!(pick_default(classes[2..].iter()), None);
    }
}
