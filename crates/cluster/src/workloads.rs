//! The workload controllers: what turns a Pod into a scheduled Pod and a StatefulSet into
//! Pods and claims. They stop first on shutdown, so nothing new is asked of the storage stack
//! while it stops.
//!
//! Not wired yet: `crates/scheduler` (`scheduler::run(client, scheduler::Config::default(),
//! shutdown)`) and `crates/statefulset` (`statefulset::run(client,
//! statefulset::Config::default(), shutdown)`) are being written. Until they are, a pod needs
//! `spec.nodeName` and a WaitForFirstConsumer claim the `volume.kubernetes.io/selected-node`
//! annotation, set by hand. Adding them is one `sup.spawn` each below (and the dependency).

use std::path::Path;

use crate::Error;
use crate::supervisor::Supervisor;

/// Starts the workload controllers that exist; returns their names.
pub(crate) async fn start(_sup: &mut Supervisor, _kubeconfig: &Path) -> Result<Vec<String>, Error> {
    // let client = crate::control_plane::client(_kubeconfig, "scheduler/csi-cluster").await?;
    // _sup.spawn("scheduler", Stage::Workloads,
    //     scheduler::run(client.clone(), scheduler::Config::default(), _sup.token(Stage::Workloads)));
    // _sup.spawn("StatefulSet controller", Stage::Workloads,
    //     statefulset::run(client, statefulset::Config::default(), _sup.token(Stage::Workloads)));
    Ok(Vec::new())
}
