//! When each bench object first reached its goal (a pod Ready, a claim Bound), seen by the
//! harness's goal watch, and polling waits that say how far they got when they run out of time.

use std::collections::HashMap;
use std::future::Future;
use std::time::{Duration, Instant};

use kube::Api;
use kube::runtime::watcher;

use crate::harness::goals;
use cluster::Error;

/// The label on every object the bench creates (its watches and deletes select on it).
pub(crate) const LABEL: &str = "csi.rs/bench";
pub(crate) const LABEL_SELECTOR: &str = "csi.rs/bench=true";

/// The harness's goal watch on the bench's objects, with waits that fail as the cluster's
/// other waits do (`cluster::Error::Timeout`, saying how far they got); stops when dropped.
pub(crate) struct GoalWatch(goals::GoalWatch);

impl GoalWatch {
    pub(crate) fn spawn<K>(api: Api<K>, goal: fn(&K) -> bool) -> Self
    where
        K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    {
        let config = watcher::Config::default().labels(LABEL_SELECTOR);
        Self(goals::GoalWatch::spawn(api, config, move |o: &K| {
            goal(o).then(String::new)
        }))
    }

    /// Waits until the watch's first list is done.
    pub(crate) async fn synced(&mut self, patience: Duration) -> Result<(), Error> {
        match tokio::time::timeout(patience, self.0.until(|c| c.synced)).await {
            Ok(Some(_)) => Ok(()),
            _ => Err(Error::Timeout {
                what: "the bench's watch listing".into(),
                waited: patience,
                progress: "no list yet".into(),
            }),
        }
    }

    /// Waits until every one of `names` reached the goal.
    pub(crate) async fn reached(
        &mut self,
        names: &[String],
        what: &str,
        patience: Duration,
    ) -> Result<(), Error> {
        let deadline = Instant::now() + patience;
        let mut rx = self.0.receiver();
        loop {
            rx.borrow_and_update();
            let missing: Vec<String> = {
                let seen = self.0.seen();
                names
                    .iter()
                    .filter(|n| !seen.reached.contains_key(*n))
                    .cloned()
                    .collect()
            };
            if missing.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::Timeout {
                    what: what.to_string(),
                    waited: patience,
                    progress: format!(
                        "{} of {} did; not yet: {}",
                        names.len() - missing.len(),
                        names.len(),
                        missing[..missing.len().min(5)].join(", ")
                    ),
                });
            }
            let _ = tokio::time::timeout(Duration::from_millis(200), rx.changed()).await;
        }
    }

    /// Name → the instant it first met the goal.
    pub(crate) fn times(&self) -> HashMap<String, Instant> {
        self.0
            .seen()
            .reached
            .iter()
            .map(|(name, (at, _))| (name.clone(), *at))
            .collect()
    }
}

/// Polls `remaining` (what is still there, as names) until it is empty, at most `patience`.
pub(crate) async fn until_gone<F, Fut>(
    what: &str,
    patience: Duration,
    mut remaining: F,
) -> Result<(), Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Vec<String>, Error>>,
{
    let deadline = Instant::now() + patience;
    loop {
        let progress = match remaining().await {
            Ok(left) if left.is_empty() => return Ok(()),
            Ok(left) => format!(
                "{} left: {}",
                left.len(),
                left.iter().take(5).cloned().collect::<Vec<_>>().join(", ")
            ),
            Err(e) => e.to_string(),
        };
        if Instant::now() > deadline {
            return Err(Error::Timeout {
                what: what.to_string(),
                waited: patience,
                progress,
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
