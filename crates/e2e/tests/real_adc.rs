//! Our attach/detach controller against kube-controller-manager's, on real Kubernetes v1.26:
//! the same scenario runs on two clusters one after the other, (A) with kcm's own
//! `attachdetach` controller and (B) with kcm's `--controllers=*,-attachdetach` and our
//! `attach-detach-controller` running as the ServiceAccount `kube-system/attachdetach-controller`
//! (which the bootstrap ClusterRoleBinding `system:controller:attachdetach-controller` gives
//! exactly kcm's RBAC). The scenario: `ebs-csi-driver --mode all` on an embedded EC2, our
//! registrar, csi-attacher and csi-provisioner, deploy/'s CSIDriver and `ebs-sc` class, one
//! claim and one pod; beside it the skip-attach case, a static hostpath.csi.k8s.io volume whose
//! CSIDriver says `attachRequired: false`, in a second pod. Both pods get Ready, then are deleted
//! and the EBS volume detached. What the ADC side wrote (the VolumeAttachment,
//! node.status.volumesAttached and who wrote it, its Events, the node's controller-managed
//! annotation, no VolumeAttachment for hostpath) is recorded with the run's volume IDs, names and
//! instance IDs replaced by placeholders, printed, and the two runs must be equal; the known
//! differences (field manager name, the Events' reporting fields: docs/attach-detach.md) are
//! printed, not compared.
// Test code (helpers included): a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_harness::support::{bins_or_skip, spawn_component};
use k8s_harness::{Cluster, ClusterOptions};
use k8s_openapi::api::core::v1::{Event, Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use serde_json::{Value, json};

mod real_support;
use real_support::{claim_yaml, eventually, manifest, pod_yaml, repo_file};

const DRIVER: &str = "ebs.csi.aws.com";
const NODE: &str = "node-adc";
const HOSTPATH: &str = "hostpath.csi.k8s.io";
/// A volume ID EC2 does not know: its attach fails.
const MISSING: &str = "vol-0123456789abcdef0";
const MANAGED: &str = "volumes.kubernetes.io/controller-managed-attach-detach";

struct Bins {
    driver: PathBuf,
    registrar: PathBuf,
    attacher: PathBuf,
    provisioner: PathBuf,
    adc: PathBuf,
    hostpath: PathBuf,
}

/// Which attach/detach controller a run has.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Adc {
    Kcm,
    Ours,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_attach_detach_controller_writes_what_kcms_writes() {
    let Some([driver, registrar, attacher, provisioner, adc, hostpath]) = bins_or_skip([
        "ebs-csi-driver",
        "csi-node-driver-registrar",
        "csi-attacher",
        "csi-provisioner",
        "attach-detach-controller",
        "hostpath-csi-driver",
    ]) else {
        return;
    };
    if !real_support::loop_devices_or_skip() {
        return;
    }
    let bins = Bins {
        driver,
        registrar,
        attacher,
        provisioner,
        adc,
        hostpath,
    };
    let t0 = Instant::now();
    let Some(kcm) = scenario(&bins, Adc::Kcm).await else {
        return;
    };
    let Some(ours) = scenario(&bins, Adc::Ours).await else {
        return;
    };
    println!(
        "kube-controller-manager's attachdetach:\n{}",
        serde_json::to_string_pretty(&kcm).unwrap()
    );
    println!(
        "attach-detach-controller:\n{}",
        serde_json::to_string_pretty(&ours).unwrap()
    );
    println!("both runs took {:?}", t0.elapsed());
    // Each field on its own, so a failure names it; `known_differences` is only printed.
    let keys = kcm.as_object().unwrap().keys();
    for key in keys.filter(|k| *k != "known_differences") {
        assert_eq!(ours[key], kcm[key], "{key}: ours differs from kcm's");
    }
    // The scenario's own claims, whoever runs the ADC.
    assert_eq!(kcm["hostpath_volume_attachments"], json!([]));
    assert_eq!(
        kcm["volume_attachment"]["name_is_csi_sha256_of_handle_driver_node"],
        json!(true)
    );
    assert_eq!(kcm["node_annotation_controller_managed"], json!("true"));
}

/// One cluster, one claim + pod, attached, Ready, deleted, detached; what the ADC side wrote,
/// normalised. `None`: the cluster could not start here (skipped).
async fn scenario(bins: &Bins, adc: Adc) -> Option<Value> {
    let controllers = match adc {
        Adc::Kcm => "*",
        Adc::Ours => "*,-attachdetach",
    };
    let cluster = Cluster::start_or_skip(ClusterOptions::full(controllers, NODE)).await?;
    let root = cluster.kubelet_root_dir().unwrap().to_path_buf();
    let work = tempfile::tempdir().unwrap();
    let log = |name: &str| work.path().join(format!("{name}.log"));
    let plugin_dir = root.join("plugins").join(DRIVER);
    std::fs::create_dir_all(&plugin_dir).unwrap();
    let socket = plugin_dir.join("csi.sock");

    let sa = real_support::deploy_controller_objects(&cluster).await;
    let mut children = vec![
        spawn_component(
            &bins.driver,
            &[
                "--mode=all".into(),
                format!("--endpoint=unix://{}", socket.display()),
                format!("--embedded-ec2={}", work.path().join("ec2").display()),
            ],
            &log("ebs-plugin"),
        ),
        spawn_component(
            &bins.registrar,
            &[
                format!("--csi-address={}", socket.display()),
                format!("--kubelet-registration-path={}", socket.display()),
                format!(
                    "--plugin-registration-path={}",
                    root.join("plugins_registry").display()
                ),
            ],
            &log("registrar"),
        ),
    ];
    // The skip-attach case: hostpath.csi.k8s.io, whose CSIDriver says attachRequired: false.
    // Its pod names its node: kube-scheduler would otherwise race kcm's binding of the static
    // claim and retry up to 30 s later ("unbound immediate PersistentVolumeClaims").
    let hp_dir = root.join("plugins").join(HOSTPATH);
    std::fs::create_dir_all(&hp_dir).unwrap();
    let hp_socket = hp_dir.join("csi.sock");
    children.push(spawn_component(
        &bins.hostpath,
        &[
            format!("--endpoint=unix://{}", hp_socket.display()),
            format!("--node-id={NODE}"),
            format!("--state-dir={}", work.path().join("hostpath").display()),
            "--capacity=1Gi".into(),
        ],
        &log("hostpath-plugin"),
    ));
    children.push(spawn_component(
        &bins.registrar,
        &[
            format!("--csi-address={}", hp_socket.display()),
            format!("--kubelet-registration-path={}", hp_socket.display()),
            format!(
                "--plugin-registration-path={}",
                root.join("plugins_registry").display()
            ),
        ],
        &log("hostpath-registrar"),
    ));
    for (bin, name) in [
        (&bins.attacher, "csi-attacher"),
        (&bins.provisioner, "csi-provisioner"),
    ] {
        let mut args = vec![
            format!("--csi-address={}", socket.display()),
            format!("--kubeconfig={}", sa.display()),
            "--timeout=60s".into(),
            "--v=4".into(),
        ];
        if name == "csi-provisioner" {
            args.extend([
                "--feature-gates=Topology=true".into(),
                "--extra-create-metadata".into(),
                "--default-fstype=ext4".into(),
            ]);
        }
        children.push(spawn_component(bin, &args, &log(name)));
    }
    if adc == Adc::Ours {
        // The account kcm's own controller runs as (--use-service-account-credentials): the
        // bootstrap policy binds it to system:controller:attachdetach-controller.
        let adc_sa = cluster
            .service_account_kubeconfig("kube-system", "attachdetach-controller")
            .await
            .unwrap();
        children.push(spawn_component(
            &bins.adc,
            &[format!("--kubeconfig={}", adc_sa.display()), "--v=4".into()],
            &log("attach-detach-controller"),
        ));
    }
    let mut logs = vec![
        log("ebs-plugin"),
        log("csi-attacher"),
        log("csi-provisioner"),
        cluster.log_path("kubelet"),
        cluster.log_path("kube-controller-manager"),
    ];
    if adc == Adc::Ours {
        logs.push(log("attach-detach-controller"));
    }

    let admin = cluster.admin_client().await.unwrap();
    let hp_handle = hostpath_volume(&hp_socket).await;
    // Both drivers registered with the kubelet before any pod: a pod that names its node would
    // otherwise race the registration (csi-attacher: "CSINode has no entry for driver").
    let csinodes: Api<CSINode> = Api::all(admin.clone());
    eventually("CSINode to list both drivers", &logs, || {
        let csinodes = csinodes.clone();
        async move {
            let n = csinodes.get_opt(NODE).await.ok().flatten()?;
            let has = |name: &str| n.spec.drivers.iter().any(|d| d.name == name);
            (has(DRIVER) && has(HOSTPATH)).then_some(())
        }
    })
    .await;
    cluster
        .apply(&repo_file(
            "deploy/kubernetes/overlays/hostpath/csidriver.yaml",
        ))
        .unwrap();
    cluster
        .apply(&format!(
            r#"apiVersion: v1
kind: PersistentVolume
metadata: {{name: hostpath-pv}}
spec:
  capacity: {{storage: 1Mi}}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: ""
  csi: {{driver: {HOSTPATH}, volumeHandle: "{hp_handle}"}}
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions: [{{key: topology.hostpath.csi/node, operator: In, values: [{NODE}]}}]
---
apiVersion: v1
kind: PersistentVolume
metadata: {{name: missing-pv}}
spec:
  capacity: {{storage: 1Gi}}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: ""
  csi: {{driver: {DRIVER}, volumeHandle: "{MISSING}", fsType: ext4}}
"#
        ))
        .unwrap();
    // The static PVs in kcm's PV controller's cache before their claims: a claim created with
    // them can miss its PV and wait for the controller's 15 s resync (and the kubelet's retry).
    let pvs: Api<PersistentVolume> = Api::all(admin.clone());
    for pv in ["hostpath-pv", "missing-pv"] {
        eventually(&format!("PV {pv} Available"), &logs, || {
            let pvs = pvs.clone();
            async move {
                let v = pvs.get(pv).await.ok()?;
                (v.status?.phase.as_deref() == Some("Available")).then_some(())
            }
        })
        .await;
    }
    cluster
        .apply(&manifest(&[
            claim_yaml("local", "", Some("hostpath-pv"), "1Mi"),
            pod_yaml("local-writer", "local", Some(NODE)),
            claim_yaml("missing", "", Some("missing-pv"), "1Gi"),
            pod_yaml("missing-reader", "missing", Some(NODE)),
            claim_yaml("data", "ebs-sc", None, "1Gi"),
            pod_yaml("writer", "data", None),
        ]))
        .unwrap();
    let start = Instant::now();
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    for pod in ["writer", "local-writer"] {
        real_support::ready_pod(&pods, pod, &logs).await;
        println!(
            "{adc:?}: pod {pod} Ready {:?} after it was created",
            start.elapsed()
        );
    }

    let claims: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), "default");
    let pv_name = claims.get("data").await.unwrap().spec.unwrap().volume_name;
    let pv_name = pv_name.expect("claim data bound");
    let handle = pvs.get(&pv_name).await.unwrap().spec.unwrap().csi.unwrap();
    let handle = handle.volume_handle;
    let instance = Api::<CSINode>::all(admin.clone())
        .get(NODE)
        .await
        .unwrap()
        .spec
        .drivers
        .into_iter()
        .find(|d| d.name == DRIVER)
        .unwrap()
        .node_id;
    let normalise = |s: &str| {
        s.replace(&pv_name, "<pv>")
            .replace(&handle, "<volume-id>")
            .replace(&hp_handle, "<hostpath-volume-id>")
            .replace(&instance, "<instance-id>")
    };

    // The VolumeAttachment, as the ADC created it and csi-attacher marked it attached.
    let vas: Api<VolumeAttachment> = Api::all(admin.clone());
    let va = vas
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|v| v.spec.source.persistent_volume_name.as_deref() == Some(pv_name.as_str()))
        .expect("a VolumeAttachment for the PV");
    let va_name = va.metadata.name.clone().unwrap();
    let managers: BTreeSet<String> = va
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .map(|m| {
            format!(
                "{} {} {}",
                m.manager.as_deref().unwrap_or(""),
                m.operation.as_deref().unwrap_or(""),
                m.subresource.as_deref().unwrap_or("")
            )
        })
        .collect();
    let hostpath_vas: Vec<String> = vas
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|v| v.spec.attacher == HOSTPATH)
        .map(|v| v.metadata.name.clone().unwrap_or_default())
        .collect();
    let va_record = json!({
        "name_is_csi_sha256_of_handle_driver_node":
            va_name == volume_plugins::names::volume_attachment_name(&handle, DRIVER, NODE),
        "labels": va.metadata.labels,
        "annotations": va.metadata.annotations.iter().flatten()
            .map(|(k, v)| format!("{k}={}", normalise(v)))
            .collect::<Vec<_>>(),
        "finalizers": va.metadata.finalizers,
        "owner_references": va.metadata.owner_references,
        "spec": normalise(&serde_json::to_string(&va.spec).unwrap()),
        "status_attached": va.status.as_ref().map(|s| s.attached),
        "managers": managers.iter().map(|m| as_adc(m)).collect::<BTreeSet<_>>(),
    });

    // node.status.volumesAttached once the kubelet mounted (the kubelet waits for it).
    let nodes: Api<Node> = Api::all(admin.clone());
    let node = nodes.get(NODE).await.unwrap();
    let attached: Vec<Value> = node
        .status
        .as_ref()
        .and_then(|s| s.volumes_attached.clone())
        .unwrap_or_default()
        .iter()
        .map(|v| json!({"name": normalise(&v.name), "devicePath": v.device_path}))
        .collect();
    // Who wrote volumesAttached, and how (the status subresource).
    let status_writers: BTreeSet<String> = node
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|m| {
            m.fields_v1
                .as_ref()
                .is_some_and(|f| f.0.to_string().contains("f:volumesAttached"))
        })
        .map(|m| {
            format!(
                "{} {} {}",
                m.manager.as_deref().unwrap_or(""),
                m.operation.as_deref().unwrap_or(""),
                m.subresource.as_deref().unwrap_or("")
            )
        })
        .collect();
    let annotation = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(MANAGED))
        .cloned();

    // The failing case: an EBS volume EC2 does not have; the ADC reports the attacher's error.
    let events_api: Api<Event> = Api::namespaced(admin.clone(), "default");
    eventually(
        "a FailedAttachVolume Event on pod missing-reader",
        &logs,
        || {
            let events_api = events_api.clone();
            async move {
                let list = events_api.list(&ListParams::default()).await.ok()?;
                list.items
                    .iter()
                    .any(|e| {
                        e.reason.as_deref() == Some("FailedAttachVolume")
                            && e.involved_object.name.as_deref() == Some("missing-reader")
                    })
                    .then_some(())
            }
        },
    )
    .await;

    // Delete the pods: the kubelet unmounts, the ADC detaches and deletes the VolumeAttachments.
    for pod in ["writer", "local-writer", "missing-reader"] {
        pods.delete(pod, &DeleteParams::default().grace_period(0))
            .await
            .unwrap();
    }
    let detach_start = Instant::now();
    eventually(&format!("VolumeAttachment {va_name} gone"), &logs, || {
        let vas = vas.clone();
        let name = va_name.clone();
        async move { vas.get_opt(&name).await.ok()?.is_none().then_some(()) }
    })
    .await;
    let after = eventually("node.status.volumesAttached empty", &logs, || {
        let nodes = nodes.clone();
        async move {
            let n = nodes.get(NODE).await.ok()?;
            let list = n.status?.volumes_attached.unwrap_or_default();
            list.is_empty().then_some(list.len())
        }
    })
    .await;
    println!(
        "{adc:?}: detached {:?} after the pod's delete",
        detach_start.elapsed()
    );

    // The ADC's Events: everything about attaching and detaching, whoever wrote it; and the
    // failed attach's VolumeAttachment (kcm leaves it behind after its pod goes).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let missing_vas: Vec<Value> = vas
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|v| {
            json!({
                "spec": normalise(&serde_json::to_string(&v.spec).unwrap()),
                "deleting": v.metadata.deletion_timestamp.is_some(),
                "attached": v.status.as_ref().map(|s| s.attached),
                "attach_error": v.status.as_ref()
                    .and_then(|s| s.attach_error.as_ref())
                    .and_then(|e| e.message.clone())
                    .map(|m| normalise(&m)),
            })
        })
        .collect();
    let events: BTreeSet<String> = Api::<Event>::all(admin.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|e| {
            let reason = e.reason.as_deref().unwrap_or("");
            let component = e.source.as_ref().and_then(|s| s.component.as_deref());
            reason.contains("Attach")
                || reason.contains("Detach")
                || component == Some(attach_detach::COMPONENT)
        })
        .map(|e| {
            format!(
                "{} {} {}/{} source={} count>0={}: {}",
                e.type_.as_deref().unwrap_or(""),
                e.reason.as_deref().unwrap_or(""),
                e.involved_object.kind.as_deref().unwrap_or(""),
                e.involved_object.name.as_deref().unwrap_or(""),
                e.source
                    .as_ref()
                    .and_then(|s| s.component.as_deref())
                    .unwrap_or(""),
                e.count.unwrap_or(0) > 0,
                normalise(e.message.as_deref().unwrap_or("")),
            )
        })
        .collect();

    // Known differences, printed and not compared (docs/attach-detach.md).
    let reporting: BTreeSet<String> = Api::<Event>::all(admin.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|e| {
            e.source.as_ref().and_then(|s| s.component.as_deref()) == Some(attach_detach::COMPONENT)
        })
        .map(|e| {
            format!(
                "reportingComponent={:?} reportingInstance={:?} source.host={:?}",
                e.reporting_component.as_deref().unwrap_or(""),
                e.reporting_instance.as_deref().unwrap_or(""),
                e.source
                    .as_ref()
                    .and_then(|s| s.host.as_deref())
                    .unwrap_or("")
            )
        })
        .collect();
    let differences = json!({
        "volume_attachment_managers": managers,
        "node_volumes_attached_writers": status_writers,
        "event_reporting": reporting,
        "volume_attachments_after_pods_deleted": missing_vas,
    });

    // Clean up the EC2 volume (loop device) through the provisioner before the cluster goes.
    claims
        .delete("data", &DeleteParams::default())
        .await
        .unwrap();
    eventually(&format!("PV {pv_name} deleted"), &logs, || {
        let pvs = pvs.clone();
        let name = pv_name.clone();
        async move { pvs.get_opt(&name).await.ok()?.is_none().then_some(()) }
    })
    .await;
    if adc == Adc::Ours {
        let text = std::fs::read_to_string(log("attach-detach-controller")).unwrap();
        assert!(
            !text.contains("forbidden"),
            "our ADC was refused something by kcm's RBAC:\n{text}"
        );
    }
    drop(children);
    Some(json!({
        "known_differences": differences,
        "volume_attachment": va_record,
        "node_volumes_attached": attached,
        "node_volumes_attached_after_detach": after,
        "node_annotation_controller_managed": annotation,
        "node_volumes_attached_writers":
            status_writers.iter().map(|m| as_adc(m)).collect::<BTreeSet<_>>(),
        "hostpath_volume_attachments": hostpath_vas,

        "events": events,
    }))
}

/// A 1 MiB volume on the hostpath driver at `socket` (CreateVolume), waiting for the socket;
/// its volume ID.
async fn hostpath_volume(socket: &Path) -> String {
    use csi_spec::v1::controller_client::ControllerClient;
    use csi_spec::v1::volume_capability::{AccessMode, AccessType, MountVolume, access_mode};
    use csi_spec::v1::{CapacityRange, CreateVolumeRequest, VolumeCapability};
    let endpoint = format!("unix://{}", socket.display());
    let channel = eventually("the hostpath driver's socket", &[] as &[&Path], || {
        let endpoint = endpoint.clone();
        async move { csi_spec::connect_unix(&endpoint).await.ok() }
    })
    .await;
    ControllerClient::new(channel)
        .create_volume(CreateVolumeRequest {
            name: "real-adc-local".into(),
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
        .unwrap()
        .volume_id
}

/// A field manager line with the attach/detach controller's name (kcm's or ours) as `<adc>`.
fn as_adc(line: &str) -> String {
    ["kube-controller-manager ", "attach-detach-controller "]
        .iter()
        .fold(line.to_owned(), |l, name| l.replace(name, "<adc> "))
}
