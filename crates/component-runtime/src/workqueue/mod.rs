//! A work queue keyed by object name, with lanes, per-key exponential backoff and optional
//! client-go `workqueue_*` metrics, shared by the sidecars' controllers.
//!
//! Semantics (client-go's rate-limited work queue, plus lanes):
//! - a key is queued at most once (adding it again while it waits is a no-op);
//! - a key is never handed to two workers at once, whatever lane it is in: a key added while a
//!   worker holds it is remembered ("dirty") and queued again when that worker is done;
//! - each lane has its own workers (the attacher puts VolumeAttachments being deleted in a
//!   detach lane and the rest in an attach lane, so a storm of detaches never starves
//!   attaches, and the other way round); a controller that needs no lanes builds the queue with
//!   [`WorkQueue::single_lane`] and uses [`SINGLE_LANE`];
//! - a failed key waits `start * 2^(failures-1)` (capped at `max`) before it is handed out again;
//!   only success ([`Outcome::Done`]) forgets its failures. An event for a key that is waiting out
//!   its backoff in the same lane does not cut the wait short (so the controller's own status
//!   writes, or any other update, never defeat the backoff); moving to another lane (the object
//!   started being deleted) is handled at once;
//! - a key that failed for want of another object ([`Outcome::RetryWhenAvailable`]) is retried
//!   at once when that object appears ([`WorkQueue::kick`]).
//!
//! Metrics: [`QueueMetrics`] (counters and histograms, updated as keys move) and
//! [`QueueGauges`] (read from the queues at scrape time), under client-go's `workqueue_*` names
//! with the lane name as the `name` label.
//!
//! A worker loop:
//!
//! ```no_run
//! # async fn work(key: &str) -> component_runtime::workqueue::Outcome { component_runtime::workqueue::Outcome::Done }
//! # async fn run() {
//! use std::time::Duration;
//! use component_runtime::workqueue::{Backoff, SINGLE_LANE, WorkQueue};
//!
//! let backoff = Backoff { start: Duration::from_secs(1), max: Duration::from_secs(300) };
//! let queue = WorkQueue::single_lane("my-controller", backoff, None);
//! queue.add("default/claim-1", SINGLE_LANE);
//! while let Some(item) = queue.next(SINGLE_LANE).await {
//!     let outcome = work(&item.key).await;
//!     queue.done(&item, outcome);
//! }
//! # }
//! ```

mod backoff;
mod failures;
mod kick;
mod metrics;
mod state;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::Notify;

pub use self::backoff::Backoff;
pub use self::failures::Failures;
pub use self::metrics::{LaneSnapshot, QueueGauges, QueueMetrics, register_queue_gauges};
use self::state::{State, remove_waiting};

/// Index of a lane in its queue.
pub type Lane = usize;

/// How a worker finished with a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Finished (or nothing to do): forget the key's failures.
    Done,
    /// Failed: hand the key out again after its backoff.
    Retry,
    /// Failed for want of another object (a PV, a CSINode): like `Retry`, but if that object
    /// appeared while the key was being processed ([`WorkQueue::kick`]), retry at once.
    RetryWhenAvailable,
}

/// The lane of a queue built with [`WorkQueue::single_lane`].
pub const SINGLE_LANE: Lane = 0;

/// A key handed to a worker; give it back with [`WorkQueue::done`].
#[derive(Debug, Clone)]
pub struct Item {
    /// The key as it was added.
    pub key: String,
    /// The lane it was taken from.
    pub lane: Lane,
}

/// The queue; share it between workers and watches with an `Arc`.
pub struct WorkQueue {
    lanes: Vec<String>,
    backoff: Backoff,
    state: Mutex<State>,
    notify: Notify,
    metrics: Option<Arc<QueueMetrics>>,
}

impl std::fmt::Debug for WorkQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkQueue")
            .field("lanes", &self.lanes)
            .finish_non_exhaustive()
    }
}

impl WorkQueue {
    /// A queue with one lane per name (the names label the metrics).
    pub fn new(lanes: &[&str], backoff: Backoff, metrics: Option<Arc<QueueMetrics>>) -> Self {
        let state = State {
            ready: lanes.iter().map(|_| VecDeque::new()).collect(),
            ..State::default()
        };
        Self {
            lanes: lanes.iter().map(|s| (*s).to_string()).collect(),
            backoff,
            state: Mutex::new(state),
            notify: Notify::new(),
            metrics,
        }
    }

    /// A queue with one lane, [`SINGLE_LANE`], named `name` in the metrics.
    pub fn single_lane(name: &str, backoff: Backoff, metrics: Option<Arc<QueueMetrics>>) -> Self {
        Self::new(&[name], backoff, metrics)
    }

    /// The lane names, by lane index.
    pub fn lane_names(&self) -> &[String] {
        &self.lanes
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A worker that panicked while holding the lock leaves consistent-enough state (every
        // mutation below is a few map operations); keep serving rather than cascade the panic.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `key` in `lane` (see the module docs for dedup and backoff rules).
    pub fn add(&self, key: &str, lane: Lane) {
        let lane = lane.min(self.lanes.len().saturating_sub(1));
        {
            let mut st = self.lock();
            if st.shut_down {
                return;
            }
            if st.processing.contains_key(key) {
                st.dirty.insert(key.to_string(), lane);
                return;
            }
            if let Some(&(_, _, wait_lane)) = st.waiting_index.get(key) {
                if wait_lane == lane {
                    // Waiting out a backoff: an event does not cut it short.
                    return;
                }
                remove_waiting(&mut st, key);
            }
            if let Some(&(queued_lane, _)) = st.queued.get(key) {
                if queued_lane == lane {
                    return;
                }
                st.ready[queued_lane].retain(|k| k != key);
                st.queued.remove(key);
            }
            self.push_ready(&mut st, key.to_string(), lane);
        }
        self.notify.notify_waiters();
    }

    /// Any key waiting out a backoff?
    #[cfg(test)]
    pub(crate) fn has_backoff(&self) -> bool {
        !self.lock().waiting_index.is_empty()
    }

    fn push_ready(&self, st: &mut State, key: String, lane: Lane) {
        st.queued.insert(key.clone(), (lane, Instant::now()));
        st.ready[lane].push_back(key);
        if let Some(m) = &self.metrics {
            m.added(&self.lanes[lane]);
        }
    }

    /// Waits for the next key of `lane`; `None` once the queue is shut down.
    pub async fn next(&self, lane: Lane) -> Option<Item> {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let next_due = {
                let mut st = self.lock();
                if st.shut_down {
                    return None;
                }
                let promoted = self.promote_due(&mut st);
                if promoted {
                    // Keys of other lanes may have become ready: wake their workers.
                    self.notify.notify_waiters();
                }
                if let Some(key) = st.ready.get_mut(lane).and_then(VecDeque::pop_front) {
                    let queued_at = st.queued.remove(&key).map(|(_, t)| t);
                    let now = Instant::now();
                    st.processing.insert(key.clone(), (lane, now));
                    if let (Some(m), Some(t)) = (&self.metrics, queued_at) {
                        m.started(&self.lanes[lane], now.saturating_duration_since(t));
                    }
                    return Some(Item { key, lane });
                }
                st.waiting.first().map(|(due, ..)| *due)
            };
            match next_due {
                Some(due) => {
                    tokio::select! {
                        () = &mut notified => {}
                        () = tokio::time::sleep_until(due.into()) => {}
                    }
                }
                None => notified.await,
            }
        }
    }

    /// Moves keys whose backoff is over to their lane; true if any moved.
    fn promote_due(&self, st: &mut State) -> bool {
        let now = Instant::now();
        let mut moved = false;
        while let Some((due, _, key)) = st.waiting.first().cloned() {
            if due > now {
                break;
            }
            let lane = st.waiting_index.get(&key).map_or(0, |(_, _, l)| *l);
            remove_waiting(st, &key);
            if st.processing.contains_key(&key) || st.queued.contains_key(&key) {
                continue;
            }
            self.push_ready(st, key, lane);
            moved = true;
        }
        moved
    }

    /// Gives `item` back: forget its failures, or schedule a retry after its backoff.
    pub fn done(&self, item: &Item, outcome: Outcome) {
        {
            let mut st = self.lock();
            let started = st.processing.remove(&item.key).map(|(_, t)| t);
            st.last_done.insert(item.key.clone(), Instant::now());
            if let (Some(m), Some(t)) = (&self.metrics, started) {
                m.finished(&self.lanes[item.lane], t.elapsed());
            }
            let dirty = st.dirty.remove(&item.key);
            let kicked = st.kicked.remove(&item.key);
            st.awaiting_object.remove(&item.key);
            if st.shut_down {
                return;
            }
            match outcome {
                Outcome::Done => {
                    st.failures.remove(&item.key);
                    if let Some(lane) = dirty {
                        self.push_ready(&mut st, item.key.clone(), lane);
                    }
                }
                Outcome::Retry | Outcome::RetryWhenAvailable => {
                    // A kick only shortens the wait of a failure that was about a missing object;
                    // any other failure (a CSI error, say) keeps its backoff.
                    let kicked = kicked && outcome == Outcome::RetryWhenAvailable;
                    let failures = {
                        let f = st.failures.entry(item.key.clone()).or_insert(0);
                        *f = f.saturating_add(1);
                        *f
                    };
                    if let Some(m) = &self.metrics {
                        m.retried(&self.lanes[item.lane]);
                    }
                    match dirty {
                        // The object moved to another lane meanwhile, or what it was missing
                        // appeared while it failed: handle that now.
                        Some(lane) if lane != item.lane || kicked => {
                            self.push_ready(&mut st, item.key.clone(), lane);
                        }
                        // Same lane: the retry re-reads the object anyway; keep the backoff.
                        _ => {
                            if outcome == Outcome::RetryWhenAvailable {
                                st.awaiting_object.insert(item.key.clone());
                            }
                            let due = Instant::now() + self.backoff.delay(failures);
                            st.seq += 1;
                            let seq = st.seq;
                            st.waiting.insert((due, seq, item.key.clone()));
                            st.waiting_index
                                .insert(item.key.clone(), (due, seq, item.lane));
                        }
                    }
                }
            }
        }
        self.notify.notify_waiters();
    }

    /// Forgets `key`'s failures and any pending retry (the object is gone).
    pub fn forget(&self, key: &str) {
        let mut st = self.lock();
        st.failures.remove(key);
        st.last_done.remove(key);
        st.awaiting_object.remove(key);
        remove_waiting(&mut st, key);
    }

    /// Like [`forget`](Self::forget), but only when nothing is pending for `key` (not queued,
    /// held, or waiting out a backoff): a controller calls it after a worker finished a key whose
    /// object is gone, so the queue's memory of the key goes too, without dropping a retry that
    /// another worker scheduled meanwhile (the object came back under the same name).
    pub fn forget_if_idle(&self, key: &str) {
        let mut st = self.lock();
        if st.queued.contains_key(key)
            || st.processing.contains_key(key)
            || st.waiting_index.contains_key(key)
        {
            return;
        }
        st.failures.remove(key);
        st.last_done.remove(key);
        st.awaiting_object.remove(key);
    }

    /// Is `key` queued, held by a worker, waiting out a backoff, or was it given back after
    /// `since`? (The reconciler's snapshot of the driver is then older than the key's state.)
    pub fn busy_since(&self, key: &str, since: Instant) -> bool {
        let st = self.lock();
        st.queued.contains_key(key)
            || st.processing.contains_key(key)
            || st.waiting_index.contains_key(key)
            || st.last_done.get(key).is_some_and(|t| *t >= since)
    }

    /// Consecutive failures of `key` so far.
    #[cfg(test)]
    pub(crate) fn failures(&self, key: &str) -> u32 {
        self.lock().failures.get(key).copied().unwrap_or(0)
    }

    /// Stops handing out keys; `next` returns `None` in every lane.
    pub fn shut_down(&self) {
        self.lock().shut_down = true;
        self.notify.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    pub(super) fn queue(lanes: &[&str]) -> WorkQueue {
        queue_with(lanes, Duration::from_millis(20))
    }

    /// A queue whose first backoff outlasts any test.
    pub(super) fn slow_queue(lanes: &[&str]) -> WorkQueue {
        queue_with(lanes, Duration::from_secs(600))
    }

    pub(super) fn queue_with(lanes: &[&str], start: Duration) -> WorkQueue {
        WorkQueue::new(
            lanes,
            Backoff {
                start,
                max: start * 10,
            },
            None,
        )
    }

    pub(super) async fn next_now(q: &WorkQueue, lane: Lane) -> Option<Item> {
        tokio::time::timeout(Duration::from_millis(20), q.next(lane))
            .await
            .ok()
            .flatten()
    }

    #[tokio::test]
    async fn a_key_is_queued_once() {
        let q = queue(&["a"]);
        q.add("x", 0);
        q.add("x", 0);
        q.add("y", 0);
        assert_eq!(q.snapshot()[0].depth, 2);
        let first = next_now(&q, 0).await.expect("x");
        assert_eq!(first.key, "x");
        let second = next_now(&q, 0).await.expect("y");
        assert_eq!(second.key, "y");
        assert!(next_now(&q, 0).await.is_none());
    }

    #[tokio::test]
    async fn a_key_held_by_a_worker_is_not_handed_out_again_until_done() {
        let q = queue(&["attach", "detach"]);
        q.add("x", 0);
        let item = next_now(&q, 0).await.expect("x");
        q.add("x", 0);
        q.add("x", 1);
        assert!(next_now(&q, 0).await.is_none());
        assert!(next_now(&q, 1).await.is_none());
        q.done(&item, Outcome::Done);
        // The last add wins: the detach lane.
        assert!(next_now(&q, 0).await.is_none());
        assert_eq!(next_now(&q, 1).await.expect("again").key, "x");
    }

    #[tokio::test]
    async fn failures_wait_a_growing_backoff_and_success_forgets_them() {
        let q = queue(&["a"]);
        q.add("x", 0);
        let mut item = next_now(&q, 0).await.expect("x");
        let mut gaps = Vec::new();
        for _ in 0..5 {
            let failed_at = Instant::now();
            q.done(&item, Outcome::Retry);
            // An event meanwhile does not cut the wait short.
            q.add("x", 0);
            item = tokio::time::timeout(Duration::from_secs(5), q.next(0))
                .await
                .expect("retried within 5s")
                .expect("item");
            gaps.push(failed_at.elapsed());
        }
        assert_eq!(q.failures("x"), 5);
        for (gap, want_ms) in gaps.iter().zip([20, 40, 80, 160, 200]) {
            assert!(*gap >= Duration::from_millis(want_ms), "{gaps:?}");
        }
        q.done(&item, Outcome::Done);
        assert_eq!(q.failures("x"), 0);
    }

    #[tokio::test]
    async fn an_event_during_backoff_does_not_reset_it() {
        let q = slow_queue(&["a"]);
        q.add("x", 0);
        let item = next_now(&q, 0).await.expect("x");
        q.done(&item, Outcome::Retry);
        // A status-only update (or any event) for the same lane: still waiting.
        q.add("x", 0);
        assert!(next_now(&q, 0).await.is_none());
        assert_eq!(q.snapshot()[0].in_backoff, 1);
        assert_eq!(q.failures("x"), 1);
    }

    #[tokio::test]
    async fn a_dirty_key_that_failed_keeps_its_backoff() {
        let q = slow_queue(&["a"]);
        q.add("x", 0);
        let item = next_now(&q, 0).await.expect("x");
        q.add("x", 0); // e.g. our own status write, seen while the worker still holds x
        q.done(&item, Outcome::Retry);
        assert!(next_now(&q, 0).await.is_none());
        assert_eq!(q.snapshot()[0].in_backoff, 1);
    }

    #[tokio::test]
    async fn moving_to_another_lane_skips_the_wait_but_keeps_the_failures() {
        let q = slow_queue(&["attach", "detach"]);
        q.add("x", 0);
        let item = next_now(&q, 0).await.expect("x");
        q.done(&item, Outcome::Retry);
        q.add("x", 1);
        let item = next_now(&q, 1).await.expect("x in detach lane");
        assert_eq!(q.failures("x"), 1);
        q.done(&item, Outcome::Retry);
        assert_eq!(q.failures("x"), 2);
    }

    #[tokio::test]
    async fn lanes_are_served_independently() {
        let q = queue(&["attach", "detach"]);
        for i in 0..100 {
            q.add(&format!("d{i}"), 1);
        }
        q.add("a0", 0);
        // An attach worker gets its key even with a hundred detaches queued ahead.
        assert_eq!(next_now(&q, 0).await.expect("a0").key, "a0");
        let snap = q.snapshot();
        assert_eq!(snap[1].depth, 100);
        assert_eq!(snap[0].processing, 1);
    }

    #[tokio::test]
    async fn busy_since_covers_queued_held_waiting_and_recently_done_keys() {
        let q = slow_queue(&["a"]);
        let t0 = Instant::now();
        assert!(!q.busy_since("x", t0));
        q.add("x", 0);
        assert!(q.busy_since("x", t0), "queued");
        let item = next_now(&q, 0).await.expect("x");
        assert!(q.busy_since("x", t0), "held");
        q.done(&item, Outcome::Done);
        assert!(q.busy_since("x", t0), "done after t0");
        assert!(!q.busy_since("x", Instant::now() + Duration::from_secs(1)));
        q.add("x", 0);
        let item = next_now(&q, 0).await.expect("x");
        q.done(&item, Outcome::Retry);
        assert!(
            q.busy_since("x", Instant::now() + Duration::from_secs(1)),
            "in backoff"
        );
    }

    #[tokio::test]
    async fn forget_drops_a_pending_retry() {
        let q = slow_queue(&["a"]);
        q.add("x", 0);
        let item = next_now(&q, 0).await.expect("x");
        q.done(&item, Outcome::Retry);
        q.forget("x");
        assert_eq!(q.failures("x"), 0);
        assert_eq!(q.snapshot()[0].in_backoff, 0);
        q.add("x", 0);
        assert!(next_now(&q, 0).await.is_some());
    }

    #[tokio::test]
    async fn forget_if_idle_keeps_a_pending_retry_and_drops_an_idle_key() {
        let q = slow_queue(&["a"]);
        q.add("x", 0);
        let item = next_now(&q, 0).await.expect("x");
        q.done(&item, Outcome::Retry);
        q.forget_if_idle("x");
        assert!(q.has_backoff(), "a scheduled retry survives");
        assert_eq!(q.failures("x"), 1);
        q.forget("x");
        q.add("x", 0);
        let item = next_now(&q, 0).await.expect("x");
        let t0 = Instant::now();
        q.done(&item, Outcome::Done);
        assert!(q.busy_since("x", t0), "remembered as given back");
        q.forget_if_idle("x");
        assert!(!q.busy_since("x", t0), "forgotten once idle");
    }

    #[tokio::test]
    async fn single_lane_queue_works_lane_zero() {
        let q = WorkQueue::single_lane(
            "one",
            Backoff {
                start: Duration::from_secs(600),
                max: Duration::from_secs(600),
            },
            None,
        );
        assert_eq!(q.lane_names(), ["one"]);
        q.add("x", SINGLE_LANE);
        let item = next_now(&q, SINGLE_LANE).await.expect("x");
        assert_eq!((item.key.as_str(), item.lane), ("x", SINGLE_LANE));
    }

    #[tokio::test]
    async fn shut_down_wakes_waiting_workers() {
        let q = Arc::new(queue(&["a"]));
        let waiter = tokio::spawn({
            let q = q.clone();
            async move { q.next(0).await }
        });
        tokio::task::yield_now().await;
        q.shut_down();
        let got = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken")
            .expect("joined");
        assert!(got.is_none());
    }
}
