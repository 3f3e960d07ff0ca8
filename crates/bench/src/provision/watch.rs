//! Two watches in the background, claims (the run's label) and volumes (all of them: every PV
//! on this API server is the provisioner's), that note when each claim was first seen Bound
//! (and to which volume), and when each claim and each volume disappeared.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::run_objects::{CLAIM_LABEL, CLAIM_LABEL_VALUE, NS};

/// What the watches saw, with the time they saw it.
#[derive(Default)]
pub(crate) struct Timeline {
    /// Claim → first seen with `status.phase: Bound`.
    pub(crate) bound: HashMap<String, Instant>,
    /// Claim → its `spec.volumeName` when it was Bound.
    pub(crate) volume_of: HashMap<String, String>,
    pub(crate) claims_gone: HashMap<String, Instant>,
    /// Volumes that exist now.
    volumes: HashSet<String>,
    /// Volumes of a relist in progress (replaces `volumes` at its end).
    relisted: Option<HashSet<String>>,
    pub(crate) volumes_gone: HashMap<String, Instant>,
}

/// The numbers a phase waits on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    pub(crate) claims_synced: bool,
    pub(crate) volumes_synced: bool,
    pub(crate) bound: usize,
    pub(crate) claims_gone: usize,
    pub(crate) volumes: usize,
}

fn lock(t: &Mutex<Timeline>) -> std::sync::MutexGuard<'_, Timeline> {
    t.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn name_of<K: kube::Resource>(o: &K) -> String {
    o.meta().name.clone().unwrap_or_default()
}

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
    timeline: Arc<Mutex<Timeline>>,
    pub(crate) rx: watch::Receiver<Counts>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Watches {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Watches {
    pub(crate) fn spawn(kube: &Client) -> Self {
        let timeline = Arc::new(Mutex::new(Timeline::default()));
        let (tx, rx) = watch::channel(Counts::default());
        let tx = Arc::new(tx);
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(kube.clone(), NS);
        let claims_config =
            watcher::Config::default().labels(&format!("{CLAIM_LABEL}={CLAIM_LABEL_VALUE}"));
        let volumes: Api<PersistentVolume> = Api::all(kube.clone());
        let tasks = vec![
            tokio::spawn(watch_claims(
                claims,
                claims_config,
                Arc::clone(&timeline),
                Arc::clone(&tx),
            )),
            tokio::spawn(watch_volumes(volumes, Arc::clone(&timeline), tx)),
        ];
        Self {
            timeline,
            rx,
            tasks,
        }
    }

    pub(crate) fn counts(&self) -> Counts {
        *self.rx.borrow()
    }
}

/// The timeline, for reading once the phases are over.
pub(crate) fn lock_timeline(w: &Watches) -> std::sync::MutexGuard<'_, Timeline> {
    lock(&w.timeline)
}

/// Updates the counts from the timeline; `claims_synced`/`volumes_synced` only ever turn on.
fn publish(tx: &watch::Sender<Counts>, tl: &Timeline, claims_synced: bool, volumes_synced: bool) {
    tx.send_modify(|c| {
        c.claims_synced |= claims_synced;
        c.volumes_synced |= volumes_synced;
        c.bound = tl.bound.len();
        c.claims_gone = tl.claims_gone.len();
        c.volumes = tl.volumes.len();
    });
}

async fn watch_claims(
    api: Api<PersistentVolumeClaim>,
    config: watcher::Config,
    timeline: Arc<Mutex<Timeline>>,
    tx: Arc<watch::Sender<Counts>>,
) {
    let mut stream = watcher::watcher(api, config).default_backoff().boxed();
    while let Some(event) = stream.next().await {
        let now = Instant::now();
        let mut tl = lock(&timeline);
        let mut synced = false;
        match event {
            Ok(Event::Apply(c)) | Ok(Event::InitApply(c)) => {
                if let Some(volume) = bound_volume(&c) {
                    let name = name_of(&c);
                    tl.bound.entry(name.clone()).or_insert(now);
                    tl.volume_of.entry(name).or_insert(volume);
                }
            }
            Ok(Event::Delete(c)) => {
                tl.claims_gone.entry(name_of(&c)).or_insert(now);
            }
            Ok(Event::InitDone) => synced = true,
            Ok(Event::Init) => {}
            Err(e) => tracing::warn!(error = %e, "claims watch; it re-lists"),
        }
        publish(&tx, &tl, synced, false);
    }
}

async fn watch_volumes(
    api: Api<PersistentVolume>,
    timeline: Arc<Mutex<Timeline>>,
    tx: Arc<watch::Sender<Counts>>,
) {
    let mut stream = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    while let Some(event) = stream.next().await {
        let now = Instant::now();
        let mut tl = lock(&timeline);
        let mut synced = false;
        match event {
            Ok(Event::Apply(v)) => {
                tl.volumes.insert(name_of(&v));
            }
            Ok(Event::Delete(v)) => {
                let name = name_of(&v);
                tl.volumes.remove(&name);
                tl.volumes_gone.entry(name).or_insert(now);
            }
            Ok(Event::Init) => tl.relisted = Some(HashSet::new()),
            Ok(Event::InitApply(v)) => {
                if let Some(r) = tl.relisted.as_mut() {
                    r.insert(name_of(&v));
                }
            }
            Ok(Event::InitDone) => {
                // A volume deleted while the watch was down is gone as of this relist.
                let now_there = tl.relisted.take().unwrap_or_default();
                let vanished: Vec<String> = tl.volumes.difference(&now_there).cloned().collect();
                for name in vanished {
                    tl.volumes_gone.entry(name).or_insert(now);
                }
                tl.volumes = now_there;
                synced = true;
            }
            Err(e) => tracing::warn!(error = %e, "volumes watch; it re-lists"),
        }
        publish(&tx, &tl, false, synced);
    }
}
