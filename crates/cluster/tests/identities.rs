//! Each component talks to apiserver-lite as its own user, as on a kubeadm cluster: after an
//! EBS pod and a hostpath pod get Ready on an in-process cluster, apiserver-lite's audit record
//! names the node agent `system:node:node-0`, kcm's controllers by their service accounts, the
//! scheduler `system:kube-scheduler` and the CSI sidecars by deploy/'s service accounts, and
//! no component wrote as the admin. Every kubeconfig under `<data-dir>/kubeconfigs` is 0600 and
//! the admin's stays at `<data-dir>/kubeconfig`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::Duration;

use cluster::kube_ops;
use cluster::{RunningCluster, UpConfig};

const PATIENCE: Duration = Duration::from_secs(120);
/// The test's own client (the admin, as a kubectl user): its writes are the only admin ones
/// allowed besides csi-cluster's setup.
const TEST_AGENT: &str = "identities-test";

/// Unmounts and releases whatever the cluster left below its data dir on every way out.
struct Cleanup(PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        test_support::unmount_all_below(&self.0);
        for (dev, _) in common::loop_devices_below(&self.0) {
            let _ = std::process::Command::new("losetup")
                .arg("-d")
                .arg(dev)
                .status();
        }
    }
}

fn sa(name: &str) -> String {
    format!("system:serviceaccount:kube-system:{name}")
}

fn is_write(verb: &str) -> bool {
    matches!(
        verb,
        "create" | "update" | "patch" | "delete" | "deletecollection"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_component_writes_as_its_own_user_and_none_as_the_admin() {
    if !common::can_run() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let data_dir = work.path().join("d");
    let _cleanup = Cleanup(data_dir.clone());
    let mut config = UpConfig::new(1, &data_dir);
    config.zones = 1;
    config.port = Some(0);
    config.audit = true;
    let cluster = RunningCluster::start(config).await.unwrap();
    cluster.wait_ready().await.unwrap();

    let client = component_runtime::build_client(Some(&cluster.kubeconfig()), TEST_AGENT, -1.0, 0)
        .await
        .unwrap();
    for (claim, class, pod) in [
        ("ebs-claim", "ebs-sc", "ebs-pod"),
        ("hp-claim", "hostpath", "hp-pod"),
    ] {
        kube_ops::create_claim(&client, claim, Some(class), None)
            .await
            .unwrap();
        kube_ops::create_pod(&client, pod, claim, "node-0")
            .await
            .unwrap();
    }
    for pod in ["ebs-pod", "hp-pod"] {
        kube_ops::wait_pod_ready(&client, pod, PATIENCE)
            .await
            .unwrap();
    }
    let records = cluster.audit();

    // Who each component (told apart by its User-Agent) was: one user per component, and
    // the one its real counterpart has.
    let node = "system:node:node-0".to_string();
    let expected: Vec<(&str, String, bool)> = vec![
        // (User-Agent prefix, user, must have written)
        ("csi-node-agent/", node.clone(), true),
        ("pv-controller/", sa("persistent-volume-binder"), true),
        (
            "attach-detach-controller/",
            sa("attachdetach-controller"),
            true,
        ),
        ("csi-attacher/", sa("ebs-csi-controller-sa"), true),
        // The EBS provisioner ("csi-provisioner/csi-cluster" exactly) and node-0's hostpath
        // one (`--node-deployment`), as deploy/ runs them.
        (
            "csi-provisioner/csi-cluster node-0",
            sa("csi-hostpathplugin-sa"),
            true,
        ),
        // The watches the per-node hostpath provisioners share: read-only, as their
        // service account.
        (
            "csi-provisioner/csi-cluster informers",
            sa("csi-hostpathplugin-sa"),
            false,
        ),
        ("csi-scheduler/", "system:kube-scheduler".into(), true),
        // The control plane's shared watch caches list and watch as kcm itself; the
        // ephemeral-volume and StatefulSet controllers only read here (no generic ephemeral
        // volume, no StatefulSet), so they make no request of their own.
        (
            "csi-cluster/informers",
            "system:kube-controller-manager".into(),
            false,
        ),
    ];
    let mut users_of: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for r in &records {
        users_of
            .entry(r.user_agent.to_string())
            .or_default()
            .insert(r.user.to_string());
    }
    let summary = format!("{users_of:#?}");
    let mut writes_by: BTreeMap<&str, usize> = BTreeMap::new();
    for r in records.iter().filter(|r| is_write(&r.verb)) {
        *writes_by.entry(r.user.as_str()).or_default() += 1;
    }
    println!("{} requests; writes by user: {writes_by:#?}", records.len());
    for (agent, user, writes) in &expected {
        let mine: Vec<_> = records
            .iter()
            .filter(|r| r.user_agent.starts_with(agent))
            .collect();
        assert!(!mine.is_empty(), "no request from {agent}: {summary}");
        for r in &mine {
            assert_eq!(&r.user, user, "{agent}: {r:?}");
        }
        if *writes {
            assert!(
                mine.iter().any(|r| is_write(&r.verb) && r.code < 400),
                "{agent} wrote nothing: {:?}",
                mine.iter().map(|r| &r.verb).collect::<Vec<_>>()
            );
        }
    }
    let ebs_provisioner: Vec<_> = records
        .iter()
        .filter(|r| r.user_agent == "csi-provisioner/csi-cluster")
        .collect();
    assert!(
        ebs_provisioner
            .iter()
            .any(|r| is_write(&r.verb) && r.resource == "persistentvolumes" && r.code < 400),
        "the EBS provisioner created no PV: {summary}"
    );
    for r in &ebs_provisioner {
        assert_eq!(r.user, sa("ebs-csi-controller-sa"), "{r:?}");
    }
    // The node agent wrote its own Node and the pods' status as the node.
    for (resource, subresource) in [("nodes", Some("status")), ("pods", Some("status"))] {
        assert!(
            records.iter().any(|r| r.user == node
                && is_write(&r.verb)
                && r.resource == resource
                && r.subresource.as_deref() == subresource),
            "no {resource}/{subresource:?} write by {node}"
        );
    }
    // Distinct users for the PV controller, ADC, attacher, scheduler, node agent; the hostpath
    // provisioners' shared watches are theirs, under the same service account.
    let distinct: BTreeSet<&String> = expected.iter().map(|(_, u, _)| u).collect();
    assert_eq!(distinct.len(), expected.len() - 1);

    // No component wrote as the admin: its writes are the test's and csi-cluster's setup
    // (the namespaces, CSIDrivers and StorageClasses it installs, as kubeadm's addons).
    let admin_writes: Vec<_> = records
        .iter()
        .filter(|r| r.user == apiserver::ADMIN_USER && is_write(&r.verb))
        .filter(|r| {
            r.user_agent != TEST_AGENT
                && !matches!(
                    r.resource.as_str(),
                    "namespaces" | "csidrivers" | "storageclasses"
                )
        })
        .collect();
    assert!(
        admin_writes.is_empty(),
        "component writes as the admin: {admin_writes:#?}"
    );
    assert!(
        records
            .iter()
            .any(|r| r.user == apiserver::ADMIN_USER && r.user_agent == TEST_AGENT),
        "the test's own writes are not in the record"
    );

    // One kubeconfig per identity, owner-only, naming its user; the admin's where it was.
    let dir = cluster.kubeconfigs_dir();
    assert_eq!(dir, data_dir.canonicalize().unwrap().join("kubeconfigs"));
    let mut files = BTreeMap::new();
    for e in std::fs::read_dir(&dir).unwrap() {
        let path = e.unwrap().path();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{}", path.display());
        let text = std::fs::read_to_string(&path).unwrap();
        let kc = kube::config::Kubeconfig::from_yaml(&text).unwrap();
        files.insert(
            path.file_name().unwrap().to_string_lossy().into_owned(),
            kc.auth_infos[0].name.clone(),
        );
    }
    let want: BTreeMap<String, String> = [
        ("kubelet-node-0", node.clone()),
        ("persistent-volume-binder", sa("persistent-volume-binder")),
        ("attachdetach-controller", sa("attachdetach-controller")),
        (
            "ephemeral-volume-controller",
            sa("ephemeral-volume-controller"),
        ),
        ("statefulset-controller", sa("statefulset-controller")),
        ("kube-scheduler", "system:kube-scheduler".into()),
        (
            "kube-controller-manager",
            "system:kube-controller-manager".into(),
        ),
        ("ebs-csi-controller-sa", sa("ebs-csi-controller-sa")),
        ("csi-hostpathplugin-sa", sa("csi-hostpathplugin-sa")),
    ]
    .into_iter()
    .map(|(f, u)| (format!("{f}.kubeconfig"), u))
    .collect();
    assert_eq!(files, want);
    let admin = cluster.kubeconfig();
    assert_eq!(admin, data_dir.canonicalize().unwrap().join("kubeconfig"));
    assert_eq!(
        std::fs::metadata(&admin).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let kc =
        kube::config::Kubeconfig::from_yaml(&std::fs::read_to_string(&admin).unwrap()).unwrap();
    assert_eq!(kc.auth_infos[0].name, apiserver::ADMIN_USER);

    cluster.stop().await.unwrap();
}
