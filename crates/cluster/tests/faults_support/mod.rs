//! What the fault test needs around an in-process cluster: a guard that leaves nothing
//! mounted or looped on failure, a timeline, and API calls that ride out an API server restart
//! (every call retries until its deadline).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};

/// The node agent's annotation with each volume's host path.
const VOLUME_PATHS: &str = "csi.rs/volume-paths";

/// Cleans the data dir on every way out: whatever mounts and loop devices are left below it
/// go; after a failure the tail of every component log is printed first, since the temp dir
/// (and the logs in it) goes right after.
pub struct DataDirGuard {
    pub dir: PathBuf,
}

impl Drop for DataDirGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            print_log_tails(&self.dir.join("logs"), 40);
        }
        // For a look at the components' logs after a run.
        if let Some(to) = std::env::var_os("CSI_RS_FAULTS_KEEP_LOGS") {
            let _ = std::process::Command::new("cp")
                .arg("-r")
                .arg(self.dir.join("logs"))
                .arg(&to)
                .status();
        }
        test_support::unmount_all_below(&self.dir);
        for (dev, _) in crate::common::loop_devices_below(&self.dir) {
            let _ = std::process::Command::new("losetup")
                .arg("-d")
                .arg(dev)
                .status();
        }
    }
}

fn print_log_tails(dir: &Path, lines: usize) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        let tail = &all[all.len().saturating_sub(lines)..];
        eprintln!("---- {} (last {} lines)", e.path().display(), tail.len());
        for l in tail {
            eprintln!("{l}");
        }
    }
}

/// What happened when, from the test's start.
pub struct Timeline {
    start: Instant,
    lines: Mutex<Vec<String>>,
}

impl Timeline {
    pub fn new() -> Self {
        Self {
            start: Instant::now(),
            lines: Mutex::new(Vec::new()),
        }
    }

    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// Records and prints one line at once (a hung test still shows how far it came).
    pub fn note(&self, what: impl AsRef<str>) {
        let line = format!("{:7.2}s  {}", self.elapsed().as_secs_f64(), what.as_ref());
        println!("{line}");
        self.lines.lock().unwrap().push(line);
    }

    pub fn print(&self) {
        println!("---- fault test timeline");
        for l in self.lines.lock().unwrap().iter() {
            println!("{l}");
        }
    }
}

/// Runs `call` until it succeeds or `deadline` passes; errors in between (the API server
/// restarting, a conflict) are retried after a short pause.
pub async fn retry<T, E, F, Fut>(what: &str, deadline: Instant, mut call: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: std::fmt::Display,
{
    loop {
        match call().await {
            Ok(v) => return v,
            Err(e) => {
                assert!(Instant::now() < deadline, "{what}: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

pub fn claim_name(i: usize) -> String {
    format!("data-{i}")
}

pub fn pod_name(i: usize) -> String {
    format!("app-{i}")
}

/// Creates claim `data-<i>` on `ebs-sc` (ReadWriteOnce, 1Gi); an earlier attempt that went
/// through before an error counts.
pub async fn create_claim(client: &Client, i: usize, deadline: Instant) {
    let claim: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim_name(i)},
        "spec": {
            "storageClassName": "ebs-sc",
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}}
        }
    }))
    .unwrap();
    let api: Api<PersistentVolumeClaim> = Api::default_namespaced(client.clone());
    retry(
        &format!("creating claim {}", claim_name(i)),
        deadline,
        || async {
            match api.create(&PostParams::default(), &claim).await {
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
                other => other.map(|_| ()),
            }
        },
    )
    .await;
}

/// Creates pod `app-<i>` using claim `data-<i>`, held to `node` by a `nodeSelector` (the
/// scheduler binds it). No container runs: the node agent marks it Ready once the volume is
/// published.
pub async fn create_pod(client: &Client, i: usize, node: &str, deadline: Instant) {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod_name(i)},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [{
                "name": "app",
                "image": "busybox",
                "volumeMounts": [{"name": "data", "mountPath": "/data"}]
            }],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim_name(i)}}]
        }
    }))
    .unwrap();
    let api: Api<Pod> = Api::default_namespaced(client.clone());
    retry(
        &format!("creating pod {}", pod_name(i)),
        deadline,
        || async {
            match api.create(&PostParams::default(), &pod).await {
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
                other => other.map(|_| ()),
            }
        },
    )
    .await;
}

/// The host path of pod `app-<i>`'s volume once it is Ready on `node`.
pub fn ready_path(pod: &Pod, node: &str) -> Option<PathBuf> {
    if pod.metadata.deletion_timestamp.is_some()
        || pod.spec.as_ref()?.node_name.as_deref() != Some(node)
    {
        return None;
    }
    let ready = pod
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    if !ready {
        return None;
    }
    let paths = pod.metadata.annotations.as_ref()?.get(VOLUME_PATHS)?;
    let paths: serde_json::Value = serde_json::from_str(paths).ok()?;
    paths["data"].as_str().map(PathBuf::from)
}

/// Waits until pod `app-<i>` is Ready on `node`; its volume's host path. Panics at `deadline`
/// with the pod's status.
pub async fn wait_ready(client: &Client, i: usize, node: &str, deadline: Instant) -> PathBuf {
    let api: Api<Pod> = Api::default_namespaced(client.clone());
    loop {
        let last = match api.get_opt(&pod_name(i)).await {
            Ok(Some(p)) => {
                if let Some(path) = ready_path(&p, node) {
                    return path;
                }
                serde_json::to_string(&p.status).unwrap_or_default()
            }
            Ok(None) => "no such pod".into(),
            Err(e) => e.to_string(),
        };
        assert!(
            Instant::now() < deadline,
            "pod {} not Ready on {node} in time; last: {last}",
            pod_name(i)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Deletes pod `app-<i>` (gracefully: the node agent unpublishes and unstages, then confirms)
/// and waits until it is gone.
pub async fn delete_pod(client: &Client, i: usize, deadline: Instant) {
    ask_to_delete_pod(client, i, deadline).await;
    let api: Api<Pod> = Api::default_namespaced(client.clone());
    wait_gone(&api, &pod_name(i), deadline).await;
}

/// Deletes pod `app-<i>` without waiting for it to go: on return the API server has accepted
/// the delete (the pod has its deletionTimestamp, or is gone).
pub async fn ask_to_delete_pod(client: &Client, i: usize, deadline: Instant) {
    let api: Api<Pod> = Api::default_namespaced(client.clone());
    let name = pod_name(i);
    retry(&format!("deleting pod {name}"), deadline, || async {
        match api.delete(&name, &DeleteParams::default()).await {
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            other => other.map(|_| ()),
        }
    })
    .await;
}

/// Waits until `name` is gone from `api`.
pub async fn wait_gone<K>(api: &Api<K>, name: &str, deadline: Instant)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    loop {
        if let Ok(None) = api.get_opt(name).await {
            return;
        }
        assert!(Instant::now() < deadline, "{name} still there");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub async fn list<K>(client: &Client, deadline: Instant) -> Vec<K>
where
    K: kube::Resource<Scope = k8s_openapi::ClusterResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::all(client.clone());
    retry("listing", deadline, || async {
        api.list(&ListParams::default()).await.map(|l| l.items)
    })
    .await
}

pub async fn volume_attachments(client: &Client, deadline: Instant) -> Vec<VolumeAttachment> {
    list(client, deadline).await
}

pub async fn volumes(client: &Client, deadline: Instant) -> Vec<PersistentVolume> {
    list(client, deadline).await
}

/// Claim `data-<i>`'s PV name, once bound.
pub async fn bound_volume(client: &Client, i: usize, deadline: Instant) -> String {
    let api: Api<PersistentVolumeClaim> = Api::default_namespaced(client.clone());
    loop {
        if let Ok(c) = api.get(&claim_name(i)).await
            && let Some(v) = c.spec.and_then(|s| s.volume_name)
        {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "claim {} not bound in time",
            claim_name(i)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Whether claim `data-<i>` has the scheduler's selected node (the provisioner's cue).
pub async fn has_selected_node(client: &Client, i: usize) -> bool {
    let api: Api<PersistentVolumeClaim> = Api::default_namespaced(client.clone());
    api.get(&claim_name(i)).await.is_ok_and(|c| {
        c.metadata
            .annotations
            .is_some_and(|a| a.contains_key("volume.kubernetes.io/selected-node"))
    })
}

/// The content of pod `i`'s file: unique to the pod, 256 KiB so it spans many blocks.
pub fn content(i: usize) -> Vec<u8> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (i as u64 + 1);
    let mut out = format!(
        "written for claim {} through pod {}\n",
        claim_name(i),
        pod_name(i)
    )
    .into_bytes();
    while out.len() < 256 * 1024 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out
}

pub const FILE: &str = "data.bin";

/// Writes pod `i`'s file through its volume's host path, synced to the device (a killed node
/// agent does not unmount, and the volume moves to another instance afterwards).
pub fn write_file(path: &Path, i: usize) {
    use std::io::Write as _;
    let p = path.join(FILE);
    let mut f = std::fs::File::create(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    f.write_all(&content(i)).unwrap();
    f.sync_all().unwrap();
}

/// Whether pod `i`'s file is there, byte for byte.
pub fn check_file(path: &Path, i: usize) -> Result<(), String> {
    let p = path.join(FILE);
    let got = std::fs::read(&p).map_err(|e| format!("{}: {e}", p.display()))?;
    if got == content(i) {
        Ok(())
    } else {
        Err(format!(
            "{}: {} bytes, not the {} written for pod {i}",
            p.display(),
            got.len(),
            content(i).len()
        ))
    }
}
