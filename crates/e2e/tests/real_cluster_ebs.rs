//! The EBS stack on a real cluster: kube-apiserver (Node,RBAC), kube-controller-manager with its
//! own attach/detach and PV controllers, kube-scheduler and the kubelet v1.26, with our
//! binaries where a user installs them: `ebs-csi-driver --mode all` on an embedded EC2 (ec2-sim,
//! loop devices), `csi-node-driver-registrar`, and `csi-attacher` + `csi-provisioner` running
//! as deploy/'s ServiceAccount with deploy/'s RBAC (a missing rule fails with the 403 in their
//! logs). A claim of deploy/'s `ebs-sc` (WaitForFirstConsumer) is provisioned, attached by kcm's
//! VolumeAttachment through our attacher, staged and published by the kubelet through our
//! driver; the pod's file is on the EC2 volume; deleting everything detaches and deletes it.
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
use real_support::{claim_yaml, eventually, is_mount_point, manifest, pod_yaml};

const DRIVER: &str = "ebs.csi.aws.com";
const NODE: &str = "node-ebs";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ebs_claim_provisioned_attached_and_mounted_under_real_kcm_and_kubelet() {
    let Some([driver_bin, registrar_bin, attacher_bin, provisioner_bin]) = bins_or_skip([
        "ebs-csi-driver",
        "csi-node-driver-registrar",
        "csi-attacher",
        "csi-provisioner",
    ]) else {
        return;
    };
    if !real_support::loop_devices_or_skip() {
        return;
    }
    let Some(cluster) = Cluster::start_or_skip(ClusterOptions::full("*", NODE)).await else {
        return;
    };
    let root = cluster.kubelet_root_dir().unwrap().to_path_buf();
    let work = tempfile::tempdir().unwrap();
    let log = |name: &str| work.path().join(format!("{name}.log"));
    let plugin_dir = root.join("plugins").join(DRIVER);
    std::fs::create_dir_all(&plugin_dir).unwrap();
    let socket = plugin_dir.join("csi.sock");
    let endpoint = format!("unix://{}", socket.display());

    let sa = real_support::deploy_controller_objects(&cluster).await;

    // The node DaemonSet's containers and the controller Deployment's, as host processes.
    let _driver = spawn_component(
        &driver_bin,
        &[
            "--mode=all".into(),
            format!("--endpoint={endpoint}"),
            format!("--embedded-ec2={}", work.path().join("ec2").display()),
        ],
        &log("ebs-plugin"),
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
    let _attacher = spawn_component(
        &attacher_bin,
        &[
            format!("--csi-address={}", socket.display()),
            format!("--kubeconfig={}", sa.display()),
            "--timeout=60s".into(),
            "--leader-election".into(),
            "--leader-election-namespace=kube-system".into(),
            "--v=4".into(),
        ],
        &log("csi-attacher"),
    );
    let _provisioner = spawn_component(
        &provisioner_bin,
        &[
            format!("--csi-address={}", socket.display()),
            format!("--kubeconfig={}", sa.display()),
            "--timeout=60s".into(),
            "--feature-gates=Topology=true".into(),
            "--extra-create-metadata".into(),
            "--default-fstype=ext4".into(),
            "--leader-election".into(),
            "--leader-election-namespace=kube-system".into(),
            "--v=4".into(),
        ],
        &log("csi-provisioner"),
    );
    let kubelet_log = cluster.log_path("kubelet");
    let kcm_log = cluster.log_path("kube-controller-manager");
    let logs = [
        log("ebs-plugin"),
        log("registrar"),
        log("csi-attacher"),
        log("csi-provisioner"),
        kubelet_log.clone(),
        kcm_log.clone(),
    ];
    let logs: Vec<&Path> = logs.iter().map(PathBuf::as_path).collect();

    let admin = cluster.admin_client().await.unwrap();
    let csinodes: Api<CSINode> = Api::all(admin.clone());
    let csinode = eventually("CSINode to list ebs.csi.aws.com", &logs, || {
        let csinodes = csinodes.clone();
        async move {
            let n = csinodes.get_opt(NODE).await.ok().flatten()?;
            n.spec.drivers.iter().any(|d| d.name == DRIVER).then_some(n)
        }
    })
    .await;
    let entry = csinode
        .spec
        .drivers
        .iter()
        .find(|d| d.name == DRIVER)
        .unwrap();
    assert!(
        entry.node_id.starts_with("i-"),
        "the embedded EC2's instance ID, got {}",
        entry.node_id
    );
    let migrated = csinode
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("storage.alpha.kubernetes.io/migrated-plugins"))
        .cloned()
        .unwrap_or_default();
    assert!(
        migrated.contains("kubernetes.io/aws-ebs"),
        "the v1.26 kubelet announces aws-ebs migrated: {migrated:?}"
    );
    let node = Api::<Node>::all(admin.clone()).get(NODE).await.unwrap();
    let zone = node
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("topology.ebs.csi.aws.com/zone"))
        .cloned()
        .expect("the kubelet labels the node with the driver's zone");
    // What the AWS cloud-controller-manager does on EKS: the well-known zone and region labels,
    // which an in-tree (migrated) PV's node affinity names. There is no cloud provider here.
    cluster
        .kubectl(&[
            "label",
            "node",
            NODE,
            &format!("topology.kubernetes.io/zone={zone}"),
            // An AWS zone is its region and a letter.
            &format!("topology.kubernetes.io/region={}", &zone[..zone.len() - 1]),
        ])
        .unwrap();

    // One claim of deploy/'s CSI class and one of an in-tree aws-ebs class (the migration design,
    // docs/design/migration.md: kcm v1.26 hands it to ebs.csi.aws.com without
    // pv.kubernetes.io/migrated-to on the claim).
    let mut documents = vec![
        "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata: {name: gp2}\n\
         provisioner: kubernetes.io/aws-ebs\nvolumeBindingMode: WaitForFirstConsumer\n\
         parameters: {type: gp2, fsType: ext4}\n"
            .to_string(),
    ];
    for (claim, class, pod) in CASES {
        documents.push(claim_yaml(claim, class, None, "1Gi"));
        documents.push(pod_yaml(pod, claim, None));
    }
    let t0 = Instant::now();
    cluster.apply(&manifest(&documents)).unwrap();
    for (claim, class, pod) in CASES {
        let case = Case {
            claim,
            class,
            pod,
            zone: &zone,
            root: &root,
            t0,
        };
        check_pod(&admin, &logs, &case).await;
    }
    for (name, path) in [
        ("csi-attacher", log("csi-attacher")),
        ("csi-provisioner", log("csi-provisioner")),
    ] {
        // A refusal reads "... is forbidden: User ..." (reason Forbidden, code 403); a bare
        // "403" would also match timestamps and hashes.
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            !text.to_lowercase().contains("forbidden"),
            "{name} was refused something by RBAC:\n{text}"
        );
    }
}

const CASES: [(&str, &str, &str); 2] = [
    ("data", "ebs-sc", "writer"),
    ("legacy", "gp2", "legacy-writer"),
];

struct Case<'a> {
    claim: &'a str,
    class: &'a str,
    pod: &'a str,
    zone: &'a str,
    root: &'a Path,
    t0: Instant,
}

/// One claim + pod of `CASES`: Ready, provisioned in the node's zone, attached through kcm's
/// VolumeAttachment, mounted from a loop device; then deleted, detached and its PV deleted.
async fn check_pod(admin: &kube::Client, logs: &[&Path], case: &Case<'_>) {
    let Case {
        claim,
        class,
        pod,
        zone,
        root,
        t0,
    } = *case;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let ready = real_support::ready_pod(&pods, pod, logs).await;
    println!(
        "pod {pod} (claim of class {class}) Ready {:?} after it was created",
        t0.elapsed()
    );

    let claims: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), "default");
    let bound = claims.get(claim).await.unwrap();
    let pv_name = bound
        .spec
        .as_ref()
        .unwrap()
        .volume_name
        .clone()
        .expect("bound");
    let pv = Api::<PersistentVolume>::all(admin.clone())
        .get(&pv_name)
        .await
        .unwrap();
    let annotations = pv.metadata.annotations.clone().unwrap_or_default();
    let annotation = |k: &str| annotations.get(k).map(String::as_str);
    if class == "gp2" {
        // The in-tree form, as the Go provisioner writes it for a migrated class.
        let ebs = pv.spec.as_ref().unwrap().aws_elastic_block_store.as_ref();
        let ebs = ebs.expect("an in-tree awsElasticBlockStore PV");
        assert!(ebs.volume_id.contains("vol-"), "{}", ebs.volume_id);
        assert_eq!(
            annotation("pv.kubernetes.io/provisioned-by"),
            Some("kubernetes.io/aws-ebs")
        );
        assert_eq!(annotation("pv.kubernetes.io/migrated-to"), Some(DRIVER));
    } else {
        let pv_csi = pv.spec.as_ref().unwrap().csi.as_ref().unwrap();
        assert_eq!(pv_csi.driver, DRIVER);
        assert!(
            pv_csi.volume_handle.starts_with("vol-"),
            "{}",
            pv_csi.volume_handle
        );
        assert_eq!(annotation("pv.kubernetes.io/provisioned-by"), Some(DRIVER));
    }
    let affinity = serde_json::to_string(&pv.spec.as_ref().unwrap().node_affinity).unwrap();
    assert!(
        affinity.contains(zone),
        "PV in the node's zone {zone}: {affinity}"
    );

    // kcm's attach/detach controller made the VolumeAttachment; our attacher attached it.
    let vas: Api<VolumeAttachment> = Api::all(admin.clone());
    let va = vas
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|v| v.spec.source.persistent_volume_name.as_deref() == Some(pv_name.as_str()))
        .expect("a VolumeAttachment for the PV");
    assert_eq!(va.spec.attacher, DRIVER);
    assert_eq!(va.spec.node_name, NODE);
    assert!(
        va.status.as_ref().is_some_and(|s| s.attached),
        "attached by csi-attacher"
    );

    let uid = ready.metadata.uid.clone().unwrap();
    let mount = root.join(format!(
        "pods/{uid}/volumes/kubernetes.io~csi/{pv_name}/mount"
    ));
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = mountinfo
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(mount.to_str().unwrap()))
        .unwrap_or_else(|| panic!("{} is not mounted", mount.display()));
    assert!(
        line.contains(" - ext4 /dev/loop"),
        "an ext4 loop device behind the pod's volume: {line}"
    );
    std::fs::write(mount.join("hello.txt"), b"on an EBS volume").unwrap();
    assert_eq!(
        std::fs::read(mount.join("hello.txt")).unwrap(),
        b"on an EBS volume"
    );

    // Tear down: the kubelet unpublishes and unstages, kcm detaches through our attacher, the
    // reclaim policy deletes through our provisioner.
    pods.delete(pod, &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    eventually(&format!("pod {pod} gone"), logs, || {
        let pods = pods.clone();
        async move { pods.get_opt(pod).await.ok()?.is_none().then_some(()) }
    })
    .await;
    let va_name = va.metadata.name.clone().unwrap();
    eventually(
        &format!("VolumeAttachment {va_name} gone (detached)"),
        logs,
        || {
            let vas = vas.clone();
            let name = va_name.clone();
            async move { vas.get_opt(&name).await.ok()?.is_none().then_some(()) }
        },
    )
    .await;
    assert!(!is_mount_point(&mount), "unpublished");
    claims
        .delete(claim, &DeleteParams::default())
        .await
        .unwrap();
    let pvs: Api<PersistentVolume> = Api::all(admin.clone());
    eventually(
        &format!("PV {pv_name} deleted by csi-provisioner"),
        logs,
        || {
            let pvs = pvs.clone();
            let name = pv_name.clone();
            async move { pvs.get_opt(&name).await.ok()?.is_none().then_some(()) }
        },
    )
    .await;
}
