//! Generic ephemeral volumes on `csi-cluster` (a pod with one used to wait forever for its claim):
//! a pod whose volume is `ephemeral.volumeClaimTemplate` gets the claim `<pod>-<volume>`, owned by
//! the pod, from the ephemeral volume controller; the scheduler treats it as the pod's claim
//! (WaitForFirstConsumer: it writes the selected node) and the EBS provisioner makes its volume.
//! Deleting the pod deletes the claim (apiserver-lite has no garbage collector; the controller runs
//! with `delete_orphaned_claims`), and the claim's volume goes with it (reclaim policy Delete).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Cluster, PATIENCE, can_run};

const POD: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: eph
spec:
  nodeSelector:
    kubernetes.io/hostname: node-0
  containers:
  - name: app
    image: busybox
    volumeMounts:
    - name: scratch
      mountPath: /scratch
  volumes:
  - name: scratch
    ephemeral:
      volumeClaimTemplate:
        metadata:
          labels:
            app: eph
        spec:
          storageClassName: ebs-sc
          accessModes: [ReadWriteOnce]
          resources:
            requests:
              storage: 1Gi
"#;

/// Polls `probe` every 250 ms until it is `Some`, within [`PATIENCE`].
async fn eventually<T>(cluster: &Cluster, what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        if let Some(v) = probe() {
            return v;
        }
        if std::time::Instant::now() > deadline {
            cluster.print_output();
            panic!("timed out waiting for {what}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generic_ephemeral_volume_gets_its_claim_and_loses_it_with_the_pod() {
    if !can_run() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(work.path(), 1, 1);
    cluster.wait_ready().await;
    cluster.kubectl(&["apply", "-f", "-"], Some(POD));
    let pod_uid = cluster.get_json(&["get", "pod", "eph"])["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();

    let claim = eventually(&cluster, "claim eph-scratch Bound", || {
        let out = cluster.kubectl_output(&["get", "pvc", "eph-scratch", "-o", "json"], None);
        let c: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        (c["status"]["phase"] == "Bound").then_some(c)
    })
    .await;
    let owner = &claim["metadata"]["ownerReferences"][0];
    assert_eq!(owner["kind"], "Pod", "{claim}");
    assert_eq!(owner["name"], "eph", "{claim}");
    assert_eq!(owner["uid"].as_str(), Some(pod_uid.as_str()), "{claim}");
    assert_eq!(owner["controller"], true, "{claim}");
    assert_eq!(owner["blockOwnerDeletion"], true, "{claim}");
    assert_eq!(claim["metadata"]["labels"]["app"], "eph", "{claim}");
    assert_eq!(claim["spec"]["storageClassName"], "ebs-sc", "{claim}");
    assert_eq!(
        claim["metadata"]["annotations"]["volume.kubernetes.io/selected-node"], "node-0",
        "{claim}"
    );
    let pv = claim["spec"]["volumeName"].as_str().unwrap().to_string();
    let p = cluster.get_json(&["get", "pod", "eph"]);
    assert_eq!(p["spec"]["nodeName"], "node-0", "{p}");

    cluster.kubectl(&["delete", "pod", "eph", "--timeout=120s"], None);
    eventually(&cluster, "claim eph-scratch and its volume gone", || {
        let claims = cluster.kubectl(&["get", "pvc", "-o", "name"], None);
        let volumes = cluster.kubectl(&["get", "pv", "-o", "name"], None);
        (!claims.contains("eph-scratch") && !volumes.contains(&pv)).then_some(())
    })
    .await;
    assert!(cluster.terminate().await.success());
}
