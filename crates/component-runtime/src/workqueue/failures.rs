//! Per-key failure records for controllers that resync on a timer rather than through a
//! [`super::WorkQueue`] (the PV controller, the ephemeral volume controller): which keys
//! failed, how often in a row, and when each may be tried again.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use super::Backoff;

/// A key that failed: consecutive failures, when it may be tried again, and what the object
/// looked like then (a controller that passes a fingerprint retries a changed object at once).
#[derive(Debug, Clone)]
struct Failure {
    attempts: u32,
    retry_at: Instant,
    fingerprint: String,
}

/// The failed keys, each waiting out `backoff` (doubling per consecutive failure).
#[derive(Debug)]
pub struct Failures {
    backoff: Backoff,
    keys: Mutex<HashMap<String, Failure>>,
}

impl Failures {
    pub fn new(backoff: Backoff) -> Self {
        Self {
            backoff,
            keys: Mutex::new(HashMap::new()),
        }
    }

    fn keys(&self) -> MutexGuard<'_, HashMap<String, Failure>> {
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `key` failed, its backoff has not passed, and it failed with the same
    /// `fingerprint` (pass `""` when any change should wait out the backoff too).
    pub fn backing_off(&self, key: &str, fingerprint: &str) -> bool {
        self.keys()
            .get(key)
            .is_some_and(|f| f.retry_at > Instant::now() && f.fingerprint == fingerprint)
    }

    /// Records an outcome: success forgets the key, a failure doubles its wait.
    pub fn record(&self, key: &str, fingerprint: String, ok: bool) {
        let mut keys = self.keys();
        if ok {
            keys.remove(key);
            return;
        }
        let attempts = keys.get(key).map_or(0, |f| f.attempts).saturating_add(1);
        let retry_at = Instant::now() + self.backoff.delay(attempts);
        keys.insert(
            key.to_string(),
            Failure {
                attempts,
                retry_at,
                fingerprint,
            },
        );
    }

    /// The keys whose wait is over.
    pub fn due(&self) -> Vec<String> {
        let now = Instant::now();
        self.keys()
            .iter()
            .filter(|(_, f)| f.retry_at <= now)
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// The earliest time a key may be tried again.
    pub fn next_retry(&self) -> Option<Instant> {
        self.keys().values().map(|f| f.retry_at).min()
    }

    /// Forgets the keys `keep` says no (their objects are gone).
    pub fn retain(&self, mut keep: impl FnMut(&str) -> bool) {
        self.keys().retain(|k, _| keep(k));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn failures(start_ms: u64) -> Failures {
        Failures::new(Backoff {
            start: Duration::from_millis(start_ms),
            max: Duration::from_secs(60),
        })
    }

    #[test]
    fn a_failure_waits_doubling_and_success_forgets() {
        let f = failures(10_000);
        assert!(!f.backing_off("a", ""));
        let before = Instant::now();
        f.record("a", String::new(), false);
        assert!(f.backing_off("a", ""));
        let first = f.next_retry().unwrap() - before;
        f.record("a", String::new(), false);
        let second = f.next_retry().unwrap() - before;
        assert!(first >= Duration::from_secs(10) && first < Duration::from_secs(11));
        assert!(second >= Duration::from_secs(20) && second < Duration::from_secs(21));
        assert!(f.due().is_empty());
        f.record("a", String::new(), true);
        assert!(!f.backing_off("a", ""));
        assert_eq!(f.next_retry(), None);
    }

    #[test]
    fn a_changed_fingerprint_is_not_held_back() {
        let f = failures(10_000);
        f.record("a", "v1".into(), false);
        assert!(f.backing_off("a", "v1"));
        assert!(!f.backing_off("a", "v2"));
    }

    #[test]
    fn keys_whose_wait_is_over_are_due_and_gone_keys_are_forgotten() {
        let f = failures(0);
        f.record("a", String::new(), false);
        f.record("b", String::new(), false);
        let mut due = f.due();
        due.sort();
        assert_eq!(due, ["a", "b"]);
        f.retain(|k| k == "b");
        assert_eq!(f.due(), ["b"]);
    }
}
