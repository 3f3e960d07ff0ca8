//! Merges concurrent describe-by-ID calls into one request (the EBS driver design,
//! docs/design/ebs-driver.md, "DescribeVolumes quota").
//!
//! Callers ask for one ID each. The first caller of a batch starts a timer of `window`; every
//! caller that arrives before it fires (or until `max_size` IDs are waiting) joins the batch,
//! and then ONE request carries all the IDs. Each caller gets its own item, or
//! [`CloudError::NotFound`] when the response did not contain it; an error of the whole request
//! goes to every caller of the batch.
//!
//! Why a window of 100 ms by default: attach and detach take 1-4 s on AWS and the waits poll
//! every 0.5-2 s, so 100 ms is a small fraction of any wait, while 100 publishes started
//! together poll within a few milliseconds of each other and so share one call.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;

use crate::{CloudError, Result};

/// `--batching`, `--batch-window-ms`, `--batch-max-size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchConfig {
    pub enabled: bool,
    pub window: Duration,
    /// EC2 takes up to 200 values per filter; the default stays at that.
    pub max_size: usize,
}

impl Default for BatchConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            window: Duration::from_millis(100),
            max_size: 200,
        }
    }
}

/// The batched request: all the IDs in, what was found out (keyed by ID).
pub type ExecFuture<V> = Pin<Box<dyn Future<Output = Result<HashMap<String, V>>> + Send>>;
type Exec<V> = Arc<dyn Fn(Vec<String>) -> ExecFuture<V> + Send + Sync>;
type Waiter<V> = (String, oneshot::Sender<Result<V>>);

struct Pending<V> {
    waiters: Vec<Waiter<V>>,
    /// Which batch the running timer belongs to, so a timer never flushes a later batch.
    generation: u64,
}

/// See the module docs. Cheap to clone.
pub struct Batcher<V> {
    kind: &'static str,
    config: BatchConfig,
    exec: Exec<V>,
    pending: Arc<Mutex<Pending<V>>>,
}

impl<V> Clone for Batcher<V> {
    fn clone(&self) -> Self {
        Self {
            kind: self.kind,
            config: self.config,
            exec: self.exec.clone(),
            pending: self.pending.clone(),
        }
    }
}

impl<V> std::fmt::Debug for Batcher<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher")
            .field("kind", &self.kind)
            .field("config", &self.config)
            .finish()
    }
}

impl<V: Clone + Send + 'static> Batcher<V> {
    /// `kind` names the object in NotFound errors ("volume", "instance").
    pub fn new(
        kind: &'static str,
        config: BatchConfig,
        exec: impl Fn(Vec<String>) -> ExecFuture<V> + Send + Sync + 'static,
    ) -> Self {
        Self {
            kind,
            config,
            exec: Arc::new(exec),
            pending: Arc::new(Mutex::new(Pending {
                waiters: Vec::new(),
                generation: 0,
            })),
        }
    }

    pub fn config(&self) -> BatchConfig {
        self.config
    }

    /// The item with this ID, through a batch when batching is on.
    pub async fn get(&self, id: &str) -> Result<V> {
        if !self.config.enabled {
            let mut found = (self.exec)(vec![id.to_string()]).await?;
            return found
                .remove(id)
                .ok_or_else(|| CloudError::not_found(self.kind, id));
        }
        let (tx, rx) = oneshot::channel();
        let flush_now = {
            let mut p = lock(&self.pending);
            p.waiters.push((id.to_string(), tx));
            if p.waiters.len() >= self.config.max_size.max(1) {
                p.generation += 1;
                Some(std::mem::take(&mut p.waiters))
            } else if p.waiters.len() == 1 {
                let generation = p.generation;
                let this = self.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(this.config.window).await;
                    let batch = {
                        let mut p = lock(&this.pending);
                        if p.generation != generation {
                            return;
                        }
                        p.generation += 1;
                        std::mem::take(&mut p.waiters)
                    };
                    this.run(batch).await;
                });
                None
            } else {
                None
            }
        };
        if let Some(batch) = flush_now {
            let this = self.clone();
            tokio::spawn(async move { this.run(batch).await });
        }
        match rx.await {
            Ok(r) => r,
            // The batch task died (runtime shutting down): report it rather than hang.
            Err(_) => Err(CloudError::other(
                "Describe",
                "BatchAborted",
                format!("the batch describing {} {id} was dropped", self.kind),
            )),
        }
    }

    async fn run(&self, batch: Vec<Waiter<V>>) {
        let mut ids: Vec<String> = batch.iter().map(|(id, _)| id.clone()).collect();
        ids.sort();
        ids.dedup();
        tracing::debug!(
            kind = self.kind,
            ids = ids.len(),
            callers = batch.len(),
            "batched describe"
        );
        let result = (self.exec)(ids).await;
        for (id, tx) in batch {
            let item = match &result {
                Ok(found) => found
                    .get(&id)
                    .cloned()
                    .ok_or_else(|| CloudError::not_found(self.kind, id.as_str())),
                Err(e) => Err(e.clone()),
            };
            // The caller may have gone away (its RPC was cancelled); nothing to do then.
            let _ = tx.send(item);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    fn counting(
        calls: Arc<AtomicUsize>,
        sizes: Arc<Mutex<Vec<usize>>>,
        config: BatchConfig,
    ) -> Batcher<String> {
        Batcher::new("volume", config, move |ids: Vec<String>| {
            calls.fetch_add(1, Ordering::SeqCst);
            lock(&sizes).push(ids.len());
            Box::pin(async move {
                if ids.iter().any(|i| i == "boom") {
                    return Err(CloudError::other("DescribeVolumes", "Boom", "bad batch"));
                }
                Ok(ids
                    .into_iter()
                    .filter(|i| !i.starts_with("missing"))
                    .map(|i| (i.clone(), format!("disk {i}")))
                    .collect())
            }) as ExecFuture<String>
        })
    }

    #[tokio::test]
    async fn concurrent_gets_share_one_call_and_get_their_own_item() {
        let calls = Arc::new(AtomicUsize::new(0));
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let b = counting(calls.clone(), sizes.clone(), BatchConfig::default());
        let mut tasks = Vec::new();
        for i in 0..50 {
            let b = b.clone();
            tasks.push(tokio::spawn(async move {
                let id = if i % 10 == 0 {
                    format!("missing-{i}")
                } else {
                    format!("vol-{i}")
                };
                (id.clone(), b.get(&id).await)
            }));
        }
        for t in tasks {
            let (id, r) = t.await.unwrap();
            if id.starts_with("missing") {
                assert!(r.unwrap_err().is_not_found());
            } else {
                assert_eq!(r.unwrap(), format!("disk {id}"));
            }
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(*lock(&sizes), vec![50]);
    }

    #[tokio::test]
    async fn max_size_splits_batches_and_errors_reach_every_caller() {
        let calls = Arc::new(AtomicUsize::new(0));
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let config = BatchConfig {
            max_size: 10,
            ..BatchConfig::default()
        };
        let b = counting(calls.clone(), sizes.clone(), config);
        let futs: Vec<_> = (0..25)
            .map(|i| {
                let b = b.clone();
                async move { b.get(&format!("vol-{i}")).await }
            })
            .collect();
        let mut handles = Vec::new();
        for f in futs {
            handles.push(tokio::spawn(f));
        }
        for h in handles {
            h.await.unwrap().unwrap();
        }
        let mut s = lock(&sizes).clone();
        s.sort();
        assert_eq!(s, vec![5, 10, 10]);

        let (a, bad) = tokio::join!(b.get("vol-ok"), b.get("boom"));
        assert_eq!(a.unwrap_err().to_string(), bad.unwrap_err().to_string());
    }

    #[tokio::test]
    async fn disabled_means_one_call_per_get() {
        let calls = Arc::new(AtomicUsize::new(0));
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let config = BatchConfig {
            enabled: false,
            ..BatchConfig::default()
        };
        let b = counting(calls.clone(), sizes, config);
        let (x, y) = tokio::join!(b.get("vol-1"), b.get("missing-2"));
        assert_eq!(x.unwrap(), "disk vol-1");
        assert!(y.unwrap_err().is_not_found());
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }
}
