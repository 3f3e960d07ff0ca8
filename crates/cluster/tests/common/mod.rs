//! The real `csi-cluster` binary as a child process on a temp data dir, and kubectl (the one
//! on PATH) against it.
#![allow(dead_code, unused_imports, clippy::unwrap_used, clippy::expect_used)]

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

/// How long anything may take (a loaded 2-core machine, two clusters at once).
pub const PATIENCE: Duration = Duration::from_secs(120);

/// Whether this machine can run a cluster (root, loop devices, kubectl); says why not.
pub use test_support::can_run_cluster as can_run;
/// Loop devices whose backing file is below a dir, and mount points below it.
pub use test_support::{loop_devices_below, mounts_below};

/// A `csi-cluster up` process. Dropped: SIGKILL, then whatever it left (mounts, loop
/// devices) is cleaned below the data dir, also when an assertion failed.
pub struct Cluster {
    child: Option<Child>,
    pub data_dir: PathBuf,
    pub stdout: PathBuf,
    pub stderr: PathBuf,
}

impl Cluster {
    /// `csi-cluster up --nodes N --timing fast --data-dir DATA --port 0`; `run` numbers the
    /// output files of successive starts on one data dir.
    pub fn start(work: &Path, nodes: usize, run: usize) -> Cluster {
        Self::start_with(work, nodes, run, &[])
    }

    /// [`Cluster::start`] with more flags for `up`.
    pub fn start_with(work: &Path, nodes: usize, run: usize, extra: &[&str]) -> Cluster {
        let data_dir = work.join("data");
        let stdout = work.join(format!("up-{run}.out"));
        let stderr = work.join(format!("up-{run}.err"));
        let child = Command::new(env!("CARGO_BIN_EXE_csi-cluster"))
            .args(["up", "--timing", "fast", "--port", "0", "--nodes"])
            .arg(nodes.to_string())
            .arg("--data-dir")
            .arg(&data_dir)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).unwrap())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap();
        Cluster {
            child: Some(child),
            data_dir,
            stdout,
            stderr,
        }
    }

    fn output(&self) -> String {
        format!(
            "--- stdout:\n{}\n--- stderr:\n{}",
            std::fs::read_to_string(&self.stdout).unwrap_or_default(),
            std::fs::read_to_string(&self.stderr).unwrap_or_default()
        )
    }

    /// Waits for the ready line; fails with the output if the process ends first.
    pub async fn wait_ready(&mut self) {
        let stdout = self.stdout.clone();
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let text = std::fs::read_to_string(&stdout).unwrap_or_default();
            if text.contains(cluster::READY_LINE) {
                return;
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "csi-cluster up ended ({status}) before it was ready:\n{}",
                    self.output()
                );
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "csi-cluster not ready after {PATIENCE:?}:\n{}",
                self.output()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.data_dir.join("kubeconfig")
    }

    /// `kubectl --kubeconfig ... ARGS` with `stdin`; panics with kubectl's output on failure.
    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> String {
        let out = self.kubectl_output(args, stdin);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.output()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn kubectl_output(&self, args: &[&str], stdin: Option<&str>) -> std::process::Output {
        self.kubectl_output_with(Path::new("kubectl"), args, stdin)
    }

    /// [`Cluster::kubectl`] with another kubectl binary (Debian's 1.20).
    pub fn kubectl_with(&self, bin: &Path, args: &[&str], stdin: Option<&str>) -> String {
        let out = self.kubectl_output_with(bin, args, stdin);
        assert!(
            out.status.success(),
            "{} {args:?} failed: {}\n{}",
            bin.display(),
            String::from_utf8_lossy(&out.stderr),
            self.output()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn kubectl_output_with(
        &self,
        bin: &Path,
        args: &[&str],
        stdin: Option<&str>,
    ) -> std::process::Output {
        let mut child = Command::new(bin)
            .arg("--kubeconfig")
            .arg(self.kubeconfig())
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut input = child.stdin.take().unwrap();
        input.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
        drop(input);
        child.wait_with_output().unwrap()
    }

    /// `kubectl get ... -o json`, parsed.
    pub fn get_json(&self, args: &[&str]) -> serde_json::Value {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        serde_json::from_str(&self.kubectl(&all, None)).unwrap()
    }

    /// `csi-cluster status --data-dir ...` (text).
    pub fn status(&self) -> String {
        let out = Command::new(env!("CARGO_BIN_EXE_csi-cluster"))
            .arg("status")
            .arg("--data-dir")
            .arg(&self.data_dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "csi-cluster status failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `csi-cluster status --output json`, parsed.
    pub fn status_json(&self) -> serde_json::Value {
        let (ok, text) = self.run_cli(&["status", "--output", "json"]);
        assert!(ok, "csi-cluster status --output json failed: {text}");
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
    }

    /// SIGTERM, and the exit status once it ended (within PATIENCE).
    pub async fn terminate(&mut self) -> ExitStatus {
        test_support::process::sigterm(self.child.as_ref().unwrap());
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                self.child = None;
                return status;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "csi-cluster still running {PATIENCE:?} after SIGTERM:\n{}",
                self.output()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `csi-cluster ARGS --data-dir DATA` run to its end: (success, stdout + stderr).
    pub fn run_cli(&self, args: &[&str]) -> (bool, String) {
        let out = Command::new(env!("CARGO_BIN_EXE_csi-cluster"))
            .args(args)
            .arg("--data-dir")
            .arg(&self.data_dir)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }

    /// `csi-cluster down --data-dir DATA` (which waits until `up` exited), then `up`'s exit
    /// status.
    pub fn down(&mut self) -> ExitStatus {
        let (ok, text) = self.run_cli(&["down", "--timeout", "120"]);
        assert!(ok, "csi-cluster down failed: {text}\n{}", self.output());
        let status = self.child.as_mut().unwrap().wait().unwrap();
        self.child = None;
        status
    }

    pub fn print_output(&self) {
        eprintln!("{}", self.output());
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        test_support::unmount_all_below(&self.data_dir);
        for (dev, _) in loop_devices_below(&self.data_dir) {
            let _ = Command::new("losetup").arg("-d").arg(dev).status();
        }
    }
}

/// Unix sockets below `dir` (symlinks not followed).
pub fn sockets_below(dir: &Path) -> Vec<PathBuf> {
    use std::os::unix::fs::FileTypeExt;
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                stack.push(entry.path());
            } else if kind.is_socket() {
                found.push(entry.path());
            }
        }
    }
    found
}

/// A claim of `class` for 1Gi and a pod using it, held to `node` by a `nodeSelector` on
/// `kubernetes.io/hostname`: the scheduler picks the node, writes the claim's
/// `volume.kubernetes.io/selected-node` (WaitForFirstConsumer) and binds the pod.
pub fn claim_and_pod(claim: &str, class: &str, pod: &str, node: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: {claim}
spec:
  storageClassName: {class}
  accessModes: [ReadWriteOnce]
  resources:
    requests:
      storage: 1Gi
---
apiVersion: v1
kind: Pod
metadata:
  name: {pod}
spec:
  nodeSelector:
    kubernetes.io/hostname: {node}
  containers:
  - name: app
    image: busybox
    volumeMounts:
    - name: data
      mountPath: /data
  volumes:
  - name: data
    persistentVolumeClaim:
      claimName: {claim}
"#
    )
}

/// The host path of the pod's volume `data` (the node agent's `csi.rs/volume-paths`).
pub fn volume_path(cluster: &Cluster, pod: &str) -> PathBuf {
    let p = cluster.get_json(&["get", "pod", pod]);
    let paths = p["metadata"]["annotations"]["csi.rs/volume-paths"]
        .as_str()
        .unwrap_or_else(|| panic!("pod {pod} has no csi.rs/volume-paths: {p}"));
    let paths: serde_json::Value = serde_json::from_str(paths).unwrap();
    PathBuf::from(paths["data"].as_str().unwrap())
}

/// VolumeAttachments: (node, attached).
pub fn volume_attachments(cluster: &Cluster) -> Vec<(String, bool)> {
    cluster.get_json(&["get", "volumeattachments"])["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|va| {
            (
                va["spec"]["nodeName"].as_str().unwrap().to_string(),
                va["status"]["attached"].as_bool().unwrap_or(false),
            )
        })
        .collect()
}
