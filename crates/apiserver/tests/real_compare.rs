//! The same objects created in apiserver-lite and in the real kube-apiserver v1.26 read back
//! the same: the defaults the real server fills in (and the fields it leaves out) are
//! apiserver-lite's too. Fields that differ on purpose are listed in `KNOWN`, each with why.
//! And kubectl prints the same for both: tables, errors, exit codes.
// Test code (helpers included): a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "common/manifests.rs"]
mod manifests;
#[path = "common/target.rs"]
mod target;

use std::collections::BTreeSet;

use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::discovery::{Discovery, Scope};
use serde_json::{Value, json};
use target::Target;

/// What each server gets, in order (the PVC's StorageClass and the pod's claim exist first).
fn objects() -> Vec<Value> {
    vec![
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
            "metadata": {"name": "ebs.csi.aws.com"}, "spec": {}}),
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": "ebs"}, "provisioner": "ebs.csi.aws.com"}),
        json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv-1"},
            "spec": {"capacity": {"storage": "4Gi"}, "accessModes": ["ReadWriteOnce"],
                "storageClassName": "ebs",
                "csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-0123"}}}),
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "claim-1", "namespace": "default"},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "ebs",
                "resources": {"requests": {"storage": "4Gi"}}}}),
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "default"},
            "spec": {"nodeName": "node-1", "containers": [{"name": "web", "image": "nginx:1.27",
                "ports": [{"name": "http", "containerPort": 80}],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "claim-1"}}]}}),
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
            "metadata": {"name": "csi-0123"},
            "spec": {"attacher": "ebs.csi.aws.com", "nodeName": "node-1",
                "source": {"persistentVolumeName": "pv-1"}}}),
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode", "metadata": {"name": "node-1"},
            "spec": {"drivers": [{"name": "ebs.csi.aws.com", "nodeID": "i-0123",
                "topologyKeys": ["topology.ebs.csi.aws.com/zone"]}]}}),
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "ebs-csi-aws-com", "namespace": "default"},
            "spec": {"holderIdentity": "a"}}),
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "csi", "namespace": "default"}}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "csi"},
            "rules": [{"apiGroups": [""], "resources": ["persistentvolumes"], "verbs": ["get"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "csi"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "csi"},
            "subjects": [{"kind": "ServiceAccount", "name": "csi", "namespace": "default"}]}),
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "controller", "namespace": "default"},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "c"}},
                "template": {"metadata": {"labels": {"app": "c"}},
                    "spec": {"serviceAccountName": "csi",
                        "containers": [{"name": "c", "image": "csi-rs/c:v0.1.0",
                            "args": ["--v=2"],
                            "livenessProbe": {"httpGet": {"path": "/healthz", "port": 9808}}}]}}}}),
        json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "node", "namespace": "default"},
            "spec": {"selector": {"matchLabels": {"app": "n"}},
                "template": {"metadata": {"labels": {"app": "n"}},
                    "spec": {"containers": [{"name": "n", "image": "csi-rs/n:v0.1.0",
                        "securityContext": {"privileged": true},
                        "volumeMounts": [{"name": "kubelet", "mountPath": "/var/lib/kubelet",
                            "mountPropagation": "Bidirectional"}]}],
                        "volumes": [{"name": "kubelet", "hostPath": {"path": "/var/lib/kubelet",
                            "type": "Directory"}}]}}}}),
        json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": "plugin", "namespace": "default"},
            "spec": {"serviceName": "plugin", "replicas": 1,
                "selector": {"matchLabels": {"app": "p"}},
                "template": {"metadata": {"labels": {"app": "p"}},
                    "spec": {"containers": [{"name": "p", "image": "csi-rs/p:v0.1.0"}]}}}}),
    ]
}

/// Differences that are there on purpose: (kind, field path, why).
const KNOWN: &[(&str, &str, &str)] = &[
    (
        "Pod",
        ".spec.volumes",
        "the ServiceAccount admission's kube-api-access-* token volume needs the TokenRequest \
         API and the kube-root-ca.crt ConfigMap that kcm publishes; apiserver-lite has neither",
    ),
    (
        "Pod",
        ".spec.containers[0].volumeMounts",
        "the mount of that token volume",
    ),
    (
        "CSIDriver",
        ".spec.seLinuxMount",
        "apiserver-lite serves v1.34, where SELinuxMountReadWriteOncePod (beta since 1.28) \
         defaults it to false; v1.26 drops the alpha field",
    ),
    (
        "StatefulSet",
        ".spec.persistentVolumeClaimRetentionPolicy",
        "apiserver-lite serves v1.34, where StatefulSetAutoDeletePVC (beta since 1.27) \
         defaults it to Retain/Retain; v1.26 drops the alpha field",
    ),
];

/// Merge patches applied after the creates, each read back too: (kind, name, patch).
fn patches() -> Vec<(&'static str, &'static str, Value)> {
    vec![
        (
            "DaemonSet",
            "node",
            json!({"spec": {"template": {"metadata": {"labels": {"v": "2"}}}}}),
        ),
        ("Deployment", "controller", json!({"spec": {"replicas": 3}})),
        (
            "StatefulSet",
            "plugin",
            json!({"metadata": {"labels": {"a": "b"}}}),
        ),
        ("Pod", "web", json!({"metadata": {"labels": {"a": "b"}}})),
        (
            "PersistentVolume",
            "pv-1",
            json!({"spec": {"capacity": {"storage": "8Gi"}}}),
        ),
        (
            "CSIDriver",
            "ebs.csi.aws.com",
            json!({"metadata": {"labels": {"a": "b"}}}),
        ),
    ]
}

/// Creates every object in `target`, then patches some, reading each back after each write.
async fn create_and_read(target: &Target) -> Vec<Value> {
    target.prepare_namespace("default").await;
    let client = target.client();
    let discovery = Discovery::new(client.clone()).run().await.unwrap();
    let mut back = Vec::new();
    for obj in objects() {
        let (ar, caps) = discovery
            .resolve_gvk(&manifests::gvk(&obj))
            .unwrap_or_else(|| panic!("{} does not serve {}", target.name(), obj["kind"]));
        let api: Api<DynamicObject> = if caps.scope == Scope::Namespaced {
            Api::namespaced_with(client.clone(), "default", &ar)
        } else {
            Api::all_with(client.clone(), &ar)
        };
        let dynamic: DynamicObject = serde_json::from_value(obj.clone()).unwrap();
        api.create(&PostParams::default(), &dynamic)
            .await
            .unwrap_or_else(|e| panic!("{} refused {}: {e}", target.name(), obj["kind"]));
        let name = obj["metadata"]["name"].as_str().unwrap();
        back.push(serde_json::to_value(api.get(name).await.unwrap()).unwrap());
    }
    for (kind, name, patch) in patches() {
        let obj = objects().into_iter().find(|o| o["kind"] == kind).unwrap();
        let (ar, caps) = discovery.resolve_gvk(&manifests::gvk(&obj)).unwrap();
        let api: Api<DynamicObject> = if caps.scope == Scope::Namespaced {
            Api::namespaced_with(client.clone(), "default", &ar)
        } else {
            Api::all_with(client.clone(), &ar)
        };
        let patched = api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap_or_else(|e| panic!("{} refused to patch {kind} {name}: {e}", target.name()));
        back.push(serde_json::to_value(patched).unwrap());
    }
    back
}

/// The fields each server sets its own way (identity, time, versions, bookkeeping).
fn strip(mut v: Value) -> Value {
    let meta = v["metadata"].as_object_mut().unwrap();
    for f in [
        "uid",
        "resourceVersion",
        "creationTimestamp",
        "managedFields",
    ] {
        meta.remove(f);
    }
    v
}

/// Paths (with both values) where `a` and `b` differ.
fn diff(a: &Value, b: &Value, path: &str, out: &mut Vec<(String, String)>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                diff(
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                    &format!("{path}.{k}"),
                    out,
                );
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                diff(p, q, &format!("{path}[{i}]"), out);
            }
        }
        (p, q) if p == q => {}
        (p, q) => out.push((path.to_string(), format!("lite {p}, real {q}"))),
    }
}

#[tokio::test]
async fn read_back_defaults_match_kube_apiserver() {
    let Some(real) = Target::real().await else {
        return;
    };
    let lite = Target::lite().await;
    let from_lite = create_and_read(&lite).await;
    let from_real = create_and_read(&real).await;
    let mut found: Vec<(String, String, String)> = Vec::new();
    for (l, r) in from_lite.into_iter().zip(from_real) {
        let kind = r["kind"].as_str().unwrap().to_string();
        let mut d = Vec::new();
        diff(&strip(l), &strip(r), "", &mut d);
        found.extend(d.into_iter().map(|(p, v)| (kind.clone(), p, v)));
    }
    let unexpected: Vec<String> = found
        .iter()
        .filter(|(k, p, _)| !KNOWN.iter().any(|(kk, kp, _)| kk == k && kp == p))
        .map(|(k, p, v)| format!("{k} {p}: {v}"))
        .collect();
    assert!(
        unexpected.is_empty(),
        "read-backs differ between apiserver-lite and kube-apiserver:\n{}",
        unexpected.join("\n")
    );
    // Every listed difference is still there (a fixed one leaves the list).
    for (kind, path, why) in KNOWN {
        assert!(
            found.iter().any(|(k, p, _)| k == kind && p == path),
            "{kind} {path} ({why}) no longer differs: remove it from KNOWN"
        );
    }
}

/// kubectl commands whose output (tables, errors) must be the same from both servers.
const COMMANDS: &[&[&str]] = &[
    &["get", "pv"],
    &["get", "pvc"],
    &["get", "pods", "-o", "wide"],
    &["get", "volumeattachments"],
    &["get", "csidrivers"],
    &["get", "csinodes"],
    &["get", "storageclasses"],
    &["get", "leases"],
    &["get", "serviceaccount", "csi"],
    &["get", "clusterrole", "csi"],
    &["get", "clusterrolebinding", "csi", "-o", "wide"],
    &["get", "deployments", "-o", "wide"],
    &["get", "daemonsets", "-o", "wide"],
    &["get", "statefulsets", "-o", "wide"],
    &["get", "pods", "-l", "a=b", "-o", "name"],
    &[
        "get",
        "pods",
        "--field-selector",
        "spec.nodeName=node-1",
        "-o",
        "name",
    ],
    &["get", "pods", "--field-selector", "spec.bogus=x"],
    &["get", "pods", "--field-selector", "spec.nodeName"],
    &["get", "pods", "-l", "a in (b"],
    &["get", "pv", "nope"],
    &["get", "pods", "nope"],
    &["delete", "pv", "nope"],
    &["get", "nopes"],
    &["get", "--raw", "/api/v1/namespaces/default/pods/nope"],
    &["get", "--raw", "/apis/storage.k8s.io/v1/csidrivers/nope"],
    &[
        "patch",
        "sc",
        "ebs",
        "--type=merge",
        "-p",
        r#"{"provisioner":"x.example.com"}"#,
    ],
    &[
        "patch",
        "pv",
        "pv-1",
        "--type=merge",
        "-p",
        r#"{"spec":{"accessModes":["Bogus"]}}"#,
    ],
    &[
        "patch",
        "csinode",
        "node-1",
        "--type=merge",
        "-p",
        r#"{"spec":{"drivers":null}}"#,
    ],
    &[
        "patch",
        "va",
        "csi-0123",
        "--type=merge",
        "-p",
        r#"{"spec":{"nodeName":"node-2"}}"#,
    ],
    &["label", "pv", "pv-1", "bad label=x"],
    &["create", "namespace", "Bad_Name"],
    &["create", "serviceaccount", "csi"],
    // kubectl's generators post protobuf; each object is read back as JSON.
    &["create", "namespace", "team-a"],
    &[
        "get",
        "namespace",
        "team-a",
        "-o",
        "jsonpath={.metadata.name} {.spec} {.status}",
    ],
    &["create", "serviceaccount", "builder", "-n", "team-a"],
    &[
        "get",
        "sa",
        "builder",
        "-n",
        "team-a",
        "-o",
        "jsonpath={.metadata.name} {.metadata.namespace}",
    ],
    &[
        "create",
        "secret",
        "generic",
        "s1",
        "--from-literal=a=b",
        "--type=example.com/t",
        "-n",
        "team-a",
    ],
    &[
        "get",
        "secret",
        "s1",
        "-n",
        "team-a",
        "-o",
        "jsonpath={.data} {.type}",
    ],
    &[
        "create",
        "configmap",
        "c1",
        "--from-literal=x=y",
        "-n",
        "team-a",
    ],
    &[
        "get",
        "configmap",
        "c1",
        "-n",
        "team-a",
        "-o",
        "jsonpath={.data}",
    ],
    &[
        "create",
        "clusterrole",
        "reader",
        "--verb=get,list",
        "--resource=pods,persistentvolumes",
    ],
    &["get", "clusterrole", "reader", "-o", "jsonpath={.rules}"],
    &[
        "create",
        "clusterrolebinding",
        "reader",
        "--clusterrole=reader",
        "--serviceaccount=team-a:builder",
        "--user=u",
        "--group=g",
    ],
    &[
        "get",
        "clusterrolebinding",
        "reader",
        "-o",
        "jsonpath={.subjects} {.roleRef}",
    ],
    &[
        "create",
        "role",
        "r",
        "--verb=get",
        "--resource=leases.coordination.k8s.io",
        "--resource-name=l",
        "-n",
        "team-a",
    ],
    &[
        "get",
        "role",
        "r",
        "-n",
        "team-a",
        "-o",
        "jsonpath={.rules}",
    ],
    &[
        "create",
        "rolebinding",
        "r",
        "--role=r",
        "--user=u",
        "-n",
        "team-a",
    ],
    &[
        "get",
        "rolebinding",
        "r",
        "-n",
        "team-a",
        "-o",
        "jsonpath={.subjects} {.roleRef}",
    ],
    &["create", "secret", "generic", "Bad", "--from-literal=a=b"],
    &["create", "deployment", "d", "--image=x:1", "-n", "team-a"],
    &["delete", "pod", "web", "--grace-period=0", "--force"],
    &["get", "pods"],
];

/// Commands whose output differs on purpose (or not fixed yet): (the command's arguments
/// joined by spaces, why). Each must still differ.
const KNOWN_OUTPUT: &[(&str, &str)] = &[
    (
        r#"patch pv pv-1 --type=merge -p {"spec":{"accessModes":["Bogus"]}}"#,
        "the supported access modes: apiserver-lite serves v1.34, where ReadWriteOncePod is GA; \
         v1.26 (alpha, off) does not list it",
    ),
    (
        "create deployment d --image=x:1 -n team-a",
        "kubectl posts the Deployment as protobuf; apiserver-lite decodes the protobuf of the \
         kinds without a pod template only (namespaces, service accounts, secrets, config \
         maps, RBAC) and answers 415 naming the kind",
    ),
];

/// One token of a kubectl line, with what differs by the clock (ages, timestamps) masked.
fn mask(token: &str) -> String {
    let age = !token.is_empty()
        && token.chars().next().is_some_and(|c| c.is_ascii_digit())
        && token
            .chars()
            .all(|c| c.is_ascii_digit() || "smhd".contains(c))
        && token.chars().last().is_some_and(|c| "smhd".contains(c));
    let time = token.len() >= 20 && token.as_bytes()[4] == b'-' && token.contains('T');
    if age {
        "<age>".into()
    } else if time {
        "<time>".into()
    } else {
        token.to_string()
    }
}

/// Each command's exit status, stdout and stderr, whitespace collapsed and clocks masked.
async fn kubectl_outputs(target: &Target, bin: &std::path::Path) -> Vec<String> {
    create_and_read(target).await;
    let dir = tempfile::tempdir().unwrap();
    target.write_kubeconfig(&dir.path().join("kubeconfig"));
    let mut out = Vec::new();
    for args in COMMANDS {
        let o = tokio::process::Command::new(bin)
            .env("KUBECONFIG", dir.path().join("kubeconfig"))
            .arg("--cache-dir")
            .arg(dir.path().join("cache"))
            .args(*args)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output()
            .await
            .unwrap();
        let text = |b: &[u8]| {
            String::from_utf8_lossy(b)
                .lines()
                .map(|l| l.split_whitespace().map(mask).collect::<Vec<_>>().join(" "))
                .collect::<Vec<_>>()
                .join("\n")
        };
        out.push(format!(
            "$ kubectl {}\nexit {}\n{}\n{}",
            args.join(" "),
            o.status.code().unwrap_or(-1),
            text(&o.stdout),
            text(&o.stderr)
        ));
    }
    out
}

#[tokio::test]
async fn kubectl_prints_the_same_as_kube_apiserver() {
    let Some(bin) = manifests::kubectl_or_skip() else {
        return;
    };
    let Some(real) = Target::real().await else {
        return;
    };
    let lite = Target::lite().await;
    let from_lite = kubectl_outputs(&lite, &bin).await;
    let from_real = kubectl_outputs(&real, &bin).await;
    let known = |args: &[&str]| KNOWN_OUTPUT.iter().any(|(k, _)| *k == args.join(" "));
    let differ: Vec<String> = COMMANDS
        .iter()
        .zip(from_lite.iter().zip(&from_real))
        .filter(|(args, (l, r))| l != r && !known(args))
        .map(|(_, (l, r))| format!("apiserver-lite:\n{l}\nkube-apiserver:\n{r}\n"))
        .collect();
    for (args, why) in KNOWN_OUTPUT {
        let i = COMMANDS
            .iter()
            .position(|c| c.join(" ") == *args)
            .unwrap_or_else(|| panic!("KNOWN_OUTPUT names no command: {args}"));
        assert_ne!(
            from_lite[i], from_real[i],
            "kubectl {args} ({why}) no longer differs: remove it from KNOWN_OUTPUT"
        );
    }
    assert!(
        differ.is_empty(),
        "{} of {} kubectl commands print differently:\n{}",
        differ.len(),
        COMMANDS.len(),
        differ.join("\n")
    );
}

/// Raw requests whose answer (status code; `reason` and `message` of a failure) must be the
/// same from both servers: (label, method, path, content type, body).
type Request = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    Option<Value>,
);

fn requests() -> Vec<Request> {
    let spec = json!({"capacity": {"storage": "4Gi"}, "accessModes": ["ReadWriteOnce"],
        "csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-0123"}});
    let pv = |meta: Value| {
        json!({"apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": meta, "spec": spec.clone()})
    };
    let mut bad_quantity = pv(json!({"name": "pv-3"}));
    bad_quantity["spec"]["capacity"]["storage"] = json!("lots");
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "x:1"}]}});
    let json = "application/json";
    let merge = "application/merge-patch+json";
    let pvs = "/api/v1/persistentvolumes";
    vec![
        (
            "get missing",
            "GET",
            "/api/v1/namespaces/default/pods/nope",
            json,
            None,
        ),
        (
            "delete missing",
            "DELETE",
            "/api/v1/persistentvolumes/nope",
            json,
            None,
        ),
        (
            "unknown group",
            "GET",
            "/apis/foo.example.com/v1/things",
            json,
            None,
        ),
        (
            "list in a missing namespace",
            "GET",
            "/api/v1/namespaces/nope/pods",
            json,
            None,
        ),
        (
            "duplicate",
            "POST",
            pvs,
            json,
            Some(pv(json!({"name": "pv-1"}))),
        ),
        (
            "stale",
            "PUT",
            "/api/v1/persistentvolumes/pv-1",
            json,
            Some(pv(json!({"name": "pv-1", "resourceVersion": "1"}))),
        ),
        (
            "renamed",
            "PUT",
            "/api/v1/persistentvolumes/pv-1",
            json,
            Some(pv(json!({"name": "other"}))),
        ),
        (
            "create with resourceVersion",
            "POST",
            pvs,
            json,
            Some(pv(json!({"name": "pv-2", "resourceVersion": "5"}))),
        ),
        (
            "create with a bad quantity",
            "POST",
            pvs,
            json,
            Some(bad_quantity.clone()),
        ),
        (
            "update with a bad quantity",
            "PUT",
            "/api/v1/persistentvolumes/pv-3",
            json,
            Some(bad_quantity),
        ),
        (
            "pod in a missing namespace",
            "POST",
            "/api/v1/namespaces/nope/pods",
            json,
            Some(pod),
        ),
        (
            "not an object",
            "POST",
            pvs,
            json,
            Some(json!("not an object")),
        ),
        (
            "unknown patch type",
            "PATCH",
            "/api/v1/persistentvolumes/pv-1",
            "application/foo",
            Some(json!({})),
        ),
        (
            "patch with a bad quantity",
            "PATCH",
            "/api/v1/persistentvolumes/pv-1",
            merge,
            Some(json!({"spec": {"capacity": {"storage": "lots"}}})),
        ),
        (
            "json patch test fails",
            "PATCH",
            "/api/v1/persistentvolumes/pv-1",
            "application/json-patch+json",
            Some(json!([{"op": "test", "path": "/metadata/name", "value": "x"}])),
        ),
        (
            "immutable spec",
            "PATCH",
            "/apis/storage.k8s.io/v1/volumeattachments/csi-0123",
            merge,
            Some(json!({"spec": {"attacher": "other.example.com"}})),
        ),
        (
            "status subresource",
            "GET",
            "/api/v1/persistentvolumes/pv-1/status",
            json,
            None,
        ),
        (
            "unknown subresource",
            "GET",
            "/api/v1/persistentvolumes/pv-1/bogus",
            json,
            None,
        ),
    ]
}

/// Requests whose answers have the same code and reason but another message (or body), and
/// why: (label, why).
const KNOWN_MESSAGES: &[(&str, &str)] = &[
    (
        "unknown group",
        "kube-apiserver answers a group it does not serve with a plain-text `404 page not found`, \
         apiserver-lite with a NotFound Status; kubectl prints the same for both",
    ),
    (
        "not an object",
        "kube-apiserver quotes Go's JSON decoder error (Go type names, the body in hex)",
    ),
    (
        "patch with a bad quantity",
        "both name the patched object whole in the message; its uid, times and managedFields differ",
    ),
    (
        "immutable spec",
        "kube-apiserver prints the old spec as a Go struct with pointer addresses",
    ),
];

/// Each request's (label, code, reason, message).
async fn answers(target: &Target) -> Vec<(String, u16, Value, Value)> {
    create_and_read(target).await;
    let client = target.client();
    let mut out = Vec::new();
    for (label, method, path, ct, body) in requests() {
        let bytes = body
            .as_ref()
            .map(|b| serde_json::to_vec(b).unwrap())
            .unwrap_or_default();
        let req = http::Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", ct)
            .body(kube::client::Body::from(bytes))
            .unwrap();
        let resp = client.send(req).await.unwrap();
        let code = resp.status().as_u16();
        let data = http_body_util::BodyExt::collect(resp.into_body())
            .await
            .unwrap()
            .to_bytes();
        let v: Value = serde_json::from_slice(&data).unwrap_or(Value::Null);
        let (reason, message) = if code >= 400 {
            (v["reason"].clone(), v["message"].clone())
        } else {
            (Value::Null, Value::Null)
        };
        out.push((label.to_string(), code, reason, message));
    }
    out
}

#[tokio::test]
async fn api_errors_match_kube_apiserver() {
    let Some(real) = Target::real().await else {
        return;
    };
    let lite = Target::lite().await;
    let from_lite = answers(&lite).await;
    let from_real = answers(&real).await;
    let mut differ = Vec::new();
    for (l, r) in from_lite.iter().zip(&from_real) {
        let known = KNOWN_MESSAGES.iter().find(|(k, _)| *k == l.0);
        // The unknown group's 404 has no Status body on the real server: its code is compared.
        let same = match known {
            Some(("unknown group", _)) => l.1 == r.1,
            Some(_) => (l.1, &l.2) == (r.1, &r.2),
            None => l == r,
        };
        if !same {
            differ.push(format!("apiserver-lite: {l:?}\nkube-apiserver: {r:?}\n"));
        }
        if let Some((label, why)) = known {
            assert_ne!(
                l.3, r.3,
                "{label} ({why}) no longer differs: remove it from KNOWN_MESSAGES"
            );
        }
    }
    assert!(
        differ.is_empty(),
        "{} of {} requests answered differently:\n{}",
        differ.len(),
        from_lite.len(),
        differ.join("\n")
    );
    // The bad quantity's patch: the same words after the object.
    let suffix = |a: &(String, u16, Value, Value)| {
        a.3.as_str()
            .unwrap_or("")
            .rsplit(": ")
            .next()
            .unwrap_or("")
            .to_string()
    };
    let i = from_lite
        .iter()
        .position(|a| a.0 == "patch with a bad quantity")
        .unwrap();
    assert_eq!(suffix(&from_lite[i]), suffix(&from_real[i]));
}
