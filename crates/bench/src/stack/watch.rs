//! When each bench object first reached its goal (a pod Ready, a claim Bound), seen by a watch,
//! and polling waits that say how far they got when they run out of time.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use kube::Api;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use cluster::Error;

/// The label on every object the bench creates (its watches and deletes select on it).
pub(crate) const LABEL: &str = "csi.rs/bench";
pub(crate) const LABEL_SELECTOR: &str = "csi.rs/bench=true";

/// A watch in the background recording the first instant each object met `goal`; stops
/// when dropped.
pub(crate) struct GoalWatch {
    reached: Arc<Mutex<HashMap<String, Instant>>>,
    /// (synced, how many reached the goal): wakes the waits.
    rx: watch::Receiver<(bool, usize)>,
    task: JoinHandle<()>,
}

impl Drop for GoalWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl GoalWatch {
    pub(crate) fn spawn<K>(api: Api<K>, goal: fn(&K) -> bool) -> Self
    where
        K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    {
        let reached = Arc::new(Mutex::new(HashMap::new()));
        let (tx, rx) = watch::channel((false, 0));
        let r = Arc::clone(&reached);
        let config = watcher::Config::default().labels(LABEL_SELECTOR);
        let task = tokio::spawn(async move {
            let mut stream = watcher::watcher(api, config).default_backoff().boxed();
            let mut synced = false;
            while let Some(event) = stream.next().await {
                // Taken at once: the instant is the measurement.
                let now = Instant::now();
                let mut reached = r.lock().unwrap_or_else(PoisonError::into_inner);
                match event {
                    Ok(Event::Apply(o) | Event::InitApply(o)) if goal(&o) => {
                        let name = o.meta().name.clone().unwrap_or_default();
                        reached.entry(name).or_insert(now);
                    }
                    Ok(Event::InitDone) => synced = true,
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "bench watch; it lists again"),
                }
                let _ = tx.send((synced, reached.len()));
            }
        });
        Self { reached, rx, task }
    }

    /// Waits until the watch's first list is done.
    pub(crate) async fn synced(&mut self, patience: Duration) -> Result<(), Error> {
        let deadline = Instant::now() + patience;
        while !self.rx.borrow_and_update().0 {
            if Instant::now() > deadline {
                return Err(Error::Timeout {
                    what: "the bench's watch listing".into(),
                    waited: patience,
                    progress: "no list yet".into(),
                });
            }
            let _ = tokio::time::timeout(Duration::from_millis(200), self.rx.changed()).await;
        }
        Ok(())
    }

    /// Waits until every one of `names` reached the goal.
    pub(crate) async fn reached(
        &mut self,
        names: &[String],
        what: &str,
        patience: Duration,
    ) -> Result<(), Error> {
        let deadline = Instant::now() + patience;
        loop {
            self.rx.borrow_and_update();
            let reached = self.times();
            let missing: Vec<&str> = names
                .iter()
                .filter(|n| !reached.contains_key(*n))
                .map(String::as_str)
                .collect();
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
            let _ = tokio::time::timeout(Duration::from_millis(200), self.rx.changed()).await;
        }
    }

    /// Name → the instant it first met the goal.
    pub(crate) fn times(&self) -> HashMap<String, Instant> {
        self.reached
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
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
