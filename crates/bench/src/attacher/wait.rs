//! Watch-driven progress: one watch per resource keeps the number of the run's objects that
//! exist and that satisfy a condition (VolumeAttachment `status.attached`), and the phases wait
//! on those numbers. No polling of GETs: the API server pushes every change.

use std::fmt::Debug;
use std::time::Instant;

use kube::Api;
use kube::runtime::watcher;
use serde::de::DeserializeOwned;

use crate::Error;
use crate::harness::child::{self, Child};
use crate::harness::goals::{Counts, GoalWatch};

/// A background watch of one resource's run objects (the harness's goal watch, named for the
/// errors); stops when dropped.
pub(crate) struct Tracker {
    watch: GoalWatch,
    resource: &'static str,
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
        let config = watcher::Config::default().labels(label_selector);
        let watch = GoalWatch::spawn(api, config, move |o: &K| cond(o).then(String::new));
        Self { watch, resource }
    }

    #[cfg(test)]
    pub(crate) fn counts(&self) -> Counts {
        self.watch.counts()
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
        let mut rx = self.watch.receiver();
        let seen = self.watch.receiver();
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
