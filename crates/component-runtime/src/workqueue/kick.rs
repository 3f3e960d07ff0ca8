//! Kicks: a key that failed for want of another object (a PV, a CSINode) is retried as soon as
//! that object appears, instead of waiting out its backoff.

use super::state::remove_waiting;
use super::{Lane, WorkQueue};

impl WorkQueue {
    /// Like [`add`](Self::add), but a key waiting out its backoff is queued now: what it was
    /// waiting for (a PV, a CSINode) has just appeared. Its failure count is kept.
    pub fn kick(&self, key: &str, lane: Lane) {
        {
            let mut st = self.lock();
            if st.processing.contains_key(key) {
                // The worker may be failing for want of what just appeared: no backoff after it.
                st.kicked.insert(key.to_string());
            }
            if st.shut_down
                || !st.waiting_index.contains_key(key)
                || !st.awaiting_object.contains(key)
            {
                // Not waiting, or waiting out a failure a new object does not fix: a plain add.
                drop(st);
                self.add(key, lane);
                return;
            }
            remove_waiting(&mut st, key);
            let lane = lane.min(self.lanes.len().saturating_sub(1));
            self.push_ready(&mut st, key.to_string(), lane);
        }
        self.notify.notify_waiters();
    }

    /// Could a kick matter: is any key waiting out a backoff or held by a worker (which may be
    /// about to fail)?
    pub fn has_kick_candidates(&self) -> bool {
        let st = self.lock();
        !st.waiting_index.is_empty() || !st.processing.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::super::Outcome;
    use super::super::tests::{next_now, slow_queue};

    #[tokio::test]
    async fn kick_ends_a_backoff_for_a_missing_object_but_keeps_the_failures() {
        let q = slow_queue(&["a"]);
        q.add("x", 0);
        let item = next_now(&q, 0).await.expect("x");
        q.done(&item, Outcome::Retry);
        q.kick("x", 0);
        assert!(
            q.has_backoff(),
            "a CSI error's backoff is not cut short by a kick"
        );
        q.forget("x");
        q.add("x", 0);
        let item = next_now(&q, 0).await.expect("x");
        q.done(&item, Outcome::RetryWhenAvailable);
        assert!(q.has_backoff());
        q.kick("x", 0);
        assert!(!q.has_backoff());
        let item = next_now(&q, 0).await.expect("kicked");
        assert_eq!(q.failures("x"), 1);
        q.done(&item, Outcome::Done);
        q.kick("y", 0); // not waiting: a plain add
        assert_eq!(next_now(&q, 0).await.expect("y").key, "y");
    }

    #[tokio::test]
    async fn a_kick_while_the_worker_fails_skips_the_backoff() {
        let q = slow_queue(&["a"]);
        q.add("x", 0);
        let item = next_now(&q, 0).await.expect("x");
        q.kick("x", 0); // e.g. the PV appears while the worker records "not found"
        q.done(&item, Outcome::RetryWhenAvailable);
        assert!(next_now(&q, 0).await.is_some(), "retried at once");
        assert_eq!(q.failures("x"), 1);
    }

    #[tokio::test]
    async fn a_kick_while_the_worker_fails_otherwise_keeps_the_backoff() {
        // The PV showed up in the watch while the worker, which had read it afresh, failed in
        // ControllerPublish: that failure waits out its backoff.
        let q = slow_queue(&["a"]);
        q.add("x", 0);
        let item = next_now(&q, 0).await.expect("x");
        q.kick("x", 0);
        q.done(&item, Outcome::Retry);
        assert!(q.has_backoff());
        assert_eq!(q.snapshot()[0].depth, 0);
    }
}
