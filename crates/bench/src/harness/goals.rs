//! Watch-based goal timers: one watch per kind of the run's objects notes, with the instant it
//! saw it, when each object first met its goal (a pod Ready, a claim Bound, a VolumeAttachment
//! attached) and when each was gone, and keeps how many exist and meet the goal now. The
//! phases wait on those numbers; no polling of GETs, the API server pushes every change.
//!
//! A re-list (after the watch lost its connection) replaces what exists; an object missing
//! from it was deleted while the watch was down and is gone as of the re-list.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use futures::StreamExt as _;
use kube::Api;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the watch saw, with when.
#[derive(Debug, Default)]
pub struct Seen {
    /// Objects that exist now, and whether each meets its goal now (changed only through
    /// [`Seen::set_existing`] and [`Seen::set_gone`], which keep `matching` with it).
    existing: HashMap<String, bool>,
    /// How many of `existing` meet the goal: kept as they change, not counted per event (a
    /// run of 10,000 objects sends tens of thousands of events).
    matching: usize,
    /// When each object first met its goal, and what the goal function said then (a claim's
    /// volume; empty when it says nothing).
    pub reached: HashMap<String, (Instant, String)>,
    /// When each object was seen deleted (or missing from a re-list).
    pub gone: HashMap<String, Instant>,
    /// A re-list in progress (name → meets the goal); it replaces `existing` when it ends.
    relisting: Option<HashMap<String, bool>>,
}

impl Seen {
    fn set_existing(&mut self, name: String, met: bool) {
        let was = self.existing.insert(name, met);
        self.matching = self.matching + usize::from(met) - usize::from(was == Some(true));
    }

    fn set_gone(&mut self, name: String, now: Instant) {
        if self.existing.remove(&name) == Some(true) {
            self.matching -= 1;
        }
        self.gone.entry(name).or_insert(now);
    }

    /// When `name` first met its goal.
    pub fn reached_at(&self, name: &str) -> Option<Instant> {
        self.reached.get(name).map(|(at, _)| *at)
    }

    /// What the goal function said of `name` when it first met it.
    pub fn reached_with(&self, name: &str) -> Option<&str> {
        self.reached.get(name).map(|(_, detail)| detail.as_str())
    }
}

/// The numbers the phases wait on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// The first list is in: the numbers are real.
    pub synced: bool,
    pub existing: usize,
    /// Existing objects that meet the goal now.
    pub matching: usize,
    /// Objects that met the goal at some point.
    pub reached: usize,
    pub gone: usize,
}

/// A watch in the background; stops when dropped.
pub struct GoalWatch {
    seen: Arc<Mutex<Seen>>,
    rx: watch::Receiver<Counts>,
    task: JoinHandle<()>,
}

impl Drop for GoalWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn lock(seen: &Mutex<Seen>) -> MutexGuard<'_, Seen> {
    seen.lock().unwrap_or_else(PoisonError::into_inner)
}

impl GoalWatch {
    /// Watches `api` (narrowed by `config`, e.g. a label selector). `goal` says whether an
    /// object meets its goal: `Some(detail)` when it does.
    pub fn spawn<K, G>(api: Api<K>, config: watcher::Config, goal: G) -> Self
    where
        K: kube::Resource + Clone + DeserializeOwned + Debug + Send + 'static,
        G: Fn(&K) -> Option<String> + Send + 'static,
    {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (tx, rx) = watch::channel(Counts::default());
        let shared = Arc::clone(&seen);
        let task = tokio::spawn(async move {
            let mut stream = watcher::watcher(api, config).default_backoff().boxed();
            let mut synced = false;
            while let Some(event) = stream.next().await {
                // Taken at once: the instant is the measurement.
                let now = Instant::now();
                let mut seen = lock(&shared);
                match event {
                    Ok(Event::Init) => seen.relisting = Some(HashMap::new()),
                    Ok(Event::InitApply(o)) => {
                        let name = o.meta().name.clone().unwrap_or_default();
                        let met = note(&mut seen, &name, goal(&o), now);
                        // Takes effect at the end of the re-list, with the rest of it.
                        seen.relisting.get_or_insert_default().insert(name, met);
                        continue;
                    }
                    Ok(Event::InitDone) => {
                        let listed = seen.relisting.take().unwrap_or_default();
                        let vanished: Vec<String> = seen
                            .existing
                            .keys()
                            .filter(|n| !listed.contains_key(*n))
                            .cloned()
                            .collect();
                        for name in vanished {
                            seen.set_gone(name, now);
                        }
                        seen.matching = listed.values().filter(|m| **m).count();
                        seen.existing = listed;
                        synced = true;
                    }
                    Ok(Event::Apply(o)) => {
                        let name = o.meta().name.clone().unwrap_or_default();
                        let met = note(&mut seen, &name, goal(&o), now);
                        seen.set_existing(name, met);
                    }
                    Ok(Event::Delete(o)) => {
                        let name = o.meta().name.clone().unwrap_or_default();
                        seen.set_gone(name, now);
                    }
                    Err(e) => {
                        // The watcher lists again after a backoff; what it saw stays.
                        tracing::warn!(error = %e, "watch failed; it lists again");
                        continue;
                    }
                }
                tx.send_replace(Counts {
                    synced,
                    existing: seen.existing.len(),
                    matching: seen.matching,
                    reached: seen.reached.len(),
                    gone: seen.gone.len(),
                });
            }
        });
        Self { seen, rx, task }
    }

    pub fn counts(&self) -> Counts {
        *self.rx.borrow()
    }

    /// A receiver of the counts, for waiting on them (`wait_for`) alongside other things.
    pub fn receiver(&self) -> watch::Receiver<Counts> {
        self.rx.clone()
    }

    /// Waits until `done(counts)` holds; `None` if the watch task ended first.
    pub async fn until(&self, done: impl Fn(&Counts) -> bool) -> Option<Counts> {
        let mut rx = self.rx.clone();
        rx.wait_for(|c| done(c)).await.ok().map(|c| *c)
    }

    /// What the watch saw so far (hold it briefly: the watch waits for it).
    pub fn seen(&self) -> MutexGuard<'_, Seen> {
        lock(&self.seen)
    }
}

/// Notes that `name` met its goal (first time only); whether it meets it now.
fn note(seen: &mut Seen, name: &str, goal: Option<String>, now: Instant) -> bool {
    match goal {
        Some(detail) => {
            seen.reached.entry(name.to_owned()).or_insert((now, detail));
            true
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
    use std::time::Duration;

    fn ready(c: &ConfigMap) -> Option<String> {
        c.data.as_ref()?.get("ready").cloned()
    }

    fn cm(name: &str) -> ConfigMap {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"run": "goals"}},
        }))
        .unwrap()
    }

    #[test]
    fn the_match_count_follows_every_change() {
        let now = Instant::now();
        let mut seen = Seen::default();
        seen.set_existing("a".into(), true);
        seen.set_existing("b".into(), false);
        seen.set_existing("a".into(), true);
        assert_eq!(seen.matching, 1, "the same state twice counts once");
        seen.set_existing("b".into(), true);
        assert_eq!(seen.matching, 2);
        seen.set_existing("a".into(), false);
        assert_eq!(seen.matching, 1);
        seen.set_gone("b".into(), now);
        seen.set_gone("c".into(), now);
        assert_eq!(seen.matching, 0);
        assert_eq!(seen.existing.len(), 1);
        assert_eq!(seen.gone.len(), 2);
        let recount = seen.existing.values().filter(|m| **m).count();
        assert_eq!(seen.matching, recount);
    }

    #[tokio::test]
    async fn goals_are_timed_once_and_counts_follow_changes_and_deletes() {
        apiserver::install_crypto_provider();
        let api = apiserver::ApiServer::start(apiserver::Config::default())
            .await
            .unwrap();
        let client = kube::Client::try_from(api.kube_config().unwrap()).unwrap();
        let cms: Api<ConfigMap> = Api::namespaced(client, "default");
        cms.create(&PostParams::default(), &cm("a")).await.unwrap();
        cms.create(&PostParams::default(), &cm("other"))
            .await
            .unwrap();
        let w = GoalWatch::spawn(
            cms.clone(),
            watcher::Config::default().labels("run=goals"),
            ready,
        );
        let wait = |done: fn(&Counts) -> bool| {
            tokio::time::timeout(Duration::from_secs(10), w.until(done))
        };
        let c = wait(|c| c.synced).await.unwrap().unwrap();
        assert_eq!((c.existing, c.matching, c.reached), (2, 0, 0));

        let set = |v: &str| Patch::Merge(serde_json::json!({"data": {"ready": v}}));
        cms.patch("a", &PatchParams::default(), &set("vol-1"))
            .await
            .unwrap();
        let c = wait(|c| c.matching == 1).await.unwrap().unwrap();
        assert_eq!(c.reached, 1);
        let first = w.seen().reached_at("a").unwrap();
        // Met again: the first instant and detail stay.
        cms.patch("a", &PatchParams::default(), &set("vol-2"))
            .await
            .unwrap();
        cms.patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"data": null})),
        )
        .await
        .unwrap();
        let c = wait(|c| c.matching == 0).await.unwrap().unwrap();
        assert_eq!(c.reached, 1, "{c:?}");
        assert_eq!(w.seen().reached_at("a"), Some(first));
        assert_eq!(w.seen().reached_with("a"), Some("vol-1"));

        cms.delete("other", &DeleteParams::default()).await.unwrap();
        let c = wait(|c| c.gone == 1).await.unwrap().unwrap();
        assert_eq!(c.existing, 1);
        assert!(w.seen().gone.contains_key("other"));
        drop(w);
        api.shutdown().await.unwrap();
    }
}
