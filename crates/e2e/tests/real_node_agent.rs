//! `csi-node-agent` as a node of a real control plane: kube-apiserver, kube-controller-manager
//! (its own attach/detach and PV controllers) and kube-scheduler v1.26, no kubelet. Our agent
//! registers the Node and its Lease, is the plugin watcher for `csi-node-driver-registrar`,
//! writes CSINode, volumesInUse and the pod's status; kcm's ADC attaches through our
//! csi-attacher, our agent stages and publishes through `ebs-csi-driver` on an embedded EC2,
//! and tears down and removes the pod when it is deleted.
// Test code (helpers included): a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Instant;

use k8s_harness::support::{bins_or_skip, spawn_component};
use k8s_harness::{Cluster, ClusterOptions};
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use kube::Api;
use kube::api::{DeleteParams, ListParams};

mod real_support;
use real_support::{claim_yaml, eventually, is_mount_point, manifest};

const DRIVER: &str = "ebs.csi.aws.com";
const NODE: &str = "agent-node";

/// The agent's credentials: the node's own identity (user `system:node:agent-node`, group
/// `system:nodes`), under kube-apiserver's Node authorizer and NodeRestriction, as a kubelet.
/// It reads only its own pods' claims, PVs and VolumeAttachments (GETs; a new pod's claim
/// read after the pod was seen), its own CSINode, and writes pod status, not pod metadata.
fn agent_identity(cluster: &Cluster) -> PathBuf {
    cluster
        .user_kubeconfig(&format!("system:node:{NODE}"), &["system:nodes"])
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_agent_serves_a_pod_under_real_kcm_and_scheduler() {
    let Some(
        [
            driver_bin,
            registrar_bin,
            attacher_bin,
            provisioner_bin,
            agent_bin,
        ],
    ) = bins_or_skip([
        "ebs-csi-driver",
        "csi-node-driver-registrar",
        "csi-attacher",
        "csi-provisioner",
        "csi-node-agent",
    ])
    else {
        return;
    };
    if !real_support::loop_devices_or_skip() {
        return;
    }
    let options = ClusterOptions::control_plane()
        .controller_manager("*")
        .scheduler();
    let Some(cluster) = Cluster::start_or_skip(options).await else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let root = work.path().join("kubelet");
    let log = |name: &str| work.path().join(format!("{name}.log"));
    let plugin_dir = root.join("plugins").join(DRIVER);
    std::fs::create_dir_all(&plugin_dir).unwrap();
    let socket = plugin_dir.join("csi.sock");
    let endpoint = format!("unix://{}", socket.display());
    let sa = real_support::deploy_controller_objects(&cluster).await;
    let agent_kubeconfig = agent_identity(&cluster);

    let _driver = spawn_component(
        &driver_bin,
        &[
            "--mode=all".into(),
            format!("--endpoint={endpoint}"),
            format!("--embedded-ec2={}", work.path().join("ec2").display()),
        ],
        &log("ebs-plugin"),
    );
    let _agent = spawn_component(
        &agent_bin,
        &[
            format!("--node-name={NODE}"),
            format!("--kubeconfig={}", agent_kubeconfig.display()),
            format!("--root-dir={}", root.display()),
            "--v=4".into(),
        ],
        &log("node-agent"),
    );
    let _registrar = spawn_component(
        &registrar_bin,
        &[
            format!("--csi-address={}", socket.display()),
            format!("--kubelet-registration-path={}", socket.display()),
            format!(
                "--plugin-registration-path={}",
                root.join("plugins_registry").display()
            ),
        ],
        &log("registrar"),
    );
    let common = |bin_log: &str| -> Vec<String> {
        let _ = bin_log;
        vec![
            format!("--csi-address={}", socket.display()),
            format!("--kubeconfig={}", sa.display()),
            "--timeout=60s".into(),
            "--leader-election".into(),
            "--leader-election-namespace=kube-system".into(),
        ]
    };
    let _attacher = spawn_component(&attacher_bin, &common("csi-attacher"), &log("csi-attacher"));
    let mut provisioner_args = common("csi-provisioner");
    provisioner_args.extend([
        "--feature-gates=Topology=true".into(),
        "--default-fstype=ext4".into(),
    ]);
    let _provisioner =
        spawn_component(&provisioner_bin, &provisioner_args, &log("csi-provisioner"));
    let kcm_log = cluster.log_path("kube-controller-manager");
    let sched_log = cluster.log_path("kube-scheduler");
    let logs = [
        log("node-agent"),
        log("ebs-plugin"),
        log("csi-attacher"),
        log("csi-provisioner"),
        kcm_log,
        sched_log,
    ];
    let logs: Vec<&Path> = logs.iter().map(PathBuf::as_path).collect();

    let admin = cluster.admin_client().await.unwrap();
    let nodes: Api<Node> = Api::all(admin.clone());
    let node = eventually(
        "our agent's Node Ready with the driver's zone label",
        &logs,
        || {
            let nodes = nodes.clone();
            async move {
                let n = nodes.get_opt(NODE).await.ok().flatten()?;
                let ready = n
                    .status
                    .as_ref()?
                    .conditions
                    .as_ref()?
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                let zoned = n
                    .metadata
                    .labels
                    .as_ref()?
                    .contains_key("topology.ebs.csi.aws.com/zone");
                (ready && zoned).then_some(n)
            }
        },
    )
    .await;
    let annotations = node.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations
            .get("volumes.kubernetes.io/controller-managed-attach-detach")
            .map(String::as_str),
        Some("true")
    );
    let csinode = Api::<CSINode>::all(admin.clone()).get(NODE).await.unwrap();
    assert!(
        csinode
            .spec
            .drivers
            .iter()
            .any(|d| d.name == DRIVER && d.node_id.starts_with("i-"))
    );

    cluster
        .apply(&manifest(&[
            claim_yaml("data", "ebs-sc", None, "1Gi"),
            // Not pod_yaml's: our agent is the node, so no container runs and the pod needs
            // neither the host network nor a local image.
            format!(
                r#"apiVersion: v1
kind: Pod
metadata: {{name: app, namespace: default}}
spec:
  containers:
  - name: app
    image: {image}
    volumeMounts: [{{name: data, mountPath: /data}}]
  volumes:
  - name: data
    persistentVolumeClaim: {{claimName: data}}
"#,
                image = k8s_harness::PAUSE_IMAGE,
            ),
        ]))
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let t0 = Instant::now();
    let pod = real_support::ready_pod(&pods, "app", &logs).await;
    println!("pod Ready {:?} after it was created", t0.elapsed());
    assert_eq!(
        pod.spec.as_ref().unwrap().node_name.as_deref(),
        Some(NODE),
        "kube-scheduler placed it"
    );
    let pv_name = Api::<PersistentVolumeClaim>::namespaced(admin.clone(), "default")
        .get("data")
        .await
        .unwrap()
        .spec
        .unwrap()
        .volume_name
        .expect("bound by kcm");
    let pv = Api::<PersistentVolume>::all(admin.clone())
        .get(&pv_name)
        .await
        .unwrap();
    let handle = pv
        .spec
        .as_ref()
        .unwrap()
        .csi
        .as_ref()
        .unwrap()
        .volume_handle
        .clone();
    let unique = format!("kubernetes.io/csi/{DRIVER}^{handle}");
    let status = nodes.get(NODE).await.unwrap().status.unwrap();
    assert!(
        status.volumes_in_use.unwrap_or_default().contains(&unique),
        "our agent reports {unique} in volumesInUse"
    );
    assert!(
        status
            .volumes_attached
            .unwrap_or_default()
            .iter()
            .any(|v| v.name == unique),
        "kcm's ADC reports {unique} in volumesAttached"
    );
    let uid = pod.metadata.uid.clone().unwrap();
    let mount = root.join(format!(
        "pods/{uid}/volumes/kubernetes.io~csi/{pv_name}/mount"
    ));
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = mountinfo
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(mount.to_str().unwrap()))
        .unwrap_or_else(|| panic!("{} is not mounted", mount.display()));
    assert!(line.contains(" - ext4 /dev/loop"), "{line}");

    // Delete: our agent unpublishes, unstages and removes the pod; kcm detaches.
    pods.delete("app", &DeleteParams::default()).await.unwrap();
    eventually("pod app removed by our agent", &logs, || {
        let pods = pods.clone();
        async move { pods.get_opt("app").await.ok()?.is_none().then_some(()) }
    })
    .await;
    let vas: Api<VolumeAttachment> = Api::all(admin.clone());
    eventually("every VolumeAttachment gone (detached)", &logs, || {
        let vas = vas.clone();
        async move {
            vas.list(&ListParams::default())
                .await
                .ok()?
                .items
                .is_empty()
                .then_some(())
        }
    })
    .await;
    assert!(!is_mount_point(&mount), "unpublished");
    let stage_dir = root.join("plugins/kubernetes.io/csi").join(DRIVER);
    let staged: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| {
            l.split(' ')
                .nth(4)
                .is_some_and(|m| m.starts_with(stage_dir.to_str().unwrap()))
        })
        .map(str::to_owned)
        .collect();
    assert!(staged.is_empty(), "unstaged: {staged:?}");
    // Refused nothing it needs. Two refusals are by design: the pod annotation, which
    // NodeRestriction keeps from a node (the status is written), and the re-read of an object
    // after the node's last pod using it went (the Node authorizer stops it; the cache drops it).
    let agent_log = std::fs::read_to_string(log("node-agent")).unwrap();
    let refused: Vec<&str> = agent_log
        .lines()
        .filter(|l| l.contains("forbidden"))
        .filter(|l| {
            !l.contains("the volume-paths annotation is not ours to write here")
                && !l.contains("no longer readable (403)")
        })
        .collect();
    assert!(
        refused.is_empty(),
        "our agent was refused something:\n{}",
        refused.join("\n")
    );
}
