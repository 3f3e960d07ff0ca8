//! Which objects changed since the last pass. kcm's volume and claim workers sync only the keys
//! their informers' event handlers queued, plus everything once per resync period; a pass here
//! did every object on every change, so a burst of N claims cost N passes of N syncs (at 5,000
//! pods "PV created" → "PV Bound" took 39 s at p50, docs/benchmarks.md). The watch caches tell
//! this set what changed, with what else that change concerns:
//!
//! - a volume: itself and the claim its `claimRef` names (binding, release, loss); an unbound
//!   volume also every pending claim (it may match one now);
//! - a claim: itself and the volume its `spec.volumeName` names (a deleted claim releases it);
//!   the volumes whose `claimRef` names it are added by the pass, which has them indexed;
//! - a pod: the claims it uses (claim protection, `WaitForFirstConsumer`);
//! - a class, or a re-list of any cache: everything.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};

use component_runtime::object_cache::{Change, Subscription};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;

use super::Caches;
use crate::protection;

/// What changed since the last [`Changed::take`].
#[derive(Debug, Default)]
pub(crate) struct Dirty {
    pub volumes: HashSet<String>,
    /// (namespace, name).
    pub claims: HashSet<(String, String)>,
    /// An unbound volume changed: any pending claim may bind to it now.
    pub unbound_volume: bool,
    /// Sync everything (a class changed, a cache re-listed).
    pub everything: bool,
}

impl Dirty {
    pub(crate) fn is_empty(&self) -> bool {
        self.volumes.is_empty()
            && self.claims.is_empty()
            && !self.unbound_volume
            && !self.everything
    }
}

/// Collects [`Dirty`] from the caches' changes while it lives.
pub(crate) struct Changed {
    dirty: Arc<Mutex<Dirty>>,
    _subscriptions: [Subscription; 4],
}

fn lock(dirty: &Mutex<Dirty>) -> MutexGuard<'_, Dirty> {
    // Set inserts only: a panicking holder leaves it usable.
    dirty.lock().unwrap_or_else(|e| e.into_inner())
}

/// A subscriber that notes an applied or deleted object with `note`, and a re-list as
/// everything.
fn noting<K: 'static>(
    dirty: &Arc<Mutex<Dirty>>,
    note: fn(&mut Dirty, &K),
) -> impl FnMut(Change<'_, K>) + Send + 'static {
    let dirty = dirty.clone();
    move |change| {
        let mut d = lock(&dirty);
        match change {
            Change::Applied(obj) | Change::Deleted(obj) => note(&mut d, obj),
            Change::Relisted => d.everything = true,
        }
    }
}

impl Changed {
    pub(crate) fn subscribe(caches: &Caches) -> Self {
        let dirty = Arc::new(Mutex::new(Dirty::default()));
        let volumes = caches.volumes.subscribe(noting(&dirty, note_volume));
        let claims = caches.claims.subscribe(noting(&dirty, note_claim));
        let pods = caches.pods.subscribe(noting(&dirty, note_pod));
        let d = dirty.clone();
        let classes = caches
            .classes
            .subscribe(move |_: Change<'_, StorageClass>| lock(&d).everything = true);
        Self {
            dirty,
            _subscriptions: [volumes, claims, pods, classes],
        }
    }

    /// What changed since the last call; the set starts empty again.
    pub(crate) fn take(&self) -> Dirty {
        std::mem::take(&mut *lock(&self.dirty))
    }
}

fn note_volume(d: &mut Dirty, pv: &PersistentVolume) {
    if let Some(name) = &pv.metadata.name {
        d.volumes.insert(name.clone());
    }
    match pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) {
        Some(r) => {
            d.claims.insert((
                r.namespace.clone().unwrap_or_default(),
                r.name.clone().unwrap_or_default(),
            ));
        }
        None => d.unbound_volume = true,
    }
}

fn note_pod(d: &mut Dirty, pod: &Pod) {
    d.claims.extend(protection::pvc::claims_of(pod));
}

fn note_claim(d: &mut Dirty, pvc: &PersistentVolumeClaim) {
    d.claims.insert((
        pvc.metadata.namespace.clone().unwrap_or_default(),
        pvc.metadata.name.clone().unwrap_or_default(),
    ));
    if let Some(volume) = pvc
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_ref())
        .filter(|v| !v.is_empty())
    {
        d.volumes.insert(volume.clone());
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn pv(name: &str, claim: Option<(&str, &str)>) -> PersistentVolume {
        let mut v = PersistentVolume::default();
        v.metadata.name = Some(name.into());
        if let Some((ns, c)) = claim {
            v.spec = Some(
                serde_json::from_value(
                    serde_json::json!({"claimRef": {"namespace": ns, "name": c}}),
                )
                .unwrap(),
            );
        }
        v
    }

    #[test]
    fn a_volume_change_concerns_its_claim_and_an_unbound_one_every_pending_claim() {
        let mut d = Dirty::default();
        note_volume(&mut d, &pv("pv-1", Some(("ns", "c-1"))));
        assert!(d.volumes.contains("pv-1"));
        assert!(d.claims.contains(&("ns".to_string(), "c-1".to_string())));
        assert!(!d.unbound_volume);
        note_volume(&mut d, &pv("pv-2", None));
        assert!(
            d.unbound_volume,
            "an unbound volume may match any pending claim"
        );
        assert!(!d.is_empty());
    }

    #[test]
    fn a_claim_change_concerns_the_volume_it_names() {
        let mut d = Dirty::default();
        let mut c = PersistentVolumeClaim::default();
        c.metadata.namespace = Some("ns".into());
        c.metadata.name = Some("c-1".into());
        note_claim(&mut d, &c);
        assert!(d.volumes.is_empty());
        c.spec = Some(serde_json::from_value(serde_json::json!({"volumeName": "pv-9"})).unwrap());
        note_claim(&mut d, &c);
        assert!(d.volumes.contains("pv-9"));
        assert_eq!(d.claims.len(), 1);
    }
}
