//! deploy/ installed on a real cluster from the images `scripts/images` builds here, as an
//! operator installs it: the images are imported into the node's containerd, an overlay of
//! deploy/ is applied with kustomize, and a claim and a pod run through the installed driver.
//! Then uninstall, and nothing of it is left.
//!
//! The test overlay (written per run beside the cluster, `resources:` the repo's overlay) adds
//! only what this sandbox needs, as JSON patches computed from the render and printed:
//! - `hostNetwork: true` and `KUBERNETES_SERVICE_HOST/PORT` = the API server on 127.0.0.1 (the
//!   harness's node has no pod network and no kube-proxy);
//! - free host ports in place of 9808/8080/8081 (host network: the controller and the node
//!   plugin would collide on 9808, and a fixed port may be taken on a test machine), and one
//!   controller replica (a second one on the only node could not get its host ports);
//! - `imagePullPolicy: Never` (no registry);
//! - the kubelet's root dir in place of `/var/lib/kubelet` (the harness's kubelet lives in a
//!   temp dir, so a test never touches the host's), and the hostpath driver's data dir;
//! - for the EBS driver, what EC2 would give it: the region, the node's instance ID and zone
//!   (instance metadata), the device dir of the ec2-sim's attachments (udev's links), and the
//!   endpoint and credentials of the ec2-sim through deploy/'s own optional ConfigMap
//!   `aws-meta` and Secret `aws-secret`.
//!
//! Checked: the controller's sidecars elect leaders (their Leases are held), the node plugin's
//! registrar registers with the kubelet (CSINode), the file the pod writes is on the volume's
//! filesystem on a loop device, and after `kubectl delete -k`: no object of the render, no
//! container, no mount under the kubelet's dir, no registration socket, no CSINode entry, the
//! Leases released, the volume gone from the cloud (EBS) or the data dir (hostpath).
// Test code (helpers included): a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use ebs_cloud::Cloud;
use ebs_cloud_aws::{AwsCloud, AwsConfig, CloudMetrics};
use ec2_sim::{Backing, DeviceLayout, SimConfig, Simulator, Timing};
use k8s_harness::support::{bins_or_skip, workspace_bin};
use k8s_harness::{Cluster, ClusterOptions};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use serde_json::{Value, json};

mod real_support;
use real_support::{eventually, mountinfo_line};

const NODE: &str = "node-deploy";
const ZONE: &str = "us-east-1a";
/// What the pod's init container copies onto the volume (from a ConfigMap).
const GREETING: &str = "written through the driver deploy/ installed";
/// The manifests' kubelet root.
const KUBELET_DIR: &str = "/var/lib/kubelet";
/// The hostpath overlay's data dir on the host.
const HOSTPATH_DATA_DIR: &str = "/var/lib/csi-hostpath-data";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ebs_overlay_installed_from_images_serves_a_pod_and_uninstalls_clean() {
    let Some(run) = Run::start("ebs").await else {
        return;
    };
    // The cloud: ec2-sim on loop devices, its attachment links in a dir under /dev (which the
    // node plugin sees through its /dev hostPath, as udev's links on an instance), and the
    // node's instance.
    let dev_dir = DevDir::new();
    let (key_id, secret) = ("AKIDDEPLOYTEST", "deploy-test-secret");
    let sim = Simulator::start(
        SimConfig {
            state_dir: dev_dir.1.join("ec2"),
            timing: Timing::Fast,
            backing: Backing::Loop,
            device_dir: Some(dev_dir.0.clone()),
            device_layout: DeviceLayout::Shared,
            credentials: ec2_sim::Credentials::single(key_id, secret),
            ..SimConfig::default()
        },
        ([127, 0, 0, 1], 0).into(),
    )
    .await
    .unwrap();
    let cloud = AwsCloud::new(
        AwsConfig {
            region: Some("us-east-1".into()),
            endpoint: Some(sim.endpoint()),
            static_credentials: Some((key_id.into(), secret.into())),
            ..AwsConfig::default()
        },
        CloudMetrics::new(),
    )
    .await
    .unwrap();
    let instance = cloud
        .run_instance("real-deploy-node", Some(ZONE))
        .await
        .unwrap();
    let instance_id = instance.instance_id.clone();
    run.cluster
        .apply(&format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: aws-secret, namespace: kube-system}}\n\
             stringData: {{key_id: {key_id}, access_key: {secret}}}\n---\n\
             apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: aws-meta, namespace: kube-system}}\n\
             data: {{endpoint: \"{}\"}}\n",
            sim.endpoint()
        ))
        .unwrap();

    let mut sandbox = run.sandbox();
    // IMDS's answers and the region, for both sides of the driver.
    for workload in ["ebs-csi-controller", "ebs-csi-node"] {
        sandbox.env(workload, "ebs-plugin", "AWS_REGION", "us-east-1");
    }
    sandbox.env("ebs-csi-node", "ebs-plugin", "CSI_NODE_ID", &instance_id);
    sandbox.env("ebs-csi-node", "ebs-plugin", "AWS_AVAILABILITY_ZONE", ZONE);
    sandbox.arg(
        "ebs-csi-node",
        "ebs-plugin",
        &format!("--dev-root={}", dev_dir.0.display()),
    );
    let installed = run.install(&sandbox);

    let handle = run
        .claim_and_pod(&installed, "ebs-sc", "ebs.csi.aws.com", &instance_id)
        .await;
    let device = sim
        .loop_device(&handle)
        .expect("the attached volume has a loop device");
    run.check_mount(&device);

    run.uninstall(&installed, &handle).await;
    match cloud.get_disk_by_id(&handle).await {
        Err(e) => println!("{handle} is gone from EC2: {e}"),
        Ok(d) => panic!("{handle} outlived its PV: {d:?}"),
    }
    assert_eq!(
        sim.loop_device(&handle),
        None,
        "{handle} still has a loop device"
    );
    sim.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostpath_overlay_installed_from_images_serves_a_pod_and_uninstalls_clean() {
    let Some(run) = Run::start("hostpath").await else {
        return;
    };
    let sandbox = run.sandbox();
    let installed = run.install(&sandbox);

    let handle = run
        .claim_and_pod(&installed, "hostpath", "hostpath.csi.k8s.io", NODE)
        .await;
    // The hostpath driver's volume is a directory of its data dir, bind-mounted.
    let data_dir = run.work.path().join("hostpath-data");
    let volume_dir = find_file(&data_dir, &handle);
    assert!(
        volume_dir.is_some(),
        "{handle} under {}: {:?}",
        data_dir.display(),
        list(&data_dir)
    );
    run.check_mount("");

    run.uninstall(&installed, &handle).await;
    assert_eq!(
        find_file(&data_dir, &handle),
        None,
        "DeleteVolume removes {handle} from the data dir"
    );
}

/// One test's cluster, images and overlay.
struct Run {
    overlay: &'static str,
    work: tempfile::TempDir,
    root: PathBuf,
    cluster: Cluster,
    t0: Instant,
}

/// What `install` applied: the test overlay's dir and the objects of its render.
struct Installed {
    dir: PathBuf,
    objects: Vec<(String, String)>,
}

impl Run {
    /// A cluster with a node (kcm with every controller, the scheduler), and the overlay's
    /// images built by `scripts/images` from the dev binaries and imported into its containerd.
    async fn start(overlay: &'static str) -> Option<Run> {
        let images: &[&str] = match overlay {
            "ebs" => &[
                "ebs-csi-driver",
                "csi-provisioner",
                "csi-attacher",
                "csi-node-driver-registrar",
                // The workload's `cp` (no busybox here).
                "hostpath-csi-driver",
            ],
            _ => &[
                "hostpath-csi-driver",
                "csi-provisioner",
                "csi-node-driver-registrar",
            ],
        };
        for name in images {
            bins_or_skip([*name])?;
        }
        if overlay == "ebs" && !real_support::loop_devices_or_skip() {
            return None;
        }
        if which("python3").is_none() {
            test_support::skip_or_fail("python3 (scripts/images is Python)");
            return None;
        }
        let cluster = Cluster::start_or_skip(ClusterOptions::full("*", NODE)).await?;
        let work = tempfile::tempdir().unwrap();
        let t0 = Instant::now();
        let out = work.path().join("images");
        let target = workspace_bin(images[0])
            .unwrap()
            .parent()
            .unwrap()
            .parent()
            .unwrap()
            .to_path_buf();
        let mut cmd = Command::new(repo_path("scripts/images"));
        cmd.env("CARGO_TARGET_DIR", &target)
            .arg("--out")
            .arg(&out)
            .args(["--profile", "dev", "--no-build"]);
        for name in images {
            cmd.args(["--only", name]);
        }
        let built = cmd.output().unwrap();
        assert!(
            built.status.success(),
            "scripts/images: {}",
            String::from_utf8_lossy(&built.stderr)
        );
        let t_build = t0.elapsed();
        for name in images {
            cluster
                .import_image(&out.join(format!("{name}.tar")))
                .unwrap_or_else(|e| panic!("importing {name}: {e}"));
        }
        println!(
            "images {images:?}: built in {t_build:?}, imported in {:?}",
            t0.elapsed() - t_build
        );
        let root = cluster.kubelet_root_dir().unwrap().to_path_buf();
        Some(Run {
            overlay,
            work,
            root,
            cluster,
            t0: Instant::now(),
        })
    }

    fn sandbox(&self) -> Sandbox {
        let port = self
            .cluster
            .server()
            .rsplit(':')
            .next()
            .unwrap()
            .to_string();
        let mut paths = vec![(KUBELET_DIR.to_string(), self.root.display().to_string())];
        if self.overlay == "hostpath" {
            let data = self.work.path().join("hostpath-data");
            paths.push((HOSTPATH_DATA_DIR.into(), data.display().to_string()));
        }
        Sandbox {
            api_port: port,
            paths,
            env: Vec::new(),
            args: Vec::new(),
        }
    }

    /// Writes the test overlay over deploy/'s and applies it with `kubectl apply -k`.
    fn install(&self, sandbox: &Sandbox) -> Installed {
        let base = repo_path(&format!("deploy/kubernetes/overlays/{}", self.overlay));
        let rendered = kustomize(&base);
        let dir = self.work.path().join("overlay");
        std::fs::create_dir_all(&dir).unwrap();
        let mut patches = Vec::new();
        for doc in &rendered {
            let ops = sandbox.patch(doc);
            if ops.is_empty() {
                continue;
            }
            println!(
                "test overlay: {} {}: {}",
                doc["kind"].as_str().unwrap(),
                doc["metadata"]["name"].as_str().unwrap(),
                serde_json::to_string(&ops).unwrap()
            );
            patches.push(json!({
                "target": {
                    "kind": doc["kind"],
                    "name": doc["metadata"]["name"],
                },
                "patch": serde_json::to_string(&ops).unwrap(),
            }));
        }
        let kustomization = json!({
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            // kustomize refuses absolute resource paths.
            "resources": [relative(&dir, &base)],
            "patches": patches,
        });
        std::fs::write(
            dir.join("kustomization.yaml"),
            serde_json::to_string_pretty(&kustomization).unwrap(),
        )
        .unwrap();
        let out = self
            .cluster
            .kubectl(&["apply", "-k", dir.to_str().unwrap()])
            .unwrap();
        println!("kubectl apply -k:\n{out}");
        let objects = kustomize(&dir)
            .iter()
            .map(|d| {
                (
                    d["kind"].as_str().unwrap().to_string(),
                    d["metadata"]["name"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        Installed { dir, objects }
    }

    fn logs(&self) -> Vec<PathBuf> {
        ["kubelet", "kube-controller-manager", "kube-scheduler"]
            .iter()
            .map(|c| self.cluster.log_path(c))
            .chain(container_logs())
            .collect()
    }

    /// The installed driver at work: leaders elected, registered with the kubelet, a claim of
    /// `class` provisioned and a pod writing to it. Gives the volume handle.
    async fn claim_and_pod(
        &self,
        installed: &Installed,
        class: &str,
        driver: &str,
        node_id: &str,
    ) -> String {
        let admin = self.cluster.admin_client().await.unwrap();
        let logs = self.logs();

        // The node plugin registered through the kubelet's plugin watcher.
        let csinodes: Api<CSINode> = Api::all(admin.clone());
        let entry = eventually(&format!("CSINode {NODE} to list {driver}"), &logs, || {
            let csinodes = csinodes.clone();
            async move {
                let n = csinodes.get_opt(NODE).await.ok().flatten()?;
                n.spec.drivers.into_iter().find(|d| d.name == driver)
            }
        })
        .await;
        assert_eq!(entry.node_id, node_id);
        println!(
            "{driver} registered {:?} after the apply",
            self.t0.elapsed()
        );

        // Each sidecar of the controller holds its Lease.
        let leases: Api<Lease> = Api::namespaced(admin.clone(), "kube-system");
        let held = eventually("the sidecars' Leases held", &logs, || {
            let leases = leases.clone();
            async move {
                let held: BTreeMap<String, String> = leases
                    .list(&ListParams::default())
                    .await
                    .ok()?
                    .items
                    .into_iter()
                    .filter(|l| {
                        !l.metadata
                            .name
                            .as_deref()
                            .unwrap_or("")
                            .starts_with("kube-")
                    })
                    .filter_map(|l| {
                        let holder = l.spec?.holder_identity.filter(|h| !h.is_empty())?;
                        Some((l.metadata.name?, holder))
                    })
                    .collect();
                let want = if driver == "ebs.csi.aws.com" { 2 } else { 1 };
                (held.len() >= want).then_some(held)
            }
        })
        .await;
        let lease_prefix = driver.replace('.', "-");
        assert!(
            held.keys().any(|k| k == &lease_prefix),
            "the provisioner's Lease {lease_prefix}: {held:?}"
        );
        if driver == "ebs.csi.aws.com" {
            assert!(
                held.contains_key(&format!("external-attacher-leader-{lease_prefix}")),
                "the attacher's Lease: {held:?}"
            );
        }
        println!("leaders {held:?}");
        assert!(
            installed
                .objects
                .iter()
                .any(|(k, n)| k == "StorageClass" && n == class),
            "the overlay installs the class {class}"
        );

        self.cluster
            .apply(&format!(
                r#"apiVersion: v1
kind: ConfigMap
metadata: {{name: greeting, namespace: default}}
data: {{hello: "{GREETING}"}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: data, namespace: default}}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: {class}
  resources: {{requests: {{storage: 1Gi}}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: writer, namespace: default}}
spec:
  hostNetwork: true
  initContainers:
  - name: write
    image: csi-rs/hostpath-csi-driver:v0.1.0
    imagePullPolicy: Never
    command: [/usr/bin/cp, /greeting/hello, /data/hello]
    volumeMounts: [{{name: data, mountPath: /data}}, {{name: greeting, mountPath: /greeting}}]
  containers:
  - name: app
    image: {pause}
    imagePullPolicy: Never
    volumeMounts: [{{name: data, mountPath: /data}}]
  volumes:
  - name: data
    persistentVolumeClaim: {{claimName: data}}
  - name: greeting
    configMap: {{name: greeting}}
"#,
                pause = k8s_harness::PAUSE_IMAGE
            ))
            .unwrap();
        let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
        let t = Instant::now();
        // The driver's containers run by now: their logs too, should the pod not come up.
        real_support::ready_pod(&pods, "writer", &self.logs()).await;
        println!("pod writer Ready in {:?}", t.elapsed());
        let claim = Api::<PersistentVolumeClaim>::namespaced(admin.clone(), "default")
            .get("data")
            .await
            .unwrap();
        let pv_name = claim.spec.unwrap().volume_name.expect("bound");
        let pv = Api::<PersistentVolume>::all(admin.clone())
            .get(&pv_name)
            .await
            .unwrap();
        let csi = pv.spec.unwrap().csi.expect("a CSI PV");
        assert_eq!(csi.driver, driver);
        csi.volume_handle
    }

    /// The pod's volume is mounted where the kubelet wants it, from `device` (any device when
    /// empty), and holds the file the pod wrote.
    fn check_mount(&self, device: &str) {
        let pods_dir = self.root.join("pods");
        let mount = std::fs::read_dir(&pods_dir)
            .unwrap()
            .flatten()
            .map(|p| p.path().join("volumes/kubernetes.io~csi"))
            .filter_map(|d| std::fs::read_dir(d).ok())
            .flat_map(|d| d.flatten().map(|e| e.path().join("mount")))
            .find(|m| m.join("hello").is_file())
            .unwrap_or_else(|| panic!("no CSI volume under {} holds hello", pods_dir.display()));
        assert_eq!(
            std::fs::read_to_string(mount.join("hello")).unwrap(),
            GREETING
        );
        let line = mountinfo_line(&mount)
            .unwrap_or_else(|| panic!("{} is not a mount point", mount.display()));
        if !device.is_empty() {
            assert!(
                line.split(" - ").nth(1).unwrap().contains(device),
                "{} mounted from {device}: {line}",
                mount.display()
            );
        }
        println!("{}: {line}", mount.display());
    }

    /// Deletes the workload, then `kubectl delete -k` the overlay, and checks nothing is left.
    async fn uninstall(&self, installed: &Installed, handle: &str) {
        let admin = self.cluster.admin_client().await.unwrap();
        let logs = self.logs();
        let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
        pods.delete("writer", &DeleteParams::default())
            .await
            .unwrap();
        eventually("pod writer gone", &logs, || {
            let pods = pods.clone();
            async move { pods.get_opt("writer").await.ok()?.is_none().then_some(()) }
        })
        .await;
        Api::<PersistentVolumeClaim>::namespaced(admin.clone(), "default")
            .delete("data", &DeleteParams::default())
            .await
            .unwrap();
        let pvs: Api<PersistentVolume> = Api::all(admin.clone());
        let vas: Api<VolumeAttachment> = Api::all(admin.clone());
        eventually(
            &format!("the PV of {handle} and its VolumeAttachment gone"),
            &logs,
            || {
                let (pvs, vas) = (pvs.clone(), vas.clone());
                async move {
                    let pv_left = pvs.list(&ListParams::default()).await.ok()?.items;
                    let va_left = vas.list(&ListParams::default()).await.ok()?.items;
                    (pv_left.is_empty() && va_left.is_empty()).then_some(())
                }
            },
        )
        .await;

        // A rolling update's handover: the controller's pods stop on SIGTERM and each leader
        // gives its Lease up on the way out, so a new leader need not wait for it to expire.
        let (controller, kind) = match self.overlay {
            "ebs" => ("ebs-csi-controller", "deployment"),
            _ => ("csi-hostpathplugin", "statefulset"),
        };
        self.cluster
            .kubectl(&[
                "scale",
                "-n",
                "kube-system",
                &format!("{kind}/{controller}"),
                "--replicas=0",
            ])
            .unwrap();
        let system: Api<Pod> = Api::namespaced(admin.clone(), "kube-system");
        let selector = format!("app.kubernetes.io/name={controller}");
        eventually(&format!("{controller}'s pods gone"), &logs, || {
            let (system, selector) = (system.clone(), selector.clone());
            async move {
                let left = system
                    .list(&ListParams::default().labels(&selector))
                    .await
                    .ok()?;
                left.items.is_empty().then_some(())
            }
        })
        .await;
        let leases: Api<Lease> = Api::namespaced(admin.clone(), "kube-system");
        let ours: Vec<String> = leases
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter_map(|l| {
                let name = l.metadata.name.clone()?;
                if name.starts_with("kube-") {
                    return None;
                }
                let holder = l.spec.and_then(|s| s.holder_identity).unwrap_or_default();
                assert_eq!(holder, "", "Lease {name} still held after its pod stopped");
                Some(name)
            })
            .collect();
        assert!(!ours.is_empty(), "the sidecars' Leases");
        println!("Leases released on SIGTERM: {ours:?}");

        let t = Instant::now();
        let out = self
            .cluster
            .kubectl(&[
                "delete",
                "-k",
                installed.dir.to_str().unwrap(),
                "--wait=true",
            ])
            .unwrap();
        println!("kubectl delete -k ({:?}):\n{out}", t.elapsed());
        eventually("the driver's pods gone", &logs, || {
            let system = system.clone();
            async move {
                let left = system
                    .list(&ListParams::default().labels("app.kubernetes.io/part-of=csi-rs"))
                    .await
                    .ok()?;
                left.items.is_empty().then_some(())
            }
        })
        .await;
        println!("uninstalled in {:?}", t.elapsed());
        for (kind, name) in &installed.objects {
            let kind = kind.to_lowercase();
            let got = self.cluster.kubectl(&[
                "get",
                &kind,
                name,
                "-n",
                "kube-system",
                "--ignore-not-found",
                "-o",
                "name",
            ]);
            assert_eq!(
                got.unwrap().trim(),
                "",
                "{kind} {name} outlived the uninstall"
            );
        }
        // What deploy/README.md says is left: the Leases, which its one command deletes.
        let mut delete_leases = vec!["delete", "lease", "-n", "kube-system"];
        delete_leases.extend(ours.iter().map(String::as_str));
        self.cluster.kubectl(&delete_leases).unwrap();
        let left: Vec<String> = leases
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter_map(|l| l.metadata.name)
            .filter(|n| !n.starts_with("kube-"))
            .collect();
        assert!(left.is_empty(), "Leases left: {left:?}");
        let csinodes: Api<CSINode> = Api::all(admin.clone());
        eventually("the driver gone from CSINode", &logs, || {
            let csinodes = csinodes.clone();
            async move {
                let n = csinodes.get_opt(NODE).await.ok().flatten()?;
                n.spec.drivers.is_empty().then_some(())
            }
        })
        .await;
        let registry = self.root.join("plugins_registry");
        let sockets = list(&registry);
        assert!(sockets.is_empty(), "{}: {sockets:?}", registry.display());
        eventually("the node's containers gone", &logs, || async {
            let out = Command::new("ctr")
                .arg("-a")
                .arg(self.cluster.containerd_socket().unwrap())
                .args(["-n", "k8s.io", "containers", "list", "-q"])
                .output()
                .ok()?;
            String::from_utf8_lossy(&out.stdout)
                .trim()
                .is_empty()
                .then_some(())
        })
        .await;
        let mounts: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .filter_map(|l| l.split(' ').nth(4).map(str::to_owned))
            .filter(|p| Path::new(p).starts_with(&self.root) && Path::new(p) != self.root)
            .collect();
        assert!(
            mounts.is_empty(),
            "mounts left under the kubelet's dir: {mounts:?}"
        );
    }
}

/// The sandbox's adjustments to deploy/'s workloads (see the module comment).
struct Sandbox {
    api_port: String,
    /// Host path prefixes replaced: the manifests' → this run's.
    paths: Vec<(String, String)>,
    /// (workload, container, name, value) added to the container's env.
    env: Vec<(String, String, String, String)>,
    /// (workload, container, argument) appended to the container's args.
    args: Vec<(String, String, String)>,
}

impl Sandbox {
    fn env(&mut self, workload: &str, container: &str, name: &str, value: &str) {
        self.env
            .push((workload.into(), container.into(), name.into(), value.into()));
    }

    fn arg(&mut self, workload: &str, container: &str, arg: &str) {
        self.args
            .push((workload.into(), container.into(), arg.into()));
    }

    /// JSON patch operations for one rendered object (none for what is not a workload).
    fn patch(&self, doc: &Value) -> Vec<Value> {
        let kind = doc["kind"].as_str().unwrap_or("");
        if !["Deployment", "DaemonSet", "StatefulSet"].contains(&kind) {
            return Vec::new();
        }
        let workload = doc["metadata"]["name"].as_str().unwrap();
        let spec = &doc["spec"]["template"]["spec"];
        let mut ops =
            vec![json!({"op": "add", "path": "/spec/template/spec/hostNetwork", "value": true})];
        if kind == "Deployment" && doc["spec"]["replicas"].as_i64().unwrap_or(1) > 1 {
            ops.push(json!({"op": "replace", "path": "/spec/replicas", "value": 1}));
        }
        for (i, c) in spec["containers"].as_array().unwrap().iter().enumerate() {
            let name = c["name"].as_str().unwrap();
            let at = format!("/spec/template/spec/containers/{i}");
            ops.push(
                json!({"op": "add", "path": format!("{at}/imagePullPolicy"), "value": "Never"}),
            );
            let mut env = vec![
                json!({"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"}),
                json!({"name": "KUBERNETES_SERVICE_PORT", "value": self.api_port}),
            ];
            env.extend(
                self.env
                    .iter()
                    .filter(|(w, n, _, _)| w == workload && n == name)
                    .map(|(_, _, k, v)| json!({"name": k, "value": v})),
            );
            if c["env"].is_array() {
                for e in env {
                    ops.push(json!({"op": "add", "path": format!("{at}/env/-"), "value": e}));
                }
            } else {
                ops.push(json!({"op": "add", "path": format!("{at}/env"), "value": env}));
            }
            // Host network: each served port becomes a free one, in the port list and in the
            // --http-endpoint argument that opens it.
            let mut args: Vec<String> = c["args"]
                .as_array()
                .map(|a| a.iter().map(|v| v.as_str().unwrap().to_string()).collect())
                .unwrap_or_default();
            for (j, p) in c["ports"].as_array().into_iter().flatten().enumerate() {
                let old = p["containerPort"].as_u64().unwrap();
                let new = free_port();
                ops.push(json!({"op": "replace", "path": format!("{at}/ports/{j}/containerPort"), "value": new}));
                for a in &mut args {
                    if a.starts_with("--http-endpoint=") && a.ends_with(&format!(":{old}")) {
                        *a = format!("{}:{new}", a.rsplit_once(':').unwrap().0);
                    }
                }
            }
            args = args.iter().map(|a| self.rewrite(a)).collect();
            args.extend(
                self.args
                    .iter()
                    .filter(|(w, n, _)| w == workload && n == name)
                    .map(|(_, _, a)| a.clone()),
            );
            if c["args"].is_array() || !args.is_empty() {
                ops.push(json!({"op": "add", "path": format!("{at}/args"), "value": args}));
            }
        }
        // Host paths: the kubelet's dir and the hostpath driver's data dir, wherever else they
        // are named (volumes, mount paths, the registration path, the registrar's probe).
        let mut strings = Vec::new();
        collect_strings(spec, "/spec/template/spec", &mut strings);
        let is_args = |p: &str| {
            p.strip_prefix("/spec/template/spec/containers/")
                .and_then(|rest| rest.split_once('/'))
                .is_some_and(|(_, field)| field.starts_with("args/"))
        };
        for (pointer, s) in strings {
            let value = self.rewrite(&s);
            if value != s && !is_args(&pointer) {
                ops.push(json!({"op": "replace", "path": pointer, "value": value}));
            }
        }
        ops
    }

    /// `s` with a manifest path prefix replaced by this run's (also inside `--flag=PATH`).
    fn rewrite(&self, s: &str) -> String {
        let (flag, value) = match s.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (format!("{f}="), v),
            _ => (String::new(), s),
        };
        for (from, to) in &self.paths {
            if let Some(rest) = value.strip_prefix(from.as_str()) {
                return format!("{flag}{to}{rest}");
            }
        }
        s.to_string()
    }
}

/// Every string under `v` with its JSON pointer.
fn collect_strings(v: &Value, pointer: &str, out: &mut Vec<(String, String)>) {
    match v {
        Value::String(s) => out.push((pointer.to_string(), s.clone())),
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                collect_strings(x, &format!("{pointer}/{i}"), out);
            }
        }
        Value::Object(o) => {
            for (k, x) in o {
                let k = k.replace('~', "~0").replace('/', "~1");
                collect_strings(x, &format!("{pointer}/{k}"), out);
            }
        }
        _ => {}
    }
}

/// Where this run keeps ec2-sim's attachment links (a dir under /dev, as udev's links on an
/// instance) and its state (the volumes' backing files), both named by the test's pid and
/// removed on drop. A run that was killed never drops them: the next run sweeps what runs
/// whose pid is gone left, loop devices included.
struct DevDir(PathBuf, PathBuf);

const RUN_PREFIX: &str = "csi-rs-real-deploy-";

impl DevDir {
    fn new() -> DevDir {
        sweep_killed_runs();
        let pid = std::process::id();
        let dir = PathBuf::from(format!("/dev/{RUN_PREFIX}{pid}"));
        let state = PathBuf::from(format!("/var/tmp/{RUN_PREFIX}{pid}"));
        for d in [&dir, &state] {
            std::fs::create_dir_all(d).unwrap();
        }
        DevDir(dir, state)
    }
}

impl Drop for DevDir {
    fn drop(&mut self) {
        // ec2-sim has released its loop devices by now (its shutdown detaches them).
        let _ = std::fs::remove_dir_all(&self.0);
        let _ = std::fs::remove_dir_all(&self.1);
    }
}

/// Removes the dirs of runs whose process is gone, after detaching the loop devices backed by
/// files in their state dir (unmounting what still uses them first).
fn sweep_killed_runs() {
    for parent in ["/dev", "/var/tmp"] {
        let Ok(entries) = std::fs::read_dir(parent) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(pid) = name.strip_prefix(RUN_PREFIX) else {
                continue;
            };
            if Path::new("/proc").join(pid).exists() {
                continue;
            }
            let path = e.path();
            if parent == "/var/tmp" {
                for (dev, backing) in test_support::loop_devices() {
                    if Path::new(&backing).starts_with(&path) {
                        test_support::unmount_device(&dev);
                        let _ = Command::new("losetup").arg("-d").arg(&dev).status();
                    }
                }
            }
            eprintln!("removing {} (left by a killed run)", path.display());
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

fn kustomize(dir: &Path) -> Vec<Value> {
    let out = Command::new("kubectl")
        .args(["kustomize", dir.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl kustomize {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&String::from_utf8(out.stdout).unwrap()).unwrap();
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

fn repo_path(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel)
        .canonicalize()
        .unwrap()
}

/// `to` as a path relative to `from` (both absolute).
fn relative(from: &Path, to: &Path) -> String {
    let from: Vec<_> = from.components().collect();
    let to: Vec<_> = to.components().collect();
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut rel = PathBuf::new();
    for _ in common..from.len() {
        rel.push("..");
    }
    for c in &to[common..] {
        rel.push(c);
    }
    rel.display().to_string()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("0.0.0.0:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(tool))
            .find(|f| f.is_file())
    })
}

/// The kubelet's logs of the driver's containers (kube-system), for failure messages.
fn container_logs() -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(pods) = std::fs::read_dir("/var/log/pods") {
        for pod in pods.flatten() {
            if !pod
                .file_name()
                .to_string_lossy()
                .starts_with("kube-system_")
            {
                continue;
            }
            for c in std::fs::read_dir(pod.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                for f in std::fs::read_dir(c.path()).into_iter().flatten().flatten() {
                    out.push(f.path());
                }
            }
        }
    }
    out
}

fn find_file(dir: &Path, name: &str) -> Option<PathBuf> {
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        if e.file_name().to_string_lossy() == name {
            return Some(e.path());
        }
        if e.path().is_dir() {
            if let Some(f) = find_file(&e.path(), name) {
                return Some(f);
            }
        }
    }
    None
}

fn list(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}
