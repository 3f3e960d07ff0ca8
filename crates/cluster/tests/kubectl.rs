//! csi-cluster driven the way its users drive it: `kubectl apply -f` of a StorageClass, claims,
//! pods and a StatefulSet of 3 with volumeClaimTemplates, `kubectl wait --for=condition=Ready`,
//! `kubectl describe pod` showing our components' Events, `kubectl scale` and `kubectl delete`,
//! with the kubectl on PATH and with Debian's kubectl 1.20.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;

use common::{Cluster, PATIENCE, can_run, mounts_below};

const STATEFULSET: &str = r#"apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: web
spec:
  serviceName: web
  replicas: 3
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: app
        image: busybox
        volumeMounts:
        - name: data
          mountPath: /data
  volumeClaimTemplates:
  - metadata:
      name: data
    spec:
      accessModes: [ReadWriteOnce]
      storageClassName: ebs-sc
      resources:
        requests:
          storage: 1Gi
"#;

/// A class of the user's own (Immediate binding, gp2 through the CSI driver), a claim on it and
/// a pod using it on `node`.
fn own_class_claim_and_pod(prefix: &str, node: &str) -> String {
    format!(
        r#"apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: {prefix}-class
provisioner: ebs.csi.aws.com
parameters:
  type: gp2
volumeBindingMode: Immediate
reclaimPolicy: Delete
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: {prefix}-claim
spec:
  storageClassName: {prefix}-class
  accessModes: [ReadWriteOnce]
  resources:
    requests:
      storage: 2Gi
---
apiVersion: v1
kind: Pod
metadata:
  name: {prefix}-pod
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
      claimName: {prefix}-claim
"#
    )
}

/// Polls `f` every 200 ms until it is true, at most PATIENCE; panics with `what`.
async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !f() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {PATIENCE:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

fn names(list: &serde_json::Value) -> Vec<String> {
    let mut names: Vec<String> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn a_statefulset_of_three_with_claim_templates_through_kubectl() {
    if !can_run() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start_with(work.path(), 3, 0, &["--zones", "1"]);
    cluster.wait_ready().await;

    cluster.kubectl(&["apply", "-f", "-"], Some(STATEFULSET));
    // OrderedReady: web-1 only after web-0 is Ready, so wait for each in turn, as kubectl
    // users do.
    for pod in ["web-0", "web-1", "web-2"] {
        eventually(&format!("pod {pod} created"), || {
            cluster
                .kubectl_output(&["get", "pod", pod], None)
                .status
                .success()
        })
        .await;
        cluster.kubectl(
            &[
                "wait",
                "--for=condition=Ready",
                &format!("pod/{pod}"),
                "--timeout=120s",
            ],
            None,
        );
    }
    let claims = cluster.get_json(&["get", "pvc"]);
    assert_eq!(
        names(&claims),
        ["data-web-0", "data-web-1", "data-web-2"],
        "one claim per ordinal from the template"
    );
    for c in claims["items"].as_array().unwrap() {
        assert_eq!(c["status"]["phase"], "Bound", "{c}");
    }
    let set = cluster.get_json(&["get", "statefulset", "web"]);
    assert_eq!(set["status"]["readyReplicas"], 3, "{}", set["status"]);

    // Each pod's file lives on its own volume.
    for pod in ["web-0", "web-1", "web-2"] {
        let path = common::volume_path(&cluster, pod).join("id");
        std::fs::write(&path, pod).unwrap();
    }

    // describe shows the Events our components wrote: the scheduler's and the attach/detach
    // controller's, in Kubernetes' words.
    let describe = cluster.kubectl(&["describe", "pod", "web-0"], None);
    assert!(describe.contains("Events:"), "{describe}");
    assert!(
        describe.contains("Scheduled") && describe.contains("Successfully assigned default/web-0"),
        "{describe}"
    );
    assert!(describe.contains("SuccessfulAttachVolume"), "{describe}");
    let describe_set = cluster.kubectl(&["describe", "statefulset", "web"], None);
    assert!(
        describe_set.contains("SuccessfulCreate") && describe_set.contains("create Pod web-2"),
        "{describe_set}"
    );

    // Scaling down removes the highest ordinals and keeps their claims.
    cluster.kubectl(&["scale", "statefulset", "web", "--replicas=1"], None);
    eventually("web-1 and web-2 gone", || {
        names(&cluster.get_json(&["get", "pods"])) == ["web-0"]
    })
    .await;
    assert_eq!(
        names(&cluster.get_json(&["get", "pvc"])).len(),
        3,
        "scale-down keeps the claims"
    );
    // Scaling up again gives web-1 its old claim and its old file.
    cluster.kubectl(&["scale", "statefulset", "web", "--replicas=2"], None);
    eventually("web-1 back", || {
        cluster
            .kubectl_output(&["get", "pod", "web-1"], None)
            .status
            .success()
    })
    .await;
    cluster.kubectl(
        &[
            "wait",
            "--for=condition=Ready",
            "pod/web-1",
            "--timeout=120s",
        ],
        None,
    );
    let path = common::volume_path(&cluster, "web-1").join("id");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "web-1");

    // Deleting the set deletes its pods; deleting the claims deletes the volumes.
    cluster.kubectl(&["delete", "statefulset", "web"], None);
    eventually("pods gone", || {
        names(&cluster.get_json(&["get", "pods"])).is_empty()
    })
    .await;
    cluster.kubectl(&["delete", "pvc", "--all", "--wait=true"], None);
    eventually("volumes and attachments gone", || {
        names(&cluster.get_json(&["get", "pv"])).is_empty()
            && names(&cluster.get_json(&["get", "volumeattachments"])).is_empty()
    })
    .await;
    let status = cluster.terminate().await;
    assert!(status.success(), "{status}");
    assert!(mounts_below(&cluster.data_dir).is_empty());
}

/// The same user session with the kubectl on PATH and with Debian's 1.20: apply a class, a
/// claim and a pod, wait for Ready, describe, delete; then kubectl 1.20 runs a StatefulSet of 3.
#[tokio::test]
async fn kubectl_on_path_and_debian_kubectl_1_20_drive_a_volume() {
    if !can_run() {
        return;
    }
    let Some(legacy) = test_support::kubectl_1_20() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start_with(work.path(), 2, 0, &["--zones", "1"]);
    cluster.wait_ready().await;
    for (prefix, bin, node) in [
        ("now", Path::new("kubectl"), "node-0"),
        ("old", legacy.as_path(), "node-1"),
    ] {
        let manifest = own_class_claim_and_pod(prefix, node);
        let applied = cluster.kubectl_with(bin, &["apply", "-f", "-"], Some(&manifest));
        assert!(
            applied.contains(&format!(
                "storageclass.storage.k8s.io/{prefix}-class created"
            )),
            "{applied}"
        );
        let pod = format!("pod/{prefix}-pod");
        cluster.kubectl_with(
            bin,
            &["wait", "--for=condition=Ready", &pod, "--timeout=120s"],
            None,
        );
        let describe = cluster.kubectl_with(bin, &["describe", &pod], None);
        assert!(
            describe.contains(&format!(
                "Successfully assigned default/{prefix}-pod to {node}"
            )),
            "{} describe: {describe}",
            bin.display()
        );
        assert!(describe.contains("SuccessfulAttachVolume"), "{describe}");
        let claim = cluster.kubectl_with(
            bin,
            &[
                "get",
                "pvc",
                &format!("{prefix}-claim"),
                "-o",
                "jsonpath={.status.phase} {.status.capacity.storage}",
            ],
            None,
        );
        assert_eq!(claim, "Bound 2Gi", "{}", bin.display());
        cluster.kubectl_with(bin, &["delete", "-f", "-"], Some(&manifest));
    }
    // kubectl 1.20 applies a StatefulSet of 3 (apps/v1, Parallel, hostpath claims) as well.
    let set = STATEFULSET
        .replace("name: web", "name: old-web")
        .replace("app: web", "app: old-web")
        .replace(
            "serviceName: web",
            "serviceName: old-web\n  podManagementPolicy: Parallel",
        )
        .replace("storageClassName: ebs-sc", "storageClassName: hostpath");
    cluster.kubectl_with(&legacy, &["apply", "-f", "-"], Some(&set));
    for pod in ["old-web-0", "old-web-1", "old-web-2"] {
        eventually(&format!("pod {pod} created"), || {
            cluster
                .kubectl_output_with(&legacy, &["get", "pod", pod], None)
                .status
                .success()
        })
        .await;
        cluster.kubectl_with(
            &legacy,
            &[
                "wait",
                "--for=condition=Ready",
                &format!("pod/{pod}"),
                "--timeout=120s",
            ],
            None,
        );
    }
    let ready = cluster.kubectl_with(
        &legacy,
        &[
            "get",
            "statefulset",
            "old-web",
            "-o",
            "jsonpath={.status.readyReplicas}",
        ],
        None,
    );
    assert_eq!(ready, "3");
    cluster.kubectl_with(&legacy, &["delete", "statefulset", "old-web"], None);
    eventually("the set's pods gone", || {
        names(&cluster.get_json(&["get", "pods"])).is_empty()
    })
    .await;
    cluster.kubectl_with(
        &legacy,
        &[
            "delete",
            "pvc",
            "data-old-web-0",
            "data-old-web-1",
            "data-old-web-2",
        ],
        None,
    );
    eventually("volumes and attachments gone", || {
        names(&cluster.get_json(&["get", "pv"])).is_empty()
            && names(&cluster.get_json(&["get", "volumeattachments"])).is_empty()
    })
    .await;
    let status = cluster.terminate().await;
    assert!(status.success(), "{status}");
}
