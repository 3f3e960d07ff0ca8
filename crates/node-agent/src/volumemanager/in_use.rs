//! `node.status.volumesInUse` (the kubelet's node status `volumesInUse`, written as soon as it
//! changes rather than on the next 10 s status update): a volume is added before it is
//! mounted and removed only after it is unmounted, and the attach/detach controller never
//! detaches a volume the node lists. The reconciler mounts an attachable volume only once the
//! API server has accepted a status that lists it (the kubelet's "reported in use").

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How long a failed status patch waits before it is tried again.
const RETRY: Duration = Duration::from_millis(500);

/// Writes what `desired` holds into the node's status and publishes in `reported` what the
/// API server accepted, until `stop`.
pub async fn report_in_use(
    client: Client,
    node_name: String,
    mut desired: watch::Receiver<BTreeSet<String>>,
    reported: watch::Sender<BTreeSet<String>>,
    stop: CancellationToken,
) {
    let nodes: Api<Node> = Api::all(client);
    // Nothing is written before the reconciler computed the set once (with the volumes
    // reconstructed from disk): an empty list written first would let the attach/detach
    // controller detach volumes that are still mounted.
    tokio::select! {
        () = stop.cancelled() => return,
        r = desired.changed() => if r.is_err() { return },
    }
    // The first write always happens: the node may list volumes from before a restart.
    let mut first = true;
    loop {
        let want = desired.borrow_and_update().clone();
        if first || want != *reported.borrow() {
            let body = json!({"status": {"volumesInUse": want.iter().collect::<Vec<_>>()}});
            match nodes
                .patch_status(&node_name, &PatchParams::default(), &Patch::Merge(&body))
                .await
            {
                Ok(_) => {
                    first = false;
                    tracing::debug!(node = %node_name, volumes = want.len(), "node.status.volumesInUse updated");
                    reported.send_replace(want);
                }
                Err(e) => {
                    tracing::warn!(node = %node_name, error = %e, "updating node.status.volumesInUse failed; retrying");
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(RETRY) => continue,
                    }
                }
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            r = desired.changed() => if r.is_err() { return },
        }
    }
}
