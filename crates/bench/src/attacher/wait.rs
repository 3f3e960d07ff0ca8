//! Watch-driven progress: one watch per resource keeps the number of the run's objects that
//! exist and that satisfy a condition (VolumeAttachment `status.attached`), and the phases wait
//! on those numbers. No polling of GETs: the API server pushes every change.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::time::Instant;

use futures::StreamExt;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::Error;
use crate::harness::child::{self, Child};

/// What the watch has seen of the run's objects.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    /// The initial list is in: the numbers are real.
    pub(crate) synced: bool,
    pub(crate) existing: usize,
    /// Objects for which the condition holds.
    pub(crate) matching: usize,
}

/// A background watch; stops when dropped.
pub(crate) struct Tracker {
    rx: watch::Receiver<Counts>,
    task: JoinHandle<()>,
    resource: &'static str,
}

impl Drop for Tracker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Tracker {
    /// Watches `api` (objects with `label_selector`) and counts those for which `cond` holds.
    pub(crate) fn spawn<K>(
        api: Api<K>,
        resource: &'static str,
        label_selector: &str,
        cond: fn(&K) -> bool,
    ) -> Self
    where
        K: kube::Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    {
        let (tx, rx) = watch::channel(Counts::default());
        let config = watcher::Config::default().labels(label_selector);
        let task = tokio::spawn(async move {
            let mut state: BTreeMap<String, bool> = BTreeMap::new();
            let mut pending: BTreeMap<String, bool> = BTreeMap::new();
            let mut synced = false;
            let mut stream = watcher::watcher(api, config).default_backoff().boxed();
            while let Some(event) = stream.next().await {
                let name = |o: &K| o.meta().name.clone().unwrap_or_default();
                match event {
                    Ok(Event::Init) => pending.clear(),
                    Ok(Event::InitApply(o)) => {
                        pending.insert(name(&o), cond(&o));
                        continue;
                    }
                    Ok(Event::InitDone) => {
                        state = std::mem::take(&mut pending);
                        synced = true;
                    }
                    Ok(Event::Apply(o)) => {
                        state.insert(name(&o), cond(&o));
                    }
                    Ok(Event::Delete(o)) => {
                        state.remove(&name(&o));
                    }
                    Err(e) => {
                        // The watcher re-lists after a backoff; the counts stay as they were.
                        tracing::warn!(resource, error = %e, "watch failed; retrying");
                        continue;
                    }
                }
                let counts = Counts {
                    synced,
                    existing: state.len(),
                    matching: state.values().filter(|m| **m).count(),
                };
                tx.send_replace(counts);
            }
        });
        Self { rx, task, resource }
    }

    #[cfg(test)]
    pub(crate) fn counts(&self) -> Counts {
        *self.rx.borrow()
    }

    /// Waits until `done` holds for the counts, the attacher exits (an error with its log), or
    /// `deadline` passes (an error that says how far it got).
    pub(crate) async fn wait(
        &mut self,
        phase: &'static str,
        done: impl Fn(&Counts) -> bool,
        attacher: Option<&mut Child>,
        deadline: Instant,
    ) -> Result<(), Error> {
        let resource = self.resource;
        let mut rx = self.rx.clone();
        let seen = self.rx.clone();
        let progress = move || {
            let c = *seen.borrow();
            format!(
                "{} {resource} exist, {} done, watch synced: {}",
                c.existing, c.matching, c.synced
            )
        };
        let work = async move {
            rx.wait_for(|c| done(c))
                .await
                .map(|_| ())
                .map_err(|_| Error::Watch {
                    resource,
                    reason: "the watch task ended".into(),
                })
        };
        let mut children: Vec<&mut Child> = attacher.into_iter().collect();
        let phase = format!("the {phase} phase");
        child::during(&mut children, &phase, deadline, progress, work).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::storage::v1::VolumeAttachment;
    use kube::api::{Patch, PatchParams, PostParams};
    use serde_json::json;
    use std::time::Duration;

    fn attached(va: &VolumeAttachment) -> bool {
        va.status.as_ref().is_some_and(|s| s.attached)
    }

    #[tokio::test]
    async fn counts_follow_status_changes_and_deletes() {
        apiserver::install_crypto_provider();
        let api = apiserver::ApiServer::start(apiserver::Config::default())
            .await
            .unwrap();
        let vas: Api<VolumeAttachment> = Api::all(api.client());
        let make = |name: &str, label: bool| {
            let labels = if label {
                json!({"sel": "yes"})
            } else {
                json!({})
            };
            serde_json::from_value::<VolumeAttachment>(json!({
                "apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
                "metadata": {"name": name, "labels": labels},
                "spec": {"attacher": "d", "nodeName": "n", "source": {"persistentVolumeName": "pv"}},
            }))
            .unwrap()
        };
        vas.create(&PostParams::default(), &make("a", true))
            .await
            .unwrap();
        let mut tracker = Tracker::spawn(vas.clone(), "volumeattachments", "sel=yes", attached);
        let deadline = Instant::now() + Duration::from_secs(20);
        tracker
            .wait("sync", |c| c.synced && c.existing == 1, None, deadline)
            .await
            .unwrap();
        vas.create(&PostParams::default(), &make("b", true))
            .await
            .unwrap();
        vas.create(&PostParams::default(), &make("other", false))
            .await
            .unwrap();
        for name in ["a", "b", "other"] {
            vas.patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"attached": true}})),
            )
            .await
            .unwrap();
        }
        tracker
            .wait("attach", |c| c.matching == 2, None, deadline)
            .await
            .unwrap();
        assert_eq!(
            tracker.counts().existing,
            2,
            "the unlabelled one is not counted"
        );

        vas.delete("a", &Default::default()).await.unwrap();
        tracker
            .wait("delete", |c| c.existing == 1, None, deadline)
            .await
            .unwrap();
        assert_eq!(tracker.counts().matching, 1);

        // A deadline that passes reports how far it got.
        let err = tracker
            .wait(
                "never",
                |c| c.existing == 5,
                None,
                Instant::now() + Duration::from_millis(50),
            )
            .await
            .unwrap_err();
        let text = err.to_string();
        assert!(text.contains("never"), "{text}");
        assert!(text.contains("1 volumeattachments exist, 1 done"), "{text}");
    }
}
