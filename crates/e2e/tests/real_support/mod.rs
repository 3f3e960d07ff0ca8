//! What the real-Kubernetes e2e tests (`real_*.rs`) share beyond `k8s_harness::host` (our
//! binaries as host processes, waiting with their logs at hand): a longer patience, mountinfo,
//! repository files, pods' readiness.
// Each test binary uses a part of this module.
#![allow(dead_code)]

use std::path::Path;
use std::time::Duration;

use k8s_harness::support::eventually_with_logs;

/// How long one step may take before the test fails with the logs' ends.
pub const PATIENCE: Duration = Duration::from_secs(90);

/// `path`'s line in /proc/self/mountinfo when it is a mount point.
pub fn mountinfo_line(path: &Path) -> Option<String> {
    let want = path.to_str()?;
    std::fs::read_to_string("/proc/self/mountinfo")
        .ok()?
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(want))
        .map(str::to_owned)
}

/// [`eventually_with_logs`] with [`PATIENCE`].
pub async fn eventually<T, F, Fut, P>(what: &str, logs: &[P], probe: F) -> T
where
    P: AsRef<Path>,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    eventually_with_logs(what, PATIENCE, logs, probe).await
}

/// Whether `path` is a mount point.
pub fn is_mount_point(path: &Path) -> bool {
    mountinfo_line(path).is_some()
}

/// A file of this repository (deploy/ manifests), by its path from the root.
pub fn repo_file(rel: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// deploy/'s ServiceAccounts, the sidecars' RBAC, the CSIDriver and the example class, applied
/// as an operator applies them; the kubeconfig of the controller's ServiceAccount (its token
/// from the real API server), which the controller-side processes run with.
pub async fn deploy_controller_objects(cluster: &k8s_harness::Cluster) -> std::path::PathBuf {
    for file in [
        "deploy/kubernetes/base/serviceaccounts.yaml",
        "deploy/kubernetes/rbac/attacher/rbac-attacher.yaml",
        "deploy/kubernetes/rbac/provisioner/rbac-provisioner.yaml",
        "deploy/kubernetes/base/csidriver.yaml",
        "deploy/kubernetes/overlays/ebs/storageclass.yaml",
    ] {
        cluster
            .apply(&repo_file(file))
            .unwrap_or_else(|e| panic!("applying {file}: {e}"));
    }
    cluster
        .service_account_kubeconfig("kube-system", "ebs-csi-controller-sa")
        .await
        .unwrap_or_else(|e| panic!("the controller ServiceAccount's kubeconfig: {e}"))
}

/// A claim in `default` for `size` of class `class` (`""`: none), bound to the PV `volume` when
/// given: a YAML document for `Cluster::apply`.
pub fn claim_yaml(name: &str, class: &str, volume: Option<&str>, size: &str) -> String {
    let volume = volume.map_or(String::new(), |v| format!("  volumeName: {v}\n"));
    format!(
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: {name}, namespace: default}}\n\
         spec:\n  accessModes: [ReadWriteOnce]\n  storageClassName: \"{class}\"\n{volume}\
         \x20 resources: {{requests: {{storage: {size}}}}}\n"
    )
}

/// A pod in `default` on the host network, the pause image with the claim `claim` at `/data`;
/// on `node` when given (the scheduler left out): a YAML document for `Cluster::apply`.
pub fn pod_yaml(name: &str, claim: &str, node: Option<&str>) -> String {
    let node = node.map_or(String::new(), |n| format!("  nodeName: {n}\n"));
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default}}\nspec:\n{node}\
         \x20 hostNetwork: true\n  containers:\n  - name: app\n    image: {image}\n\
         \x20   imagePullPolicy: Never\n    volumeMounts: [{{name: data, mountPath: /data}}]\n\
         \x20 volumes:\n  - name: data\n    persistentVolumeClaim: {{claimName: {claim}}}\n",
        image = k8s_harness::PAUSE_IMAGE,
    )
}

/// YAML documents as one manifest.
pub fn manifest(documents: &[String]) -> String {
    documents.join("---\n")
}

/// Whether loop devices can be had (the embedded EC2 backs volumes with them); says why not
/// through `test_support::skip_or_fail`.
pub fn loop_devices_or_skip() -> bool {
    let ok = Path::new("/dev/loop-control").exists();
    if !ok {
        test_support::skip_or_fail(
            "no /dev/loop-control: the embedded EC2 backs volumes with loop devices",
        );
    }
    ok
}

/// The pod `name` once its Ready condition is True (see [`eventually`]).
pub async fn ready_pod<P: AsRef<Path>>(
    pods: &kube::Api<k8s_openapi::api::core::v1::Pod>,
    name: &str,
    logs: &[P],
) -> k8s_openapi::api::core::v1::Pod {
    eventually(&format!("pod {name} Ready"), logs, || async move {
        let p = pods.get(name).await.ok()?;
        p.status
            .as_ref()?
            .conditions
            .as_ref()?
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
            .then_some(p)
    })
    .await
}
