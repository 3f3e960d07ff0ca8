//! The workload controllers: what turns a Pod into a scheduled Pod and a StatefulSet into
//! Pods and claims. They stop first on shutdown, so nothing new is asked of the storage stack
//! while it stops.

use std::path::Path;

use crate::Error;
use crate::control_plane::client;
use crate::supervisor::{Stage, Supervisor};

/// Starts the scheduler and the StatefulSet controller; returns their names.
pub(crate) async fn start(sup: &mut Supervisor, kubeconfig: &Path) -> Result<Vec<String>, Error> {
    let scheduler_client = client(kubeconfig, &scheduler::user_agent()).await?;
    let stop = sup.token(Stage::Workloads);
    sup.spawn(
        "scheduler",
        Stage::Workloads,
        scheduler::run(scheduler_client, scheduler::Config::default(), stop),
    );
    let statefulset_client = client(kubeconfig, &statefulset::user_agent()).await?;
    let stop = sup.token(Stage::Workloads);
    sup.spawn(
        "StatefulSet controller",
        Stage::Workloads,
        statefulset::run(statefulset_client, statefulset::Config::default(), stop),
    );
    Ok(vec!["scheduler".into(), "StatefulSet controller".into()])
}
