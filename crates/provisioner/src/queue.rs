//! A work queue keyed by object (client-go's rate-limited queue, without the attacher's lanes
//! and metrics): a key is queued at most once, never handed to two workers at once (added while
//! held: queued again when the worker is done), and a failed key waits
//! `start * 2^(failures-1)` (capped at `max`) before it is handed out again. An event for a
//! key waiting out its backoff does not cut the wait short.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// How a worker finished with a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Done (or nothing to do): forget the key's failures.
    Done,
    /// Failed: hand it out again after its backoff.
    Retry,
}

#[derive(Debug, Default)]
struct State {
    ready: VecDeque<String>,
    queued: HashSet<String>,
    processing: HashSet<String>,
    dirty: HashSet<String>,
    waiting: BTreeSet<(Instant, u64, String)>,
    waiting_index: HashMap<String, (Instant, u64)>,
    failures: HashMap<String, u32>,
    seq: u64,
    shut_down: bool,
}

#[derive(Debug)]
pub(crate) struct WorkQueue {
    start: Duration,
    max: Duration,
    state: Mutex<State>,
    notify: Notify,
}

impl WorkQueue {
    pub(crate) fn new(start: Duration, max: Duration) -> Self {
        Self {
            start,
            max,
            state: Mutex::new(State::default()),
            notify: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every mutation is a few map operations: a panicking holder leaves usable state.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The wait after the `failures`-th consecutive failure.
    pub(crate) fn delay(&self, failures: u32) -> Duration {
        let factor = 1u32 << failures.saturating_sub(1).min(30);
        self.start.saturating_mul(factor).min(self.max)
    }

    pub(crate) fn add(&self, key: &str) {
        {
            let mut st = self.lock();
            if st.shut_down {
                return;
            }
            if st.processing.contains(key) {
                st.dirty.insert(key.to_string());
                return;
            }
            if st.waiting_index.contains_key(key) || st.queued.contains(key) {
                return;
            }
            st.queued.insert(key.to_string());
            st.ready.push_back(key.to_string());
        }
        self.notify.notify_waiters();
    }

    /// The next key; `None` once shut down.
    pub(crate) async fn next(&self) -> Option<String> {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let next_due = {
                let mut st = self.lock();
                if st.shut_down {
                    return None;
                }
                let now = Instant::now();
                while let Some((due, seq, key)) = st.waiting.first().cloned() {
                    if due > now {
                        break;
                    }
                    st.waiting.remove(&(due, seq, key.clone()));
                    st.waiting_index.remove(&key);
                    if st.queued.insert(key.clone()) {
                        st.ready.push_back(key);
                    }
                }
                if let Some(key) = st.ready.pop_front() {
                    st.queued.remove(&key);
                    st.processing.insert(key.clone());
                    return Some(key);
                }
                st.waiting.first().map(|(due, ..)| *due)
            };
            match next_due {
                Some(due) => {
                    let sleep = tokio::time::sleep_until(tokio::time::Instant::from_std(due));
                    tokio::select! {
                        () = &mut notified => {}
                        () = sleep => {}
                    }
                }
                None => notified.await,
            }
        }
    }

    /// Gives `key` back.
    pub(crate) fn done(&self, key: &str, outcome: Outcome) {
        {
            let mut st = self.lock();
            st.processing.remove(key);
            let dirty = st.dirty.remove(key);
            match outcome {
                Outcome::Done => {
                    st.failures.remove(key);
                    if dirty && !st.shut_down && st.queued.insert(key.to_string()) {
                        st.ready.push_back(key.to_string());
                    }
                }
                Outcome::Retry => {
                    let failures = {
                        let f = st.failures.entry(key.to_string()).or_insert(0);
                        *f = f.saturating_add(1);
                        *f
                    };
                    let due = Instant::now() + self.delay(failures);
                    st.seq += 1;
                    let seq = st.seq;
                    st.waiting.insert((due, seq, key.to_string()));
                    st.waiting_index.insert(key.to_string(), (due, seq));
                }
            }
        }
        self.notify.notify_waiters();
    }

    /// Forgets a key's failures and pending retry (its object is gone for good).
    pub(crate) fn forget(&self, key: &str) {
        let mut st = self.lock();
        st.failures.remove(key);
        if let Some((due, seq)) = st.waiting_index.remove(key) {
            st.waiting.remove(&(due, seq, key.to_string()));
        }
    }

    pub(crate) fn shut_down(&self) {
        self.lock().shut_down = true;
        self.notify.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[tokio::test]
    async fn keys_are_deduplicated_held_once_and_retried_after_backoff() {
        let q = WorkQueue::new(Duration::from_millis(20), Duration::from_millis(40));
        q.add("a");
        q.add("a");
        q.add("b");
        assert_eq!(q.next().await.as_deref(), Some("a"));
        q.add("a"); // held: dirty
        assert_eq!(q.next().await.as_deref(), Some("b"));
        q.done("a", Outcome::Done);
        assert_eq!(q.next().await.as_deref(), Some("a"));
        let t = Instant::now();
        q.done("a", Outcome::Retry);
        q.add("a"); // waiting out the backoff: no effect
        assert_eq!(q.next().await.as_deref(), Some("a"));
        assert!(t.elapsed() >= Duration::from_millis(20));
        assert_eq!(q.delay(1), Duration::from_millis(20));
        assert_eq!(q.delay(5), Duration::from_millis(40));
        q.shut_down();
        assert_eq!(q.next().await, None);
    }
}
