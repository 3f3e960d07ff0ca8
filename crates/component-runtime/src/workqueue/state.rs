//! The queue's bookkeeping, behind one mutex.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::time::Instant;

use super::Lane;

#[derive(Debug, Default)]
pub(super) struct State {
    /// Ready keys per lane, in arrival order.
    pub ready: Vec<VecDeque<String>>,
    /// Keys in `ready`: their lane and when they were queued.
    pub queued: HashMap<String, (Lane, Instant)>,
    /// Keys held by a worker, with their lane and start time.
    pub processing: HashMap<String, (Lane, Instant)>,
    /// Keys added while a worker held them: the lane to queue them in afterwards.
    pub dirty: HashMap<String, Lane>,
    /// Keys kicked while a worker held them: retried at once if that worker fails for want of
    /// another object.
    pub kicked: HashSet<String>,
    /// Keys whose backoff is for want of another object (a kick ends it; nothing else does).
    pub awaiting_object: HashSet<String>,
    /// Keys waiting out a backoff, ordered by due time.
    pub waiting: BTreeSet<(Instant, u64, String)>,
    pub waiting_index: HashMap<String, (Instant, u64, Lane)>,
    /// Consecutive failures per key.
    pub failures: HashMap<String, u32>,
    /// When a worker last gave each key back (for the reconciler's "changed since" test).
    pub last_done: HashMap<String, Instant>,
    pub seq: u64,
    pub shut_down: bool,
}

pub(super) fn remove_waiting(st: &mut State, key: &str) {
    if let Some((due, seq, _)) = st.waiting_index.remove(key) {
        st.waiting.remove(&(due, seq, key.to_string()));
    }
}
