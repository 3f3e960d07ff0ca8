//! apps/v1 Deployment, DaemonSet and StatefulSet rules: the selector must exist (Deployment,
//! StatefulSet), must not be
//! empty, must match the pod template's labels and is immutable; the template is a valid pod
//! spec with `restartPolicy: Always`. Field paths and messages as the real server words them.

use serde_json::{Value, json};

use super::{labels, names, pod_spec};
use crate::status::FieldError;

const OPERATORS: &[&str] = &["DoesNotExist", "Exists", "In", "NotIn"];
const DEPLOYMENT_STRATEGIES: &[&str] = &["Recreate", "RollingUpdate"];
const DAEMONSET_STRATEGIES: &[&str] = &["OnDelete", "RollingUpdate"];
const STATEFULSET_STRATEGIES: &[&str] = &["OnDelete", "RollingUpdate"];
const POD_MANAGEMENT_POLICIES: &[&str] = &["OrderedReady", "Parallel"];

fn at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    let mut cur = v;
    for p in path {
        cur = cur.get(*p)?;
    }
    if cur.is_null() { None } else { Some(cur) }
}

/// `metav1.LabelSelector` syntax (`ValidateLabelSelector`).
fn selector_syntax(sel: &Value, errs: &mut Vec<FieldError>) {
    if let Some(ml) = sel.get("matchLabels") {
        labels("spec.selector.matchLabels", ml, errs);
    }
    let exprs = sel
        .get("matchExpressions")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    for (i, e) in exprs.iter().enumerate() {
        let path = format!("spec.selector.matchExpressions[{i}]");
        let values = e
            .get("values")
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        match e.get("operator").and_then(Value::as_str).unwrap_or("") {
            "In" | "NotIn" if values == 0 => errs.push(FieldError::required(
                format!("{path}.values"),
                "must be specified when `operator` is 'In' or 'NotIn'",
            )),
            "Exists" | "DoesNotExist" if values > 0 => errs.push(FieldError::forbidden(
                format!("{path}.values"),
                "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
            )),
            op if OPERATORS.contains(&op) => {}
            op => errs.push(FieldError::invalid(
                format!("{path}.operator"),
                json!(op),
                "not a valid selector operator",
            )),
        }
        let key = e.get("key").and_then(Value::as_str).unwrap_or("");
        for p in names::qualified_name(key) {
            errs.push(FieldError::invalid(format!("{path}.key"), json!(key), p));
        }
    }
}

/// Whether `labels` satisfy `sel` (`LabelSelectorAsSelector(sel).Matches(labels)`); a missing
/// selector matches nothing, an empty one everything.
pub(crate) fn selector_matches(sel: Option<&Value>, labels: Option<&Value>) -> bool {
    let Some(sel) = sel else {
        return false;
    };
    let label = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
    let match_labels = sel
        .get("matchLabels")
        .and_then(Value::as_object)
        .into_iter()
        .flatten();
    for (k, v) in match_labels {
        if label(k) != v.as_str() {
            return false;
        }
    }
    let exprs = sel
        .get("matchExpressions")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    exprs.iter().all(|e| {
        let key = e.get("key").and_then(Value::as_str).unwrap_or("");
        let values: Vec<&str> = e
            .get("values")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let have = label(key);
        match e.get("operator").and_then(Value::as_str).unwrap_or("") {
            "In" => have.is_some_and(|v| values.contains(&v)),
            "NotIn" => have.is_none_or(|v| !values.contains(&v)),
            "Exists" => have.is_some(),
            "DoesNotExist" => have.is_none(),
            _ => false,
        }
    })
}

fn is_empty_selector(sel: &Value) -> bool {
    let n = |k: &str| match sel.get(k) {
        Some(Value::Object(m)) => m.len(),
        Some(Value::Array(a)) => a.len(),
        _ => 0,
    };
    n("matchLabels") + n("matchExpressions") == 0
}

/// What a Deployment and a DaemonSet share: selector vs template, the template's pod spec.
fn workload(obj: &Value, what: &str, errs: &mut Vec<FieldError>) {
    let sel = at(obj, &["spec", "selector"]);
    if let Some(sel) = sel {
        selector_syntax(sel, errs);
        if is_empty_selector(sel) {
            errs.push(FieldError::invalid(
                "spec.selector",
                sel.clone(),
                format!("empty selector is invalid for {what}"),
            ));
        }
    }
    let template_labels = at(obj, &["spec", "template", "metadata", "labels"]);
    // An empty selector selects everything, so only a missing or non-empty one can mismatch.
    if !sel.is_some_and(is_empty_selector) && !selector_matches(sel, template_labels) {
        errs.push(FieldError::invalid(
            "spec.template.metadata.labels",
            template_labels.cloned().unwrap_or(Value::Null),
            "`selector` does not match template `labels`",
        ));
    }
    if let Some(l) = template_labels {
        labels("spec.template.metadata.labels", l, errs);
    }
    let mut spec = at(obj, &["spec", "template", "spec"])
        .cloned()
        .unwrap_or(json!({}));
    // A StatefulSet's containers mount its volumeClaimTemplates by name (the controller adds
    // those volumes to each pod), as kube-apiserver accepts.
    if let Some(templates) = at(obj, &["spec", "volumeClaimTemplates"]).and_then(Value::as_array)
        && let Some(spec) = spec.as_object_mut()
    {
        let volumes = spec.entry("volumes").or_insert_with(|| json!([]));
        if let Some(volumes) = volumes.as_array_mut() {
            for name in templates
                .iter()
                .filter_map(|t| at(t, &["metadata", "name"]))
            {
                volumes.push(json!({"name": name, "persistentVolumeClaim": {"claimName": name}}));
            }
        }
    }
    pod_spec::validate("spec.template.spec", &spec, errs);
    let restart = spec.get("restartPolicy").and_then(Value::as_str);
    if restart.is_some_and(|r| r != "Always") {
        errs.push(FieldError::not_supported(
            "spec.template.spec.restartPolicy",
            json!(restart),
            &["Always"],
        ));
    }
    for field in ["minReadySeconds", "revisionHistoryLimit"] {
        nonnegative(obj, field, errs);
    }
}

fn nonnegative(obj: &Value, field: &str, errs: &mut Vec<FieldError>) {
    if let Some(n) = at(obj, &["spec", field]).and_then(Value::as_i64) {
        if n < 0 {
            errs.push(FieldError::invalid(
                format!("spec.{field}"),
                json!(n),
                "must be greater than or equal to 0",
            ));
        }
    }
}

fn strategy_type(
    field: &str,
    v: Option<&Value>,
    allowed: &'static [&'static str],
    errs: &mut Vec<FieldError>,
) {
    if let Some(t) = v {
        if !t.as_str().is_some_and(|t| allowed.contains(&t)) {
            errs.push(FieldError::not_supported(field, t.clone(), allowed));
        }
    }
}

pub(super) fn deployment(obj: &Value, errs: &mut Vec<FieldError>) {
    nonnegative(obj, "replicas", errs);
    if at(obj, &["spec", "selector"]).is_none() {
        errs.push(FieldError::required("spec.selector", ""));
    }
    workload(obj, "deployment", errs);
    strategy_type(
        "spec.strategy.type",
        at(obj, &["spec", "strategy", "type"]),
        DEPLOYMENT_STRATEGIES,
        errs,
    );
    if at(obj, &["spec", "strategy", "type"]).and_then(Value::as_str) == Some("Recreate")
        && at(obj, &["spec", "strategy", "rollingUpdate"]).is_some()
    {
        errs.push(FieldError::forbidden(
            "spec.strategy.rollingUpdate",
            "may not be specified when strategy `type` is 'Recreate'",
        ));
    }
}

pub(super) fn daemonset(obj: &Value, errs: &mut Vec<FieldError>) {
    workload(obj, "daemonset", errs);
    strategy_type(
        "spec.updateStrategy.type",
        at(obj, &["spec", "updateStrategy", "type"]),
        DAEMONSET_STRATEGIES,
        errs,
    );
}

pub(super) fn statefulset(obj: &Value, errs: &mut Vec<FieldError>) {
    nonnegative(obj, "replicas", errs);
    if at(obj, &["spec", "selector"]).is_none() {
        errs.push(FieldError::required("spec.selector", ""));
    }
    workload(obj, "statefulset", errs);
    strategy_type(
        "spec.updateStrategy.type",
        at(obj, &["spec", "updateStrategy", "type"]),
        STATEFULSET_STRATEGIES,
        errs,
    );
    strategy_type(
        "spec.podManagementPolicy",
        at(obj, &["spec", "podManagementPolicy"]),
        POD_MANAGEMENT_POLICIES,
        errs,
    );
}

/// apps/v1 selectors are immutable.
pub(super) fn update(old: &Value, new: &Value, errs: &mut Vec<FieldError>) {
    let (o, n) = (
        at(old, &["spec", "selector"]),
        at(new, &["spec", "selector"]),
    );
    if o != n {
        errs.push(FieldError::invalid(
            "spec.selector",
            n.cloned().unwrap_or(Value::Null),
            "field is immutable",
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deploy(selector: Value, labels: Value) -> Value {
        json!({"spec": {"selector": selector, "template": {"metadata": {"labels": labels},
            "spec": {"restartPolicy": "Always", "containers": [{"name": "c", "image": "x:1"}]}}}})
    }

    fn messages(obj: &Value, f: fn(&Value, &mut Vec<FieldError>)) -> Vec<String> {
        let mut errs = Vec::new();
        f(obj, &mut errs);
        errs.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn selector_must_match_template_labels() {
        let ok = deploy(
            json!({"matchLabels": {"app": "a"}}),
            json!({"app": "a", "x": "y"}),
        );
        assert!(messages(&ok, deployment).is_empty());
        let bad = deploy(json!({"matchLabels": {"app": "a"}}), json!({"app": "b"}));
        assert_eq!(
            messages(&bad, deployment),
            vec![
                "spec.template.metadata.labels: Invalid value: {\"app\":\"b\"}: `selector` does not match template `labels`"
            ]
        );
        let mut none = ok.clone();
        none["spec"].as_object_mut().unwrap().remove("selector");
        let got = messages(&none, deployment);
        assert_eq!(got[0], "spec.selector: Required value");
        assert!(got[1].starts_with("spec.template.metadata.labels: Invalid value"));
        let empty = deploy(json!({}), json!({"app": "a"}));
        assert_eq!(
            messages(&empty, daemonset),
            vec!["spec.selector: Invalid value: {}: empty selector is invalid for daemonset"]
        );
    }

    #[test]
    fn match_expressions() {
        let sel = json!({"matchExpressions": [
            {"key": "app", "operator": "In", "values": ["a", "b"]},
            {"key": "tier", "operator": "DoesNotExist"}]});
        assert!(selector_matches(Some(&sel), Some(&json!({"app": "b"}))));
        assert!(!selector_matches(
            Some(&sel),
            Some(&json!({"app": "b", "tier": "x"}))
        ));
        assert!(!selector_matches(Some(&sel), None));
        assert!(!selector_matches(None, Some(&json!({"app": "b"}))));
        let bad = deploy(
            json!({"matchExpressions": [{"key": "app", "operator": "In"}, {"key": "b", "operator": "Near"}]}),
            json!({"app": "a"}),
        );
        let got = messages(&bad, deployment);
        assert!(got.contains(&"spec.selector.matchExpressions[0].values: Required value: must be specified when `operator` is 'In' or 'NotIn'".to_string()), "{got:?}");
        assert!(got.contains(&"spec.selector.matchExpressions[1].operator: Invalid value: \"Near\": not a valid selector operator".to_string()), "{got:?}");
    }

    #[test]
    fn template_rules_and_immutable_selector() {
        let mut d = deploy(json!({"matchLabels": {"app": "a"}}), json!({"app": "a"}));
        d["spec"]["template"]["spec"]["restartPolicy"] = json!("Never");
        d["spec"]["replicas"] = json!(-1);
        assert_eq!(
            messages(&d, deployment),
            vec![
                "spec.replicas: Invalid value: -1: must be greater than or equal to 0",
                "spec.template.spec.restartPolicy: Unsupported value: \"Never\": supported values: \"Always\"",
            ]
        );
        let old = deploy(json!({"matchLabels": {"app": "a"}}), json!({"app": "a"}));
        let new = deploy(json!({"matchLabels": {"app": "b"}}), json!({"app": "b"}));
        let mut errs = Vec::new();
        update(&old, &new, &mut errs);
        assert_eq!(
            errs[0].to_string(),
            "spec.selector: Invalid value: {\"matchLabels\":{\"app\":\"b\"}}: field is immutable"
        );
    }

    #[test]
    fn statefulset_rules() {
        let mut s = deploy(json!({"matchLabels": {"app": "a"}}), json!({"app": "b"}));
        s["spec"]["podManagementPolicy"] = json!("Sometimes");
        s["spec"]["updateStrategy"] = json!({"type": "Recreate"});
        assert_eq!(
            messages(&s, statefulset),
            vec![
                "spec.template.metadata.labels: Invalid value: {\"app\":\"b\"}: `selector` does not match template `labels`",
                "spec.updateStrategy.type: Unsupported value: \"Recreate\": supported values: \"OnDelete\", \"RollingUpdate\"",
                "spec.podManagementPolicy: Unsupported value: \"Sometimes\": supported values: \"OrderedReady\", \"Parallel\"",
            ]
        );
        let mut none = deploy(json!({"matchLabels": {"app": "a"}}), json!({"app": "a"}));
        none["spec"].as_object_mut().unwrap().remove("selector");
        assert!(
            messages(&none, statefulset)
                .iter()
                .any(|m| m.starts_with("spec.selector: Required value")),
            "{:?}",
            messages(&none, statefulset)
        );
        // Containers mount the claim templates by name; other names are still refused.
        let mut claims = deploy(json!({"matchLabels": {"app": "a"}}), json!({"app": "a"}));
        claims["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] =
            json!([{"name": "data", "mountPath": "/data"}]);
        claims["spec"]["volumeClaimTemplates"] = json!([{"metadata": {"name": "data"}}]);
        assert_eq!(messages(&claims, statefulset), Vec::<String>::new());
        claims["spec"]["volumeClaimTemplates"] = json!([{"metadata": {"name": "other"}}]);
        assert!(
            messages(&claims, statefulset)
                .iter()
                .any(|m| m.contains("volumeMounts[0].name: Not found: \"data\"")),
            "{:?}",
            messages(&claims, statefulset)
        );
    }
}
