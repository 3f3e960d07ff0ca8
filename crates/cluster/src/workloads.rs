//! The workload controllers: what turns a Pod into a scheduled Pod and a StatefulSet into
//! Pods and claims. They stop first on shutdown, so nothing new is asked of the storage stack
//! while it stops.

use std::sync::Arc;

use crate::Error;
use crate::component_names::{SCHEDULER, STATEFULSET};
use crate::identity::{self, Identity, Kubeconfigs};
use crate::supervisor::{self, Stage, Supervisor};

/// Starts the scheduler and the StatefulSet controller; returns their names.
pub(crate) async fn start(
    sup: &Supervisor,
    kubeconfigs: &Kubeconfigs<'_>,
    shared: &component_runtime::SharedCaches,
) -> Result<Vec<String>, Error> {
    let scheduler_client = kubeconfigs
        .client(&Identity::scheduler(), &scheduler::user_agent())
        .await?;
    let caches = shared.clone();
    sup.spawn(
        SCHEDULER,
        Stage::Workloads,
        Arc::new(move |stop| {
            supervisor::run(scheduler::run(
                scheduler_client.clone(),
                scheduler::Config {
                    shared_caches: Some(caches.clone()),
                    ..scheduler::Config::default()
                },
                stop,
            ))
        }),
    );
    let statefulset_client = kubeconfigs
        .client(
            &Identity::service_account(identity::STATEFULSET_SA),
            &statefulset::user_agent(),
        )
        .await?;
    let caches = shared.clone();
    sup.spawn(
        STATEFULSET,
        Stage::Workloads,
        Arc::new(move |stop| {
            supervisor::run(statefulset::run(
                statefulset_client.clone(),
                statefulset::Config {
                    shared_caches: Some(caches.clone()),
                    ..statefulset::Config::default()
                },
                stop,
            ))
        }),
    );
    Ok(vec![SCHEDULER.into(), STATEFULSET.into()])
}
