//! Our node-side binaries on a real node: `csi-node-driver-registrar` registers the hostpath
//! driver with the real kubelet v1.26 (whose grpc-go client sends the socket path as
//! `:authority`), the kubelet writes CSINode, the node's driver annotation and topology label,
//! and a pod scheduled by kube-scheduler with a claim bound by kube-controller-manager reaches
//! its data through the kubelet's NodePublish on our driver.
// Test code (helpers included): a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

use csi_spec::v1::controller_client::ControllerClient;
use csi_spec::v1::volume_capability::{AccessMode, AccessType, MountVolume, access_mode};
use csi_spec::v1::{CapacityRange, CreateVolumeRequest, VolumeCapability};
use k8s_harness::support::{bins_or_skip, spawn_component};
use k8s_harness::{Cluster, ClusterOptions};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::storage::v1::CSINode;
use kube::Api;
use kube::api::DeleteParams;

mod real_support;
use real_support::{claim_yaml, eventually, is_mount_point, manifest, pod_yaml};

const DRIVER: &str = "hostpath.csi.k8s.io";
const NODE: &str = "node-a";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registrar_registers_hostpath_with_the_real_kubelet_and_a_pod_reaches_its_data() {
    let Some([driver_bin, registrar_bin]) =
        bins_or_skip(["hostpath-csi-driver", "csi-node-driver-registrar"])
    else {
        return;
    };
    let Some(cluster) = Cluster::start_or_skip(ClusterOptions::full("*", NODE)).await else {
        return;
    };
    let root = cluster.kubelet_root_dir().unwrap().to_path_buf();
    let work = tempfile::tempdir().unwrap();
    let plugin_dir = root.join("plugins").join(DRIVER);
    std::fs::create_dir_all(&plugin_dir).unwrap();
    let socket = plugin_dir.join("csi.sock");
    let endpoint = format!("unix://{}", socket.display());

    // The node DaemonSet's two containers, as processes on the host.
    let _driver = spawn_component(
        &driver_bin,
        &[
            format!("--endpoint={endpoint}"),
            format!("--node-id={NODE}"),
            format!("--state-dir={}", work.path().join("state").display()),
            "--capacity=1Gi".into(),
        ],
        &work.path().join("driver.log"),
    );
    let health_port = k8s_harness::support::free_ports(1).unwrap()[0];
    let _registrar = spawn_component(
        &registrar_bin,
        &[
            format!("--csi-address={}", socket.display()),
            format!("--kubelet-registration-path={}", socket.display()),
            format!(
                "--plugin-registration-path={}",
                root.join("plugins_registry").display()
            ),
            format!("--http-endpoint=127.0.0.1:{health_port}"),
            "--v=5".into(),
        ],
        &work.path().join("registrar.log"),
    );

    let admin = cluster.admin_client().await.unwrap();
    let csinodes: Api<CSINode> = Api::all(admin.clone());
    let t0 = Instant::now();
    let kubelet_log_path = cluster.log_path("kubelet");
    let logs_owned = [
        kubelet_log_path.clone(),
        work.path().join("registrar.log"),
        work.path().join("driver.log"),
    ];
    let logs: Vec<&std::path::Path> = logs_owned.iter().map(|p| p.as_path()).collect();
    let csinode = eventually(&format!("CSINode {NODE} to list {DRIVER}"), &logs, || {
        let csinodes = csinodes.clone();
        async move {
            let n = csinodes.get_opt(NODE).await.ok().flatten()?;
            n.spec.drivers.iter().any(|d| d.name == DRIVER).then_some(n)
        }
    })
    .await;
    println!(
        "registered with the kubelet {:?} after both processes started",
        t0.elapsed()
    );
    let entry = csinode
        .spec
        .drivers
        .iter()
        .find(|d| d.name == DRIVER)
        .unwrap();
    assert_eq!(entry.node_id, NODE, "nodeID from our driver's NodeGetInfo");
    assert_eq!(
        entry.topology_keys.as_deref(),
        Some(&["topology.hostpath.csi/node".to_owned()][..]),
        "topology keys from NodeGetInfo's accessible_topology"
    );
    let kubelet_log = std::fs::read_to_string(cluster.log_path("kubelet")).unwrap();
    assert!(
        !kubelet_log.contains("RegisterPlugin error"),
        "the kubelet reported a registration error:\n{}",
        cluster.log_tail("kubelet", 40)
    );

    let nodes: Api<Node> = Api::all(admin.clone());
    let node = nodes.get(NODE).await.unwrap();
    let ids: serde_json::Value = serde_json::from_str(
        node.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("csi.volume.kubernetes.io/nodeid"))
            .expect("the kubelet's driver annotation on the Node"),
    )
    .unwrap();
    assert_eq!(ids[DRIVER], NODE);
    assert_eq!(
        node.metadata
            .labels
            .as_ref()
            .unwrap()
            .get("topology.hostpath.csi/node")
            .map(String::as_str),
        Some(NODE),
        "the kubelet labels the node with the driver's topology"
    );

    // The kubelet told the registrar it registered: its /healthz says so.
    let health = eventually("the registrar's /healthz to be 200", &logs, || async move {
        use std::io::{Read, Write};
        let mut conn = std::net::TcpStream::connect(("127.0.0.1", health_port)).ok()?;
        conn.write_all(b"GET /healthz HTTP/1.0\r\nHost: localhost\r\n\r\n")
            .ok()?;
        let mut answer = String::new();
        conn.read_to_string(&mut answer).ok()?;
        answer
            .starts_with("HTTP/1.0 200")
            .then_some(())
            .or_else(|| answer.starts_with("HTTP/1.1 200").then_some(()))
    })
    .await;
    let () = health;

    // A volume on our driver, a PV and claim bound by kcm's PV controller, a pod placed by
    // kube-scheduler and mounted by the kubelet through NodePublish on our driver.
    let mut csi = ControllerClient::new(csi_spec::connect_unix(&endpoint).await.unwrap());
    let volume = csi
        .create_volume(CreateVolumeRequest {
            name: "real-kubelet-data".into(),
            capacity_range: Some(CapacityRange {
                required_bytes: 1 << 20,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![VolumeCapability {
                access_type: Some(AccessType::Mount(MountVolume::default())),
                access_mode: Some(AccessMode {
                    mode: access_mode::Mode::SingleNodeWriter.into(),
                }),
            }],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let handle = volume.volume_id.clone();
    cluster
        .apply(&manifest(&[
            format!(
                r#"
apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata: {{name: {DRIVER}}}
spec: {{attachRequired: false, podInfoOnMount: true, volumeLifecycleModes: [Persistent]}}
---
apiVersion: v1
kind: PersistentVolume
metadata: {{name: real-kubelet-pv}}
spec:
  capacity: {{storage: 1Mi}}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: ""
  csi: {{driver: {DRIVER}, volumeHandle: "{handle}"}}
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions: [{{key: topology.hostpath.csi/node, operator: In, values: [{NODE}]}}]
"#
            ),
            claim_yaml("data", "", Some("real-kubelet-pv"), "1Mi"),
            pod_yaml("app", "data", None),
        ]))
        .unwrap();

    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let t0 = Instant::now();
    let pod = real_support::ready_pod(&pods, "app", &logs).await;
    println!("pod Ready {:?} after it was created", t0.elapsed());
    let uid = pod.metadata.uid.clone().unwrap();
    let mount = root.join(format!(
        "pods/{uid}/volumes/kubernetes.io~csi/real-kubelet-pv/mount"
    ));
    assert!(is_mount_point(&mount), "{} is not mounted", mount.display());
    // The file written into the pod's volume lands in our driver's volume directory.
    std::fs::write(mount.join("hello.txt"), b"written through the pod's mount").unwrap();
    let backing = work
        .path()
        .join("state/volumes")
        .join(&handle)
        .join("hello.txt");
    assert_eq!(
        std::fs::read(&backing).unwrap_or_else(|e| panic!("{}: {e}", backing.display())),
        b"written through the pod's mount"
    );

    // The kubelet unpublishes through our driver when the pod goes.
    pods.delete("app", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    eventually("pod app gone", &logs, || {
        let pods = pods.clone();
        async move { pods.get_opt("app").await.ok()?.is_none().then_some(()) }
    })
    .await;
    eventually("the pod's mount gone", &logs, || {
        let mount = mount.clone();
        async move { (!is_mount_point(&mount)).then_some(()) }
    })
    .await;
    assert!(backing.exists(), "unpublish keeps the data");
}
