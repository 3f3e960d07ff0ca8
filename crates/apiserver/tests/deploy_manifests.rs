//! The manifests in `deploy/` are valid Kubernetes objects that fit together: every document
//! parses and names its kind, all of them are created through a real kube client (discovery +
//! DynamicObject) and read back unchanged, bindings refer to roles and service accounts the
//! manifests define, the Deployment's containers share the CSI socket, and kubectl creates them.
// Test code (helpers included): a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::core::GroupVersionKind;
use kube::discovery::{Discovery, Scope};
use serde_json::Value;
use tokio::process::Command;

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            yaml_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            out.push(p);
        }
    }
}

/// One Kubernetes object from a manifest, with where it came from.
struct Doc {
    origin: String,
    obj: Value,
}

impl Doc {
    fn kind(&self) -> &str {
        self.obj["kind"].as_str().unwrap_or("")
    }
    fn name(&self) -> &str {
        self.obj["metadata"]["name"].as_str().unwrap_or("")
    }
    fn namespace(&self) -> Option<&str> {
        self.obj["metadata"]["namespace"].as_str()
    }
}

/// Every document of every `deploy/**/*.yaml`, each checked for apiVersion, kind and name.
fn load() -> Vec<Doc> {
    let mut files = Vec::new();
    yaml_files(&deploy_dir(), &mut files);
    assert!(!files.is_empty(), "no manifests under deploy/");
    let mut docs = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let values: Vec<Value> = serde_saphyr::from_multiple(&text)
            .unwrap_or_else(|e| panic!("{}: not valid YAML: {e}", f.display()));
        let values: Vec<Value> = values.into_iter().filter(|v| !v.is_null()).collect();
        assert!(!values.is_empty(), "{}: no documents", f.display());
        for (i, obj) in values.into_iter().enumerate() {
            let origin = format!("{} document {}", f.display(), i + 1);
            for field in ["apiVersion", "kind"] {
                assert!(
                    obj[field].as_str().is_some_and(|s| !s.is_empty()),
                    "{origin}: no {field}"
                );
            }
            assert!(
                obj["metadata"]["name"]
                    .as_str()
                    .is_some_and(|s| !s.is_empty()),
                "{origin}: no metadata.name"
            );
            docs.push(Doc { origin, obj });
        }
    }
    docs
}

fn gvk(obj: &Value) -> GroupVersionKind {
    let api_version = obj["apiVersion"].as_str().unwrap();
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    GroupVersionKind::gvk(group, version, obj["kind"].as_str().unwrap())
}

/// Whether everything `want` says is in `got` (the server adds defaults and metadata).
fn subset(want: &Value, got: &Value, path: &str) -> Result<(), String> {
    match (want, got) {
        (Value::Object(w), Value::Object(g)) => {
            for (k, v) in w {
                let here = format!("{path}.{k}");
                match g.get(k) {
                    Some(gv) => subset(v, gv, &here)?,
                    None if v.is_null() => {}
                    None => return Err(format!("{here} is missing")),
                }
            }
            Ok(())
        }
        (Value::Array(w), Value::Array(g)) if w.len() == g.len() => w
            .iter()
            .zip(g)
            .enumerate()
            .try_for_each(|(i, (a, b))| subset(a, b, &format!("{path}[{i}]"))),
        (w, g) if w == g => Ok(()),
        (w, g) => Err(format!("{path}: wrote {w}, read back {g}")),
    }
}

#[tokio::test]
async fn manifests_create_through_kube_and_read_back() {
    let docs = load();
    let server = common::start().await;
    let client = server.client();
    let discovery = Discovery::new(client.clone()).run().await.unwrap();
    for doc in &docs {
        let (ar, caps) = discovery
            .resolve_gvk(&gvk(&doc.obj))
            .unwrap_or_else(|| panic!("{}: the server does not serve {}", doc.origin, doc.kind()));
        let api: Api<DynamicObject> = if caps.scope == Scope::Namespaced {
            let ns = doc.namespace().unwrap_or_else(|| {
                panic!("{}: a namespaced object names no namespace", doc.origin)
            });
            Api::namespaced_with(client.clone(), ns, &ar)
        } else {
            assert!(
                doc.namespace().is_none(),
                "{}: a cluster-scoped object names a namespace",
                doc.origin
            );
            Api::all_with(client.clone(), &ar)
        };
        let obj: DynamicObject = serde_json::from_value(doc.obj.clone()).unwrap();
        api.create(&PostParams::default(), &obj)
            .await
            .unwrap_or_else(|e| panic!("{}: create {} failed: {e}", doc.origin, doc.name()));
        let back = api.get(doc.name()).await.unwrap();
        let back = serde_json::to_value(&back).unwrap();
        if let Err(diff) = subset(&doc.obj, &back, "") {
            panic!("{}: read back differs: {diff}", doc.origin);
        }
    }
    // Everything is stored once: listing each kind finds what the manifests define.
    let mut per_kind: BTreeMap<String, usize> = BTreeMap::new();
    for doc in &docs {
        *per_kind.entry(doc.kind().to_string()).or_default() += 1;
    }
    for doc in &docs {
        let (ar, _) = discovery.resolve_gvk(&gvk(&doc.obj)).unwrap();
        let all: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
        let n = all.list(&ListParams::default()).await.unwrap().items.len();
        assert_eq!(n, per_kind[doc.kind()], "{} objects stored", doc.kind());
    }
    assert!(per_kind.contains_key("Deployment") && per_kind.contains_key("CSIDriver"));
}

#[test]
fn bindings_refer_to_what_the_manifests_define() {
    let docs = load();
    let defined = |kind: &str, ns: Option<&str>, name: &str| {
        docs.iter()
            .any(|d| d.kind() == kind && d.name() == name && d.namespace() == ns)
    };
    let mut bindings = 0;
    for doc in docs
        .iter()
        .filter(|d| d.kind() == "RoleBinding" || d.kind() == "ClusterRoleBinding")
    {
        bindings += 1;
        let role_ref = &doc.obj["roleRef"];
        assert_eq!(
            role_ref["apiGroup"], "rbac.authorization.k8s.io",
            "{}",
            doc.origin
        );
        let role = role_ref["name"].as_str().unwrap_or("");
        match role_ref["kind"].as_str() {
            Some("Role") => {
                assert_eq!(doc.kind(), "RoleBinding", "{}", doc.origin);
                assert!(
                    defined("Role", doc.namespace(), role),
                    "{}: Role {role} is not defined in namespace {:?}",
                    doc.origin,
                    doc.namespace()
                );
            }
            Some("ClusterRole") => assert!(
                defined("ClusterRole", None, role),
                "{}: ClusterRole {role} is not defined",
                doc.origin
            ),
            other => panic!("{}: roleRef.kind {other:?}", doc.origin),
        }
        let subjects = doc.obj["subjects"].as_array().cloned().unwrap_or_default();
        assert!(!subjects.is_empty(), "{}: no subjects", doc.origin);
        for s in subjects {
            assert_eq!(s["kind"], "ServiceAccount", "{}", doc.origin);
            let ns = s["namespace"].as_str().or(doc.namespace());
            let name = s["name"].as_str().unwrap_or("");
            assert!(
                defined("ServiceAccount", ns, name),
                "{}: ServiceAccount {ns:?}/{name} is not defined",
                doc.origin
            );
        }
    }
    assert!(bindings >= 2, "a ClusterRoleBinding and a RoleBinding");

    // Least privilege: no wildcards, and every workload runs as a ServiceAccount defined here.
    for doc in docs
        .iter()
        .filter(|d| d.kind() == "Role" || d.kind() == "ClusterRole")
    {
        for rule in doc.obj["rules"].as_array().unwrap() {
            for field in ["apiGroups", "resources", "verbs"] {
                let values = rule[field].as_array().unwrap();
                assert!(
                    values.iter().all(|v| v != "*"),
                    "{}: wildcard in {field}",
                    doc.origin
                );
            }
        }
    }
    for doc in docs.iter().filter(|d| d.kind() == "Deployment") {
        let sa = doc.obj["spec"]["template"]["spec"]["serviceAccountName"]
            .as_str()
            .unwrap_or("default");
        assert!(
            defined("ServiceAccount", doc.namespace(), sa),
            "{}: runs as ServiceAccount {sa}, which is not defined",
            doc.origin
        );
        // Leader election's Lease lives in the Deployment's namespace: the Role must be there.
        assert!(
            docs.iter()
                .any(|d| d.kind() == "Role" && d.namespace() == doc.namespace()),
            "{}: no Role for leases in its namespace",
            doc.origin
        );
    }
}

/// `$(VAR)` in a container argument, expanded from the container's plain `env` values as the
/// kubelet does.
fn expand(arg: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = arg.to_string();
    for (k, v) in env {
        out = out.replace(&format!("$({k})"), v);
    }
    out
}

fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .find_map(|a| a.strip_prefix(&format!("{name}=")))
}

#[test]
fn the_deployment_shares_the_csi_socket() {
    let docs = load();
    let deployment = docs
        .iter()
        .find(|d| d.kind() == "Deployment")
        .expect("a Deployment in deploy/");
    let pod = &deployment.obj["spec"]["template"]["spec"];
    let empty_dirs: BTreeSet<&str> = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["emptyDir"].is_object())
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    let containers = pod["containers"].as_array().unwrap();
    assert!(containers.len() >= 2, "the attacher and the driver");
    // The socket volume: an emptyDir every container mounts.
    let mounts_of = |c: &Value| -> BTreeMap<String, String> {
        c["volumeMounts"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|m| {
                (
                    m["name"].as_str().unwrap().to_string(),
                    m["mountPath"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    let socket_volume = empty_dirs
        .iter()
        .find(|v| containers.iter().all(|c| mounts_of(c).contains_key(**v)))
        .unwrap_or_else(|| panic!("no emptyDir is mounted by every container: {empty_dirs:?}"));
    let mut saw_attacher = false;
    for c in containers {
        let name = c["name"].as_str().unwrap();
        let mount = mounts_of(c)[*socket_volume].clone();
        let env: BTreeMap<String, String> = c["env"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .filter_map(|e| Some((e["name"].as_str()?.into(), e["value"].as_str()?.into())))
            .collect();
        let args: Vec<String> = c["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| expand(a.as_str().unwrap(), &env))
            .collect();
        // What is left unexpanded comes from the downward API or a secret: defined, too.
        let env_names: BTreeSet<&str> = c["env"]
            .as_array()
            .map(|a| a.iter().filter_map(|e| e["name"].as_str()).collect())
            .unwrap_or_default();
        for a in &args {
            for var in a.split("$(").skip(1) {
                let var = var.split(')').next().unwrap_or("");
                assert!(
                    env_names.contains(var),
                    "{name}: argument {a} refers to the undefined variable {var}"
                );
            }
        }
        // The attacher dials --csi-address, the driver listens on --endpoint: both in the mount.
        let Some(address) = flag(&args, "--csi-address").or(flag(&args, "--endpoint")) else {
            panic!("{name}: neither --csi-address nor --endpoint");
        };
        let path = address.strip_prefix("unix://").unwrap_or(address);
        assert!(
            Path::new(path).starts_with(&mount) && path.len() > mount.trim_end_matches('/').len(),
            "{name}: socket {path} is not inside the shared mount {mount}"
        );
        if flag(&args, "--csi-address").is_some() {
            saw_attacher = true;
            assert!(args.iter().any(|a| a == "--leader-election"), "{args:?}");
            let ns_env = c["env"]
                .as_array()
                .unwrap()
                .iter()
                .find(|e| e["name"] == "NAMESPACE")
                .expect("NAMESPACE from the downward API");
            assert_eq!(
                ns_env["valueFrom"]["fieldRef"]["fieldPath"],
                "metadata.namespace"
            );
            assert_eq!(
                c["livenessProbe"]["httpGet"]["path"],
                "/healthz/leader-election"
            );
        }
    }
    assert!(saw_attacher, "a container with --csi-address");
}

fn kubectl_path() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("kubectl"))
        .find(|p| p.is_file())
}

async fn kubectl(bin: &Path, dir: &Path, args: &[&str]) -> String {
    let mut cmd = Command::new(bin);
    cmd.env("KUBECONFIG", dir.join("kubeconfig"))
        .arg("--cache-dir")
        .arg(dir.join("cache"))
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .unwrap_or_else(|_| panic!("kubectl {args:?} finished within 60s"))
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "kubectl {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[tokio::test]
async fn kubectl_creates_the_attacher_manifests() {
    let Some(bin) = kubectl_path() else {
        test_support::skip_or_fail("kubectl is not on PATH (scripts/setup installs it)");
        return;
    };
    let docs = load();
    let server = common::start().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("kubeconfig"), server.kubeconfig_yaml()).unwrap();
    let manifests = deploy_dir().join("attacher");
    let manifests = manifests.to_str().unwrap();
    let attacher_docs = docs
        .iter()
        .filter(|d| d.origin.contains("/attacher/"))
        .count();

    // A server-side dry run validates everything and stores nothing.
    let dry = kubectl(
        &bin,
        dir.path(),
        &["create", "--dry-run=server", "-f", manifests],
    )
    .await;
    assert_eq!(
        dry.lines()
            .filter(|l| l.ends_with("created (server dry run)"))
            .count(),
        attacher_docs,
        "{dry}"
    );
    let sas: Api<DynamicObject> = Api::namespaced_with(
        server.client(),
        "kube-system",
        &kube::discovery::ApiResource::erase::<k8s_openapi::api::core::v1::ServiceAccount>(&()),
    );
    assert!(
        sas.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );

    // Then for real, and kubectl finds them by short name.
    let created = kubectl(&bin, dir.path(), &["create", "-f", manifests]).await;
    assert_eq!(created.lines().count(), attacher_docs, "{created}");
    assert!(
        created.contains("deployment.apps/ebs-csi-controller created"),
        "{created}"
    );
    let got = kubectl(
        &bin,
        dir.path(),
        &[
            "get",
            "sa,deploy,role,rolebinding",
            "-n",
            "kube-system",
            "-o",
            "name",
        ],
    )
    .await;
    for want in [
        "serviceaccount/csi-attacher",
        "deployment.apps/ebs-csi-controller",
        "role.rbac.authorization.k8s.io/csi-attacher-leader-election",
        "rolebinding.rbac.authorization.k8s.io/csi-attacher-leader-election",
    ] {
        assert!(
            got.lines().any(|l| l == want),
            "{want} missing from:\n{got}"
        );
    }
    let table = kubectl(&bin, dir.path(), &["get", "deploy", "-n", "kube-system"]).await;
    assert!(
        table
            .lines()
            .next()
            .unwrap()
            .split_whitespace()
            .collect::<Vec<_>>()
            == ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"],
        "{table}"
    );
    assert!(
        table.contains("0/2"),
        "no controller runs: nothing is ready\n{table}"
    );
}
