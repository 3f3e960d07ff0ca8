//! The Kustomize manifests in `deploy/kubernetes` render into valid Kubernetes objects that fit
//! together: `kubectl kustomize` renders each overlay; the objects are created through a real
//! kube client (discovery + DynamicObject) and read back unchanged; `kubectl apply` creates them
//! and a second apply changes nothing; bindings refer to roles and service accounts of the same
//! render; sidecars dial the socket their driver serves; the registrar registers the socket's
//! host path; kubelet paths are mounted with Bidirectional propagation; every argument is a
//! flag its binary accepts (asked from the binaries themselves); probes hit served ports; the
//! CSIDrivers and StorageClasses say what their drivers need.
// Test code (helpers included): a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "common/manifests.rs"]
mod manifests;
#[path = "common/target.rs"]
mod target;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::discovery::{Discovery, Scope};
use manifests::{
    Doc, OVERLAYS, args, ask_binary, binary_of, built_binary, containers, driver_of, driver_socket,
    endpoint_port, flag, flag_name, gvk, kubectl, kubectl_or_skip, mounts, render, socket_path,
    subset, volume_holding, volumes,
};
use serde_json::Value;
use target::Target;

/// apiserver-lite, or the real kube-apiserver (`None`: skipped, its binaries are missing).
async fn target(real: bool) -> Option<Target> {
    if real {
        Target::real().await
    } else {
        Some(Target::lite().await)
    }
}

/// Every overlay's render, or `None` (skipped) without kubectl.
fn renders() -> Option<Vec<(&'static str, Vec<Doc>)>> {
    let kubectl = kubectl_or_skip()?;
    Some(
        OVERLAYS
            .iter()
            .map(|o| (*o, render(&kubectl, o).1))
            .collect(),
    )
}

#[test]
fn every_manifest_file_is_part_of_an_overlay() {
    let Some(renders) = renders() else { return };
    let mut files = Vec::new();
    manifests::yaml_files(&manifests::deploy_dir().join("kubernetes"), &mut files);
    let rendered: BTreeSet<(String, String)> = renders
        .iter()
        .flat_map(|(_, docs)| docs.iter())
        .map(|d| (d.kind().to_string(), d.name().to_string()))
        .collect();
    let mut objects = 0;
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for doc in manifests::parse(&text, &f.display().to_string()) {
            if doc.kind() == "Kustomization" {
                continue;
            }
            objects += 1;
            assert!(
                rendered.contains(&(doc.kind().to_string(), doc.name().to_string())),
                "{}: {} {} is in no overlay's render",
                doc.origin,
                doc.kind(),
                doc.name()
            );
        }
    }
    assert!(objects >= 15, "{objects} objects in deploy/kubernetes");
}

#[tokio::test]
async fn overlays_create_through_kube_and_read_back() {
    overlays_create(false).await;
}

#[tokio::test]
async fn overlays_create_real_kube_apiserver() {
    overlays_create(true).await;
}

async fn overlays_create(real: bool) {
    let Some(renders) = renders() else { return };
    for (overlay, docs) in renders {
        // One server per overlay: each installs alone.
        let Some(server) = target(real).await else {
            return;
        };
        let client = server.client();
        let discovery = Discovery::new(client.clone()).run().await.unwrap();
        for doc in &docs {
            let (ar, caps) = discovery.resolve_gvk(&gvk(&doc.obj)).unwrap_or_else(|| {
                panic!("{}: the server does not serve {}", doc.origin, doc.kind())
            });
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
                .unwrap_or_else(|e| {
                    panic!(
                        "{}: {} refused to create {}: {e}",
                        doc.origin,
                        server.name(),
                        doc.name()
                    )
                });
            let back = serde_json::to_value(api.get(doc.name()).await.unwrap()).unwrap();
            if let Err(diff) = subset(&doc.obj, &back, "") {
                panic!(
                    "{}: read back from {} differs: {diff}",
                    doc.origin,
                    server.name()
                );
            }
        }
        // Everything is stored once: listing each kind finds what the render defines (the
        // real server also holds its bootstrap objects: system ClusterRoles and the like).
        let mut per_kind: BTreeMap<String, usize> = BTreeMap::new();
        for doc in &docs {
            *per_kind.entry(doc.kind().to_string()).or_default() += 1;
        }
        for doc in &docs {
            let (ar, _) = discovery.resolve_gvk(&gvk(&doc.obj)).unwrap();
            let all: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
            let n = all
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .iter()
                .filter(|o| rendered(&docs, doc.kind(), o))
                .count();
            assert_eq!(n, per_kind[doc.kind()], "{overlay}: {} objects", doc.kind());
        }
        for kind in ["CSIDriver", "StorageClass", "ServiceAccount", "ClusterRole"] {
            assert!(per_kind.contains_key(kind), "{overlay} has no {kind}");
        }
    }
}

/// Whether the listed object `o` of `kind` is one the render defines.
fn rendered(docs: &[Doc], kind: &str, o: &DynamicObject) -> bool {
    docs.iter().any(|d| {
        d.kind() == kind
            && Some(d.name()) == o.metadata.name.as_deref()
            && d.namespace() == o.metadata.namespace.as_deref()
    })
}

/// `kubectl apply` (client-side: create, then strategic merge patches) of each rendered
/// overlay creates every object; applying it again, and then through `-k` as the README says,
/// changes nothing.
#[tokio::test]
async fn kubectl_applies_each_overlay_and_again_changes_nothing() {
    kubectl_applies(false).await;
}

#[tokio::test]
async fn kubectl_applies_each_overlay_real_kube_apiserver() {
    kubectl_applies(true).await;
}

async fn kubectl_applies(real: bool) {
    let Some(bin) = kubectl_or_skip() else { return };
    for overlay in OVERLAYS {
        let (yaml, docs) = render(&bin, overlay);
        let Some(server) = target(real).await else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        server.write_kubeconfig(&dir.path().join("kubeconfig"));

        // A server-side dry run validates everything and stores nothing.
        let dry = kubectl(
            &bin,
            dir.path(),
            &["apply", "--dry-run=server", "-f", "-"],
            Some(&yaml),
        )
        .await;
        assert_eq!(
            dry.lines()
                .filter(|l| l.ends_with("(server dry run)"))
                .count(),
            docs.len(),
            "{overlay}:\n{dry}"
        );
        let stored = kubectl(
            &bin,
            dir.path(),
            &["get", "sa,sc", "-A", "-o", "name"],
            None,
        )
        .await;
        // (The real server without kcm has no ServiceAccount or StorageClass of its own.)
        assert!(
            stored.trim().is_empty(),
            "{overlay}: the dry run stored\n{stored}"
        );

        let created = kubectl(&bin, dir.path(), &["apply", "-f", "-"], Some(&yaml)).await;
        assert_eq!(
            created.lines().filter(|l| l.ends_with(" created")).count(),
            docs.len(),
            "{overlay}:\n{created}"
        );
        let again = kubectl(&bin, dir.path(), &["apply", "-f", "-"], Some(&yaml)).await;
        assert_eq!(
            again.lines().filter(|l| l.ends_with(" unchanged")).count(),
            docs.len(),
            "{overlay}: the second apply changed something:\n{again}"
        );
        let path = manifests::overlay_dir(overlay);
        let by_k = kubectl(
            &bin,
            dir.path(),
            &["apply", "-k", path.to_str().unwrap()],
            None,
        )
        .await;
        assert_eq!(
            by_k.lines().filter(|l| l.ends_with(" unchanged")).count(),
            docs.len(),
            "{overlay}: apply -k changed something:\n{by_k}"
        );

        // kubectl finds the workloads, and nothing runs them here: none is ready.
        let names = kubectl(
            &bin,
            dir.path(),
            &["get", "deploy,ds,sts,sa", "-n", "kube-system", "-o", "name"],
            None,
        )
        .await;
        for doc in docs.iter().filter(|d| d.pod_spec().is_some()) {
            let sa = doc.pod_spec().unwrap()["serviceAccountName"]
                .as_str()
                .unwrap();
            assert!(
                names
                    .lines()
                    .any(|l| l.ends_with(&format!("/{}", doc.name()))),
                "{overlay}: {} missing from\n{names}",
                doc.name()
            );
            assert!(
                names.lines().any(|l| l == format!("serviceaccount/{sa}")),
                "{overlay}: serviceaccount/{sa} missing from\n{names}"
            );
        }
        // kubectl prints the workloads as for a real server; nothing runs them: none ready.
        let (kind, name, header, ready): (&str, &str, &[&str], &str) = if *overlay == "ebs" {
            (
                "deploy",
                "ebs-csi-controller",
                &["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"],
                "0/2",
            )
        } else {
            (
                "sts",
                "csi-hostpathplugin",
                &["NAME", "READY", "AGE"],
                "0/1",
            )
        };
        let table = kubectl(&bin, dir.path(), &["get", kind, "-n", "kube-system"], None).await;
        let mut lines = table.lines();
        let head: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
        assert_eq!(head, header, "{table}");
        let row: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
        assert_eq!(row[..2], [name, ready], "{table}");
    }
}

/// Both drivers in one cluster: the second overlay leaves the roles the first created as they
/// are (they are the same objects) and creates everything else.
#[tokio::test]
async fn both_overlays_install_side_by_side() {
    both_overlays(false).await;
}

#[tokio::test]
async fn both_overlays_side_by_side_real_kube_apiserver() {
    both_overlays(true).await;
}

async fn both_overlays(real: bool) {
    let Some(bin) = kubectl_or_skip() else { return };
    let Some(server) = target(real).await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    server.write_kubeconfig(&dir.path().join("kubeconfig"));
    let (ebs_yaml, ebs) = render(&bin, "ebs");
    let (hostpath_yaml, hostpath) = render(&bin, "hostpath");
    kubectl(&bin, dir.path(), &["apply", "-f", "-"], Some(&ebs_yaml)).await;
    let second = kubectl(
        &bin,
        dir.path(),
        &["apply", "-f", "-"],
        Some(&hostpath_yaml),
    )
    .await;
    let key = |d: &Doc| {
        (
            d.kind().to_string(),
            d.namespace().map(str::to_string),
            d.name().to_string(),
        )
    };
    let ebs_keys: BTreeSet<_> = ebs.iter().map(key).collect();
    let shared: Vec<&Doc> = hostpath
        .iter()
        .filter(|d| ebs_keys.contains(&key(d)))
        .collect();
    assert!(
        !shared.is_empty()
            && shared
                .iter()
                .all(|d| d.kind() == "Role" || d.kind() == "ClusterRole"),
        "only the provisioner's roles are shared"
    );
    for d in &shared {
        let same = ebs.iter().find(|e| key(e) == key(d)).unwrap();
        assert_eq!(
            same.obj,
            d.obj,
            "{} {} differs between the overlays",
            d.kind(),
            d.name()
        );
    }
    assert_eq!(
        second.lines().filter(|l| l.ends_with(" unchanged")).count(),
        shared.len(),
        "{second}"
    );
    assert_eq!(
        second.lines().filter(|l| l.ends_with(" created")).count(),
        hostpath.len() - shared.len(),
        "{second}"
    );
    let drivers = kubectl(&bin, dir.path(), &["get", "csidriver", "-o", "name"], None).await;
    assert_eq!(
        drivers.lines().collect::<Vec<_>>(),
        [
            "csidriver.storage.k8s.io/ebs.csi.aws.com",
            "csidriver.storage.k8s.io/hostpath.csi.k8s.io"
        ]
    );
}

#[test]
fn bindings_refer_to_what_the_render_defines() {
    let Some(renders) = renders() else { return };
    for (overlay, docs) in renders {
        let defined = |kind: &str, ns: Option<&str>, name: &str| {
            docs.iter()
                .any(|d| d.kind() == kind && d.name() == name && d.namespace() == ns)
        };
        let bindings: Vec<&Doc> = docs
            .iter()
            .filter(|d| d.kind() == "RoleBinding" || d.kind() == "ClusterRoleBinding")
            .collect();
        assert!(
            bindings.len() >= 2,
            "{overlay}: a ClusterRoleBinding and a RoleBinding"
        );
        for doc in &bindings {
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
        // Every role is bound: a role nobody holds is a rule nobody checked.
        for role in docs
            .iter()
            .filter(|d| d.kind() == "Role" || d.kind() == "ClusterRole")
        {
            assert!(
                bindings
                    .iter()
                    .any(|b| b.obj["roleRef"]["kind"] == role.kind()
                        && b.obj["roleRef"]["name"] == role.name()
                        && (role.kind() == "ClusterRole" || b.namespace() == role.namespace())),
                "{overlay}: {} {} is bound to nobody",
                role.kind(),
                role.name()
            );
            // Least privilege: no wildcards.
            for rule in role.obj["rules"].as_array().unwrap() {
                for field in ["apiGroups", "resources", "verbs"] {
                    assert!(
                        rule[field].as_array().unwrap().iter().all(|v| v != "*"),
                        "{}: wildcard in {field}",
                        role.origin
                    );
                }
            }
        }
        for doc in docs.iter().filter(|d| d.pod_spec().is_some()) {
            let pod = doc.pod_spec().unwrap();
            let sa = pod["serviceAccountName"].as_str().unwrap_or("default");
            assert!(
                defined("ServiceAccount", doc.namespace(), sa),
                "{}: runs as ServiceAccount {sa}, which is not defined",
                doc.origin
            );
            // A sidecar with leader election needs leases in its namespace, bound to its SA.
            let elects = containers(pod)
                .iter()
                .any(|c| args(c).iter().any(|a| a == "--leader-election"));
            if elects {
                let lease_role_bound = bindings.iter().any(|b| {
                    b.kind() == "RoleBinding"
                        && b.namespace() == doc.namespace()
                        && b.obj["subjects"][0]["name"] == sa
                        && docs.iter().any(|r| {
                            r.kind() == "Role"
                                && r.name() == b.obj["roleRef"]["name"]
                                && r.obj["rules"].to_string().contains("leases")
                        })
                });
                assert!(
                    lease_role_bound,
                    "{}: no Role for leases bound to {sa}",
                    doc.origin
                );
            }
        }
    }
}

/// Every `--csi-address` (in arguments and in exec probes) names the socket the pod's driver
/// serves: the same file of the same volume, wherever each container mounts it.
#[test]
fn sidecars_dial_the_socket_their_driver_serves() {
    let Some(renders) = renders() else { return };
    let mut dialers = BTreeSet::new();
    for (overlay, docs) in renders {
        for doc in docs.iter().filter(|d| d.pod_spec().is_some()) {
            let pod = doc.pod_spec().unwrap();
            let (volume, file) = driver_socket(pod);
            assert!(
                volumes(pod).contains_key(&volume),
                "{}: no volume {volume}",
                doc.origin
            );
            for c in containers(pod) {
                let name = c["name"].as_str().unwrap();
                let mut addresses: Vec<String> = flag(&args(c), "--csi-address")
                    .into_iter()
                    .map(str::to_string)
                    .collect();
                let probe = &c["livenessProbe"]["exec"]["command"];
                if let Some(cmd) = probe.as_array() {
                    let cmd: Vec<String> = cmd
                        .iter()
                        .map(|a| a.as_str().unwrap().to_string())
                        .collect();
                    addresses.extend(flag(&cmd, "--csi-address").map(str::to_string));
                }
                for address in addresses {
                    let path = socket_path(&address);
                    let held = volume_holding(c, path);
                    assert_eq!(
                        held,
                        Some((volume.clone(), file.clone())),
                        "{overlay}/{}/{name}: --csi-address={address} is not the driver's socket \
                         ({file} in volume {volume}, mounted here at {:?})",
                        doc.name(),
                        mounts(c).get(&volume)
                    );
                    dialers.insert(format!("{overlay}/{}/{name}", doc.name()));
                }
            }
        }
    }
    for want in [
        "ebs/ebs-csi-controller/csi-attacher",
        "ebs/ebs-csi-controller/csi-provisioner",
        "ebs/ebs-csi-node/node-driver-registrar",
        "hostpath/csi-hostpathplugin/csi-provisioner",
        "hostpath/csi-hostpathplugin/node-driver-registrar",
    ] {
        assert!(
            dialers.contains(want),
            "{want} dials no socket: {dialers:?}"
        );
    }
}

/// Node plugins: the registrar registers the host path of the driver's socket, writes into the
/// kubelet's plugins_registry, and the driver sees the kubelet's directories at the kubelet's
/// own paths with Bidirectional propagation (its mounts must reach the host).
#[test]
fn node_plugins_register_their_socket_and_share_the_kubelet_mounts() {
    let Some(renders) = renders() else { return };
    let mut node_plugins = 0;
    for (overlay, docs) in renders {
        for doc in docs.iter().filter(|d| d.pod_spec().is_some()) {
            let pod = doc.pod_spec().unwrap();
            let Some(registrar) = containers(pod)
                .iter()
                .find(|c| binary_of(c) == "csi-node-driver-registrar")
            else {
                continue;
            };
            node_plugins += 1;
            let what = format!("{overlay}/{}", doc.name());
            let vols = volumes(pod);
            let (volume, file) = driver_socket(pod);
            let host_dir = vols[&volume]["hostPath"]["path"]
                .as_str()
                .unwrap_or_else(|| panic!("{what}: socket volume {volume} is not a hostPath"));
            let host_socket = Path::new(host_dir).join(&file);
            let reg_args = args(registrar);
            assert_eq!(
                flag(&reg_args, "--kubelet-registration-path").map(Path::new),
                Some(host_socket.as_path()),
                "{what}: the kubelet would dial another path than the driver's socket"
            );
            // The exec probe names the same path.
            let probe: Vec<String> = registrar["livenessProbe"]["exec"]["command"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap().to_string())
                .collect();
            assert_eq!(
                flag(&probe, "--kubelet-registration-path").map(Path::new),
                Some(host_socket.as_path()),
                "{what}: probe"
            );
            assert_eq!(flag(&probe, "--mode"), Some("kubelet-registration-probe"));
            // The socket dir is the kubelet's plugins/<driver name>.
            let driver_name = docs
                .iter()
                .find(|d| d.kind() == "CSIDriver")
                .unwrap()
                .name()
                .to_string();
            assert_eq!(
                host_dir.trim_end_matches('/'),
                format!("/var/lib/kubelet/plugins/{driver_name}"),
                "{what}"
            );
            // plugins_registry mounted where the registrar creates its socket.
            let reg_dir = flag(&reg_args, "--plugin-registration-path").unwrap_or("/registration");
            let (reg_volume, rest) = volume_holding(registrar, reg_dir)
                .unwrap_or_else(|| panic!("{what}: {reg_dir} is not mounted"));
            assert!(rest.is_empty(), "{what}: {reg_dir} is inside a mount");
            assert_eq!(
                vols[&reg_volume]["hostPath"]["path"]
                    .as_str()
                    .map(|p| p.trim_end_matches('/')),
                Some("/var/lib/kubelet/plugins_registry"),
                "{what}"
            );
            // The driver mounts the kubelet's root dir at the same path, Bidirectional.
            let driver = driver_of(pod);
            let kubelet = driver["volumeMounts"]
                .as_array()
                .unwrap()
                .iter()
                .find(|m| {
                    vols[m["name"].as_str().unwrap()]["hostPath"]["path"]
                        .as_str()
                        .is_some_and(|p| p.trim_end_matches('/') == "/var/lib/kubelet")
                })
                .unwrap_or_else(|| panic!("{what}: the driver does not mount /var/lib/kubelet"));
            assert_eq!(kubelet["mountPath"], "/var/lib/kubelet", "{what}");
            assert_eq!(kubelet["mountPropagation"], "Bidirectional", "{what}");
            assert_eq!(
                driver["securityContext"]["privileged"], true,
                "{what}: Bidirectional propagation needs a privileged container"
            );
            // No other container shares the kubelet's mounts both ways.
            for c in containers(pod)
                .iter()
                .filter(|c| c["name"] != driver["name"])
            {
                assert!(
                    !c["volumeMounts"].to_string().contains("Bidirectional"),
                    "{what}: {} has a Bidirectional mount",
                    c["name"]
                );
            }
        }
    }
    assert_eq!(
        node_plugins, 2,
        "the EBS node DaemonSet and the hostpath plugin"
    );
}

/// The flags of the Go external-provisioner that our `csi-provisioner` was specified to take.
/// The binary is being written beside these manifests: when it is built, its `--help` is
/// asked as well; until then the manifests may use only these.
const PROVISIONER_FLAGS: &[&str] = &[
    "--csi-address",
    "--kubeconfig",
    "--timeout",
    "--worker-threads",
    "--retry-interval-start",
    "--retry-interval-max",
    "--volume-name-prefix",
    "--volume-name-uuid-length",
    "--extra-create-metadata",
    "--default-fstype",
    "--feature-gates",
    "--strict-topology",
    "--immediate-topology",
    "--leader-election",
    "--leader-election-namespace",
    "--leader-election-lease-duration",
    "--leader-election-renew-deadline",
    "--leader-election-retry-period",
    "--kube-api-qps",
    "--kube-api-burst",
    "--http-endpoint",
    "--v",
];

#[test]
fn every_argument_is_a_flag_its_binary_accepts() {
    let Some(renders) = renders() else { return };
    // (binary, arguments, where): container args and exec probe commands.
    let mut calls: Vec<(String, Vec<String>, String)> = Vec::new();
    for (overlay, docs) in &renders {
        for doc in docs.iter().filter(|d| d.pod_spec().is_some()) {
            for c in containers(doc.pod_spec().unwrap()) {
                let at = format!("{overlay}/{}/{}", doc.name(), c["name"].as_str().unwrap());
                let bin = binary_of(c);
                assert!(c["command"].is_null(), "{at}: the image's entrypoint runs");
                calls.push((bin.clone(), args(c), at.clone()));
                if let Some(cmd) = c["livenessProbe"]["exec"]["command"].as_array() {
                    let cmd: Vec<String> = cmd
                        .iter()
                        .map(|a| a.as_str().unwrap().to_string())
                        .collect();
                    assert_eq!(
                        cmd[0],
                        format!("/{bin}"),
                        "{at}: probe runs the image's binary"
                    );
                    calls.push((bin, cmd[1..].to_vec(), format!("{at} (liveness probe)")));
                }
            }
        }
    }
    let mut checked = BTreeSet::new();
    for (bin, argv, at) in &calls {
        for a in argv {
            assert!(a.starts_with("--"), "{at}: {a} is not a --flag");
        }
        if bin == "csi-provisioner" {
            for a in argv {
                assert!(
                    PROVISIONER_FLAGS.contains(&flag_name(a)),
                    "{at}: {a} is not a Go external-provisioner flag csi-provisioner takes"
                );
            }
            // The Go sidecar's feature gate syntax, Topology on.
            if let Some(gates) = flag(argv, "--feature-gates") {
                assert_eq!(gates, "Topology=true", "{at}");
            }
        }
        let Some(path) = built_binary(bin) else {
            match bin.as_str() {
                // Being written now; its flags were checked against the list above.
                "csi-provisioner" => continue,
                // Never built by this crate's tests (aws-sdk-ec2: minutes and gigabytes).
                "ebs-csi-driver" => {
                    test_support::skip_or_fail(
                        "ebs-csi-driver is not built in the target dir (cargo build -p ebs-driver)",
                    );
                    return;
                }
                _ => {
                    test_support::skip_or_fail(&format!(
                        "{bin} is not built in the target dir (cargo build --bin {bin})"
                    ));
                    return;
                }
            }
        };
        let (flags, parsed) = ask_binary(&path, argv);
        for a in argv {
            assert!(
                flags.contains(flag_name(a)),
                "{at}: {bin} has no flag {} (its flags: {flags:?})",
                flag_name(a)
            );
        }
        if let Err(e) = parsed {
            panic!("{at}: {bin} refuses {argv:?}: {e}");
        }
        checked.insert(bin.clone());
    }
    for want in [
        "ebs-csi-driver",
        "csi-attacher",
        "csi-node-driver-registrar",
        "hostpath-csi-driver",
    ] {
        assert!(checked.contains(want), "{want} was not asked: {checked:?}");
    }
}

/// Every httpGet probe asks a port the container serves on its `--http-endpoint`, at a path
/// that binary serves; sidecars with leader election are probed on their election's health.
#[test]
fn probes_ask_what_the_containers_serve() {
    let Some(renders) = renders() else { return };
    let mut probed = 0;
    for (overlay, docs) in renders {
        for doc in docs.iter().filter(|d| d.pod_spec().is_some()) {
            for c in containers(doc.pod_spec().unwrap()) {
                let at = format!("{overlay}/{}/{}", doc.name(), c["name"].as_str().unwrap());
                let a = args(c);
                let get = &c["livenessProbe"]["httpGet"];
                if get.is_null() {
                    assert!(
                        !c["livenessProbe"]["exec"].is_null()
                            || binary_of(c) == "hostpath-csi-driver",
                        "{at}: no liveness probe"
                    );
                    continue;
                }
                probed += 1;
                let served = endpoint_port(
                    flag(&a, "--http-endpoint")
                        .unwrap_or_else(|| panic!("{at}: probed without --http-endpoint")),
                );
                let port = match &get["port"] {
                    Value::Number(n) => n.as_u64().unwrap() as u16,
                    Value::String(name) => c["ports"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .find(|p| p["name"] == name.as_str())
                        .unwrap_or_else(|| panic!("{at}: no port named {name}"))["containerPort"]
                        .as_u64()
                        .unwrap() as u16,
                    other => panic!("{at}: port {other}"),
                };
                assert_eq!(port, served, "{at}: the probe asks a port nobody serves");
                let path = get["path"].as_str().unwrap();
                if a.iter().any(|x| x == "--leader-election") {
                    assert_eq!(path, "/healthz/leader-election", "{at}");
                } else {
                    assert_eq!(path, "/healthz", "{at}");
                }
            }
        }
    }
    assert_eq!(
        probed, 5,
        "EBS controller (3) and node driver, hostpath provisioner"
    );
}

#[test]
fn csidrivers_and_storageclasses_fit_their_drivers() {
    let Some(renders) = renders() else { return };
    for (overlay, docs) in renders {
        let of_kind = |k: &str| -> Vec<&Doc> { docs.iter().filter(|d| d.kind() == k).collect() };
        let drivers = of_kind("CSIDriver");
        assert_eq!(drivers.len(), 1, "{overlay}");
        let driver = drivers[0];
        let spec = &driver.obj["spec"];
        let classes = of_kind("StorageClass");
        assert_eq!(classes.len(), 1, "{overlay}");
        let class = &classes[0].obj;
        assert_eq!(class["provisioner"], driver.name(), "{overlay}");
        assert_eq!(
            class["volumeBindingMode"], "WaitForFirstConsumer",
            "{overlay}"
        );
        // The driver's name is what its binary reports: the EBS default, or --drivername.
        let workloads: Vec<&Doc> = docs.iter().filter(|d| d.pod_spec().is_some()).collect();
        let attacher = workloads
            .iter()
            .flat_map(|d| containers(d.pod_spec().unwrap()))
            .any(|c| binary_of(c) == "csi-attacher");
        match overlay {
            "ebs" => {
                assert_eq!(driver.name(), "ebs.csi.aws.com");
                assert_eq!(spec["attachRequired"], true);
                assert_eq!(spec["podInfoOnMount"], false);
                assert_eq!(spec["fsGroupPolicy"], "File");
                assert!(attacher, "EBS volumes are attached: an attacher runs");
                assert_eq!(classes[0].name(), "ebs-sc");
                assert_eq!(class["parameters"]["type"], "gp3");
                assert_eq!(class["parameters"]["csi.storage.k8s.io/fstype"], "ext4");
                assert_eq!(class["allowVolumeExpansion"], true);
                for w in &workloads {
                    for c in containers(w.pod_spec().unwrap()) {
                        if binary_of(c) == "ebs-csi-driver" {
                            assert!(flag(&args(c), "--driver-name").is_none());
                        }
                    }
                }
            }
            "hostpath" => {
                assert_eq!(driver.name(), "hostpath.csi.k8s.io");
                assert_eq!(spec["attachRequired"], false);
                assert_eq!(spec["podInfoOnMount"], true);
                assert!(!attacher, "nothing to attach: no attacher");
                assert_eq!(classes[0].name(), "hostpath");
                let plugin = workloads[0].pod_spec().unwrap();
                assert_eq!(
                    flag(&args(driver_of(plugin)), "--drivername"),
                    Some("hostpath.csi.k8s.io")
                );
                assert_eq!(workloads[0].kind(), "StatefulSet");
                assert_eq!(workloads[0].obj["spec"]["replicas"], 1);
            }
            other => panic!("overlay {other}"),
        }
        // Images: the placeholders deploy/README.md describes.
        for w in &workloads {
            for c in containers(w.pod_spec().unwrap()) {
                assert_eq!(
                    c["image"].as_str().unwrap(),
                    format!("csi-rs/{}:v0.1.0", binary_of(c)),
                    "{overlay}/{}",
                    w.name()
                );
            }
        }
    }
}
