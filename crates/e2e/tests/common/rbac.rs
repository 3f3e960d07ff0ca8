//! Least-privilege checks of the RBAC manifests in `deploy/kubernetes/rbac/`: the rules a
//! manifest grants, the calls a component made (the embedded API server's audit trail, by
//! User-Agent), and the comparison both ways: every call allowed, every rule used.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::Deserialize;

#[derive(Debug, Deserialize)]
struct Manifest {
    kind: String,
    metadata: Meta,
    #[serde(default)]
    rules: Vec<Rule>,
}

#[derive(Debug, Deserialize)]
struct Meta {
    #[serde(default)]
    namespace: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Rule {
    api_groups: Vec<String>,
    resources: Vec<String>,
    verbs: Vec<String>,
}

/// One grant or call: (namespace, or None for cluster-wide; group; resource[/subresource];
/// verb).
pub type Grant = (Option<String>, String, String, String);

/// `deploy/kubernetes/rbac/<relative>` in this checkout.
pub fn manifest_path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/kubernetes/rbac")
        .join(relative)
}

/// Every (namespace, group, resource, verb) the ClusterRoles and Roles of `path` grant.
pub fn grants(path: &Path) -> BTreeSet<Grant> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut out = BTreeSet::new();
    for doc in text.split("\n---") {
        if doc
            .lines()
            .all(|l| l.trim().is_empty() || l.trim_start().starts_with('#'))
        {
            continue;
        }
        let m: Manifest = serde_saphyr::from_str(doc).unwrap();
        let ns = match m.kind.as_str() {
            "ClusterRole" => None,
            "Role" => Some(m.metadata.namespace.clone().unwrap()),
            _ => continue,
        };
        for r in &m.rules {
            for g in &r.api_groups {
                for res in &r.resources {
                    for v in &r.verbs {
                        out.insert((ns.clone(), g.clone(), res.clone(), v.clone()));
                    }
                }
            }
        }
    }
    out
}

/// The grant that allows `call`: a cluster-wide one, else one in the call's namespace.
pub fn allowed(grants: &BTreeSet<Grant>, call: &Grant) -> Option<Grant> {
    let (ns, g, r, v) = call;
    let cluster = (None, g.clone(), r.clone(), v.clone());
    if grants.contains(&cluster) {
        return Some(cluster);
    }
    let local = (ns.clone(), g.clone(), r.clone(), v.clone());
    (ns.is_some() && grants.contains(&local)).then_some(local)
}

/// What the requests whose User-Agent starts with `user_agent` called, as grants.
pub fn calls_of(server: &apiserver::RunningApiServer, user_agent: &str) -> BTreeSet<Grant> {
    server
        .audit()
        .into_iter()
        .filter(|r| r.user_agent.starts_with(user_agent))
        .map(|r| {
            let resource = match &r.subresource {
                Some(s) => format!("{}/{s}", r.resource),
                None => r.resource.to_string(),
            };
            (
                r.namespace.as_deref().map(str::to_string),
                r.group.to_string(),
                resource,
                r.verb.to_string(),
            )
        })
        .collect()
}

/// Asserts that the manifest `relative` allows every call in `used` and that every rule it
/// grants is used by some call, except the grants in `exempt` (rules a test cannot exercise,
/// each with the caller's comment saying why).
pub fn assert_least_privilege(relative: &str, used: &BTreeSet<Grant>, exempt: &[Grant]) {
    assert!(
        !used.is_empty(),
        "no request carried the component's User-Agent"
    );
    let granted = grants(&manifest_path(relative));
    let mut needed: BTreeSet<Grant> = BTreeSet::new();
    let denied: Vec<&Grant> = used
        .iter()
        .filter(|call| match allowed(&granted, call) {
            Some(g) => {
                needed.insert(g);
                false
            }
            None => true,
        })
        .collect();
    assert!(
        denied.is_empty(),
        "deploy/kubernetes/rbac/{relative} denies calls the component makes: {denied:#?}\n(all calls: {used:#?})"
    );
    for e in exempt {
        assert!(
            granted.contains(e),
            "exempted {e:?} is not granted by deploy/kubernetes/rbac/{relative}: drop the exemption"
        );
        assert!(
            !needed.contains(e),
            "exempted {e:?} was used after all: drop the exemption"
        );
        needed.insert(e.clone());
    }
    let unused: Vec<&Grant> = granted.difference(&needed).collect();
    assert!(
        unused.is_empty(),
        "deploy/kubernetes/rbac/{relative} grants what the component never called: {unused:#?}\n(all calls: {used:#?})"
    );
}
