//! kubectl (the one on PATH) against the embedded server, as a user would run it.
// Test code (helpers included): a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "common/target.rs"]
mod target;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use target::Target;

fn kubectl_path() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("kubectl"))
        .find(|p| p.is_file())
}

struct Kubectl {
    bin: PathBuf,
    kubeconfig: PathBuf,
    cache: PathBuf,
    dir: PathBuf,
}

struct Out {
    ok: bool,
    stdout: String,
    stderr: String,
}

impl Kubectl {
    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.bin);
        c.env("KUBECONFIG", &self.kubeconfig)
            .arg("--cache-dir")
            .arg(&self.cache)
            .args(args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        c
    }

    async fn run(&self, args: &[&str]) -> Out {
        let out = tokio::time::timeout(Duration::from_secs(60), self.command(args).output())
            .await
            .unwrap_or_else(|_| panic!("kubectl {args:?} finished within 60s"))
            .unwrap();
        Out {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    async fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args).await;
        assert!(
            out.ok,
            "kubectl {args:?} failed:\n{}\n{}",
            out.stdout, out.stderr
        );
        out.stdout
    }

    fn write(&self, name: &str, text: &str) -> String {
        std::fs::write(self.dir.join(name), text).unwrap();
        name.to_string()
    }
}

const MANIFESTS: &[(&str, &str)] = &[
    (
        "pv.yaml",
        "apiVersion: v1
kind: PersistentVolume
metadata:
  name: pv-1
spec:
  capacity:
    storage: 4Gi
  accessModes: [ReadWriteOnce]
  storageClassName: ebs
  csi:
    driver: ebs.csi.aws.com
    volumeHandle: vol-0123
    fsType: ext4
",
    ),
    (
        "pvc.yaml",
        "apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: claim-1
  namespace: default
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: ebs
  resources:
    requests:
      storage: 4Gi
",
    ),
    (
        "pod.yaml",
        "apiVersion: v1
kind: Pod
metadata:
  name: web
spec:
  nodeName: node-1
  containers:
  - name: web
    image: nginx:1.27
    volumeMounts:
    - name: data
      mountPath: /data
  volumes:
  - name: data
    persistentVolumeClaim:
      claimName: claim-1
",
    ),
    (
        "va.yaml",
        "apiVersion: storage.k8s.io/v1
kind: VolumeAttachment
metadata:
  name: csi-0123
  finalizers: [external-attacher/ebs-csi-aws-com]
spec:
  attacher: ebs.csi.aws.com
  nodeName: node-1
  source:
    persistentVolumeName: pv-1
",
    ),
    (
        "csidriver.yaml",
        "apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata:
  name: ebs.csi.aws.com
spec:
  attachRequired: true
  podInfoOnMount: false
",
    ),
];

fn setup(target: &Target, dir: &Path, bin: PathBuf) -> Kubectl {
    let kubeconfig = dir.join("kubeconfig");
    target.write_kubeconfig(&kubeconfig);
    Kubectl {
        bin,
        kubeconfig,
        cache: dir.join("cache"),
        dir: dir.to_path_buf(),
    }
}

#[tokio::test]
async fn kubectl_create_get_patch_delete_watch() {
    let Some(bin) = kubectl_path() else {
        test_support::skip_or_fail("no kubectl on PATH (scripts/setup installs it)");
        return;
    };
    scenario(Target::lite().await, bin, false).await;
}

/// The same steps against the real kube-apiserver v1.26: every answer kubectl prints must be
/// the same as apiserver-lite's.
#[tokio::test]
async fn kubectl_scenario_real_kube_apiserver() {
    let Some(bin) = kubectl_path() else {
        test_support::skip_or_fail("no kubectl on PATH (scripts/setup installs it)");
        return;
    };
    let Some(target) = Target::real().await else {
        return;
    };
    scenario(target, bin, false).await;
}

/// Debian's `kubernetes-client` (kubectl 1.20, the one a machine without kubectl gets), which
/// `scripts/setup` unpacks beside the one on PATH so both are tested.
#[tokio::test]
async fn kubectl_1_20_from_debian_create_get_patch_delete_watch() {
    let Some(bin) = test_support::kubectl_1_20() else {
        return;
    };
    scenario(Target::lite().await, bin, true).await;
}

/// kubectl 1.20 against the real kube-apiserver v1.26.
#[tokio::test]
async fn kubectl_1_20_from_debian_real_kube_apiserver() {
    let Some(bin) = test_support::kubectl_1_20() else {
        return;
    };
    let Some(target) = Target::real().await else {
        return;
    };
    scenario(target, bin, true).await;
}

/// Every step with kubectl `bin` against `target`; `legacy` (1.20) leaves out the client flags
/// it predates.
async fn scenario(target: Target, bin: PathBuf, legacy: bool) {
    let dir = tempfile::tempdir().unwrap();
    let k = setup(&target, dir.path(), bin);
    target.prepare_namespace("default").await;

    // create -f of each kind.
    for (file, text) in MANIFESTS {
        let f = k.write(file, text);
        let out = k.ok(&["create", "-f", &f]).await;
        assert!(out.contains("created"), "{out}");
    }

    // get as a table (server-side columns) and as JSON.
    let table = k.ok(&["get", "volumeattachments"]).await;
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        vec!["NAME", "ATTACHER", "PV", "NODE", "ATTACHED", "AGE"]
    );
    assert!(
        table.lines().nth(1).unwrap().starts_with("csi-0123"),
        "{table}"
    );
    let pvs = k.ok(&["get", "pv"]).await;
    assert!(
        pvs.contains("CAPACITY") && pvs.contains("4Gi") && pvs.contains("RWO"),
        "{pvs}"
    );
    let pods = k.ok(&["get", "pods", "-o", "wide"]).await;
    assert!(pods.contains("NODE") && pods.contains("node-1"), "{pods}");
    let shortname = k.ok(&["get", "pvc", "claim-1"]).await;
    assert!(shortname.contains("Pending"), "{shortname}");
    let csidriver: Value = serde_json::from_str(
        &k.ok(&["get", "csidriver", "ebs.csi.aws.com", "-o", "json"])
            .await,
    )
    .unwrap();
    assert_eq!(csidriver["spec"]["attachRequired"], true);
    assert_eq!(csidriver["kind"], "CSIDriver");
    let list: Value = serde_json::from_str(&k.ok(&["get", "pv", "-o", "json"]).await).unwrap();
    assert_eq!(list["items"][0]["spec"]["csi"]["volumeHandle"], "vol-0123");
    let missing = k.run(&["get", "pv", "nope"]).await;
    assert!(
        !missing.ok && missing.stderr.contains("NotFound"),
        "{}",
        missing.stderr
    );
    // Unknown resources under served group/versions are a NotFound Status, which kubectl
    // prints as the server's error; only `/` answers the path index.
    for raw in ["/apis/storage.k8s.io/v1/foos", "/api/v1/nonexistents"] {
        let out = k.run(&["get", "--raw", raw]).await;
        assert!(
            !out.ok
                && out.stderr.contains(
                    "Error from server (NotFound): the server could not find the requested resource"
                )
                && !out.stdout.contains("paths"),
            "get --raw {raw}: {}{}",
            out.stdout,
            out.stderr
        );
    }
    let index: Value = serde_json::from_str(&k.ok(&["get", "--raw", "/"]).await).unwrap();
    assert!(index["paths"].as_array().is_some_and(|p| !p.is_empty()));

    // patch --type=merge and --type=json.
    k.ok(&[
        "patch",
        "pv",
        "pv-1",
        "--type=merge",
        "-p",
        r#"{"metadata":{"labels":{"tier":"gold"}}}"#,
    ])
    .await;
    k.ok(&["patch", "pv", "pv-1", "--type=json", "-p", r#"[{"op":"test","path":"/metadata/labels/tier","value":"gold"},{"op":"replace","path":"/metadata/labels/tier","value":"silver"}]"#]).await;
    let labels = k
        .ok(&[
            "get",
            "pv",
            "pv-1",
            "-o",
            "jsonpath={.metadata.labels.tier}",
        ])
        .await;
    assert_eq!(labels, "silver");
    let failed_test = k
        .run(&[
            "patch",
            "pv",
            "pv-1",
            "--type=json",
            "-p",
            r#"[{"op":"test","path":"/metadata/labels/tier","value":"gold"}]"#,
        ])
        .await;
    assert!(!failed_test.ok, "a failed test op must fail the patch");
    // The default (strategic) patch type merges.
    k.ok(&[
        "patch",
        "pv",
        "pv-1",
        "-p",
        r#"{"metadata":{"labels":{"x":"y"}}}"#,
    ])
    .await;
    let labels = k
        .ok(&["get", "pv", "pv-1", "-o", "jsonpath={.metadata.labels}"])
        .await;
    let labels: Value = serde_json::from_str(&labels).unwrap();
    assert_eq!(labels, json!({"tier": "silver", "x": "y"}));
    // Validation errors come back as kubectl prints the real server's.
    let invalid = k
        .run(&[
            "patch",
            "csidriver",
            "ebs.csi.aws.com",
            "--type=merge",
            "-p",
            r#"{"spec":{"attachRequired":false}}"#,
        ])
        .await;
    assert!(!invalid.ok);
    assert!(
        // `attachedRequired` (sic) is the path kube-apiserver names.
        invalid
            .stderr
            .contains("spec.attachedRequired: Invalid value: false: field is immutable"),
        "{}",
        invalid.stderr
    );

    // get -w sees a change made elsewhere.
    let mut watch = k
        .command(&["get", "volumeattachments", "csi-0123", "-w"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    let read_line = async |lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>| {
        tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("a line within 30s")
            .unwrap()
            .expect("output")
    };
    assert!(read_line(&mut lines).await.starts_with("NAME"));
    assert!(read_line(&mut lines).await.contains("false"));
    // kubectl prints the object from a GET, then watches (1.20: from resourceVersion 0, whose
    // replayed ADDED event it does not print). Change the object only once its watch is open,
    // or the change arrives as that ADDED event. apiserver-lite says when the watch is open;
    // against the real server the change is repeated (a new annotation each time) until the
    // watcher prints it.
    target.watch_opened().await;
    let vas: Api<VolumeAttachment> = Api::all(target.client());
    let mut changed = None;
    for attempt in 0..15 {
        vas.patch_status(
            "csi-0123",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"attached": true}})),
        )
        .await
        .unwrap();
        vas.patch(
            "csi-0123",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"attempt": attempt.to_string()}}})),
        )
        .await
        .unwrap();
        if let Ok(line) = tokio::time::timeout(Duration::from_secs(2), lines.next_line()).await {
            changed = Some(line.unwrap().expect("output"));
            break;
        }
    }
    let changed = changed.expect("kubectl get -w printed the change within 30s");
    assert!(
        changed.starts_with("csi-0123") && changed.contains("true"),
        "{changed}"
    );
    watch.kill().await.unwrap();

    // delete of an object with a finalizer waits until the finalizer is removed.
    let mut delete = k
        .command(&["delete", "volumeattachment", "csi-0123"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        delete.try_wait().unwrap().is_none(),
        "kubectl delete must wait for the finalizer"
    );
    assert!(
        vas.get("csi-0123")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_some()
    );
    vas.patch(
        "csi-0123",
        &PatchParams::default(),
        &Patch::Json::<()>(
            serde_json::from_value(json!([{"op": "remove", "path": "/metadata/finalizers"}]))
                .unwrap(),
        ),
    )
    .await
    .unwrap();
    let done = tokio::time::timeout(Duration::from_secs(30), delete.wait_with_output())
        .await
        .expect("delete returns once the finalizer is gone")
        .unwrap();
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    assert!(String::from_utf8_lossy(&done.stdout).contains("deleted"));
    assert!(vas.get_opt("csi-0123").await.unwrap().is_none());

    // apply (client-side: create, then strategic merge patches) and server-side apply.
    let f = k.write("sc.yaml", "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata:\n  name: ebs\nprovisioner: ebs.csi.aws.com\n");
    let created = k.ok(&["apply", "-f", &f]).await;
    assert!(created.contains("created"), "{created}");
    let f = k.write("sc.yaml", "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata:\n  name: ebs\n  labels: {a: b}\nprovisioner: ebs.csi.aws.com\nallowVolumeExpansion: true\n");
    let again = k.ok(&["apply", "-f", &f]).await;
    assert!(again.contains("configured"), "{again}");
    let sc: Value = serde_json::from_str(&k.ok(&["get", "sc", "ebs", "-o", "json"]).await).unwrap();
    assert_eq!(
        (
            sc["metadata"]["labels"]["a"].as_str(),
            sc["allowVolumeExpansion"].as_bool()
        ),
        (Some("b"), Some(true))
    );
    let unchanged = k.ok(&["apply", "-f", &f]).await;
    assert!(unchanged.contains("unchanged"), "{unchanged}");
    // Changing an immutable field through apply fails with the server's message, not a crash.
    let f = k.write("sc.yaml", "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata:\n  name: ebs\n  labels: {a: b}\nprovisioner: other.csi.example.com\nallowVolumeExpansion: true\n");
    let immutable = k.run(&["apply", "-f", &f]).await;
    assert!(
        !immutable.ok
            && immutable
                .stderr
                .contains("updates to provisioner are forbidden"),
        "{}",
        immutable.stderr
    );
    let f = k.write("lease.yaml", "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: ssa\nspec:\n  holderIdentity: kubectl\n");
    let ssa = k.ok(&["apply", "--server-side", "-f", &f]).await;
    assert!(ssa.contains("serverside-applied"), "{ssa}");
    // kubectl 1.21 began hiding managedFields unless asked; 1.20 has no flag and shows them.
    let mut get_mf = vec!["get", "lease", "ssa"];
    if !legacy {
        get_mf.push("--show-managed-fields");
    }
    get_mf.extend(["-o", "jsonpath={.metadata.managedFields[0].manager}"]);
    let mf = k.ok(&get_mf).await;
    assert_eq!(mf, "kubectl");

    // Discovery-driven commands.
    let resources = k.ok(&["api-resources"]).await;
    assert!(
        resources.contains("volumeattachments")
            && resources.contains("csidrivers")
            && resources.contains("pvc"),
        "{resources}"
    );
    let version = k.ok(&["version", "-o", "json"]).await;
    let version: Value = serde_json::from_str(&version).unwrap();
    assert_eq!(version["serverVersion"]["minor"], target.minor());

    // Pods bound to a node are deleted gracefully; --grace-period=0 --force plays the kubelet.
    let out = k
        .ok(&["delete", "pod", "web", "--grace-period=0", "--force"])
        .await;
    assert!(out.contains("deleted"), "{out}");
}
