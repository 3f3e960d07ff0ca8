//! Two goal watches in the background (the harness's): claims (the run's label), timed until
//! each is first seen Bound (and to which volume), and volumes (all of them: every PV on this
//! API server is the provisioner's), timed until each is gone.

use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::runtime::watcher;
use kube::{Api, Client};

use super::run_objects::{CLAIM_LABEL, CLAIM_LABEL_VALUE, NS};
use crate::harness::goals::{GoalWatch, Seen};

/// The numbers a phase waits on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    pub(crate) claims_synced: bool,
    pub(crate) volumes_synced: bool,
    pub(crate) bound: usize,
    pub(crate) claims_gone: usize,
    pub(crate) volumes: usize,
}

/// A claim's volume once it is Bound.
fn bound_volume(c: &PersistentVolumeClaim) -> Option<String> {
    let bound = c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    bound.then(|| {
        c.spec
            .as_ref()
            .and_then(|s| s.volume_name.clone())
            .unwrap_or_default()
    })
}

/// Both watches; they stop when this is dropped.
pub(crate) struct Watches {
    claims: GoalWatch,
    volumes: GoalWatch,
}

impl Watches {
    pub(crate) fn spawn(kube: &Client) -> Self {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(kube.clone(), NS);
        let volumes: Api<PersistentVolume> = Api::all(kube.clone());
        Self {
            claims: GoalWatch::spawn(
                claims,
                watcher::Config::default().labels(&format!("{CLAIM_LABEL}={CLAIM_LABEL_VALUE}")),
                bound_volume,
            ),
            // Volumes have no goal here: only whether they exist.
            volumes: GoalWatch::spawn(volumes, watcher::Config::default(), |_| None),
        }
    }

    pub(crate) fn counts(&self) -> Counts {
        let (c, v) = (self.claims.counts(), self.volumes.counts());
        Counts {
            claims_synced: c.synced,
            volumes_synced: v.synced,
            bound: c.reached,
            claims_gone: c.gone,
            volumes: v.existing,
        }
    }

    /// Resolves when either watch saw a change, or after `at_most`.
    pub(crate) async fn changed(&self, at_most: Duration) {
        let (mut c, mut v) = (self.claims.receiver(), self.volumes.receiver());
        let _ = tokio::time::timeout(at_most, async {
            tokio::select! {
                _ = c.changed() => {}
                _ = v.changed() => {}
            }
        })
        .await;
    }

    /// What the claims watch saw: Bound times (with the volume), gone times.
    pub(crate) fn claims(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.claims.seen()
    }

    /// What the volumes watch saw: gone times.
    pub(crate) fn volumes(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.volumes.seen()
    }
}
