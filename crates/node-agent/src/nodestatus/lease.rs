//! The node heartbeat: a Lease named after the node in `kube-node-lease`, renewed every
//! quarter of its duration (the kubelet's node lease controller), owned by the Node so it goes
//! with it.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// The namespace of node Leases.
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

fn micro_now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%S%.6fZ")
        .to_string()
}

async fn renew(api: &Api<Lease>, node: &Node, duration_seconds: i32) -> Result<(), kube::Error> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let body = json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": name,
            "namespace": NODE_LEASE_NAMESPACE,
            "ownerReferences": [{
                "apiVersion": "v1", "kind": "Node", "name": name,
                "uid": node.metadata.uid.clone().unwrap_or_default(),
            }],
        },
        "spec": {
            "holderIdentity": name,
            "leaseDurationSeconds": duration_seconds,
            "renewTime": micro_now(),
        }
    });
    match api
        .patch(&name, &PatchParams::default(), &Patch::Merge(&body))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => {
            let lease: Lease = serde_json::from_value(body).map_err(kube::Error::SerdeError)?;
            api.create(&PostParams::default(), &lease).await.map(|_| ())
        }
        Err(e) => Err(e),
    }
}

/// Renews the node's Lease until `stop`.
pub async fn run(client: Client, node: Node, duration_seconds: i32, stop: CancellationToken) {
    let api: Api<Lease> = Api::namespaced(client, NODE_LEASE_NAMESPACE);
    let every = Duration::from_secs(u64::try_from(duration_seconds.max(1)).unwrap_or(40)) / 4;
    loop {
        let wait = match renew(&api, &node, duration_seconds).await {
            Ok(()) => every,
            Err(e) => {
                tracing::warn!(error = %e, "renewing the node Lease failed; retrying");
                Duration::from_millis(200).min(every)
            }
        };
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
    }
}
