//! Per-key failure records for controllers that retry on their own schedule rather than
//! through a [`super::WorkQueue`]: the PV controller and the ephemeral volume controller (keyed
//! by object), the attach/detach controller (by volume and node) and the node agent's plugin
//! manager (by socket). Which keys failed, how often in a row, and when each may be tried again.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::Backoff;

/// A key that failed: consecutive failures, when it may be tried again, and what the object
/// looked like then (a controller that passes a fingerprint retries a changed object at once).
#[derive(Debug, Clone)]
struct Failure<F> {
    attempts: u32,
    retry_at: Instant,
    fingerprint: F,
}

/// The failed keys `K`, each waiting out `backoff` (doubling per consecutive failure). `F` is
/// what a key looked like when it failed; `()` when any change should wait out the backoff too.
/// The consecutive count goes on across fingerprints, as a workqueue's rate limiter counts per
/// key whatever the object became; only a success resets it.
#[derive(Debug)]
pub struct Failures<K = String, F = ()> {
    backoff: Backoff,
    keys: Mutex<HashMap<K, Failure<F>>>,
}

impl<K: Eq + Hash + Clone, F: PartialEq> Failures<K, F> {
    pub fn new(backoff: Backoff) -> Self {
        Self {
            backoff,
            keys: Mutex::new(HashMap::new()),
        }
    }

    fn keys(&self) -> MutexGuard<'_, HashMap<K, Failure<F>>> {
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `key` failed, its backoff has not passed, and it failed with the same
    /// `fingerprint`.
    pub fn backing_off<Q>(&self, key: &Q, fingerprint: &F) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.keys()
            .get(key)
            .is_some_and(|f| f.retry_at > Instant::now() && f.fingerprint == *fingerprint)
    }

    /// Records a success: the key is forgotten.
    pub fn succeeded<Q>(&self, key: &Q)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.keys().remove(key);
    }

    /// Records a failure and returns how long the key now waits (doubling per failure in a
    /// row).
    pub fn failed<Q>(&self, key: &Q, fingerprint: F) -> Duration
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let mut keys = self.keys();
        let attempts = keys.get(key).map_or(0, |f| f.attempts).saturating_add(1);
        let delay = self.backoff.delay(attempts);
        keys.insert(
            key.to_owned(),
            Failure {
                attempts,
                retry_at: Instant::now() + delay,
                fingerprint,
            },
        );
        delay
    }

    /// Records an outcome: [`Self::succeeded`] or [`Self::failed`].
    pub fn record<Q>(&self, key: &Q, fingerprint: F, ok: bool)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if ok {
            self.succeeded(key);
        } else {
            self.failed(key, fingerprint);
        }
    }

    /// The keys whose wait is over.
    pub fn due(&self) -> Vec<K> {
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

    /// Forgets the keys `keep` says no to (their objects are gone).
    pub fn retain(&self, mut keep: impl FnMut(&K) -> bool) {
        self.keys().retain(|k, _| keep(k));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn failures(start_ms: u64) -> Failures {
        failures_of(start_ms)
    }

    fn failures_of<K: Eq + std::hash::Hash + Clone>(start_ms: u64) -> Failures<K> {
        Failures::new(Backoff {
            start: Duration::from_millis(start_ms),
            max: Duration::from_secs(60),
        })
    }

    #[test]
    fn a_failure_waits_doubling_and_success_forgets() {
        let f = failures(10_000);
        assert!(!f.backing_off("a", &()));
        let before = Instant::now();
        f.record("a", (), false);
        assert!(f.backing_off("a", &()));
        let first = f.next_retry().unwrap() - before;
        f.record("a", (), false);
        let second = f.next_retry().unwrap() - before;
        assert!(first >= Duration::from_secs(10) && first < Duration::from_secs(11));
        assert!(second >= Duration::from_secs(20) && second < Duration::from_secs(21));
        assert!(f.due().is_empty());
        f.record("a", (), true);
        assert!(!f.backing_off("a", &()));
        assert_eq!(f.next_retry(), None);
    }

    #[test]
    fn a_changed_fingerprint_is_not_held_back_but_the_count_goes_on() {
        let f: Failures<String, String> = Failures::new(Backoff {
            start: Duration::from_secs(10),
            max: Duration::from_secs(60),
        });
        assert_eq!(f.failed("a", "v1".into()), Duration::from_secs(10));
        assert!(f.backing_off("a", &"v1".to_owned()));
        assert!(!f.backing_off("a", &"v2".to_owned()));
        assert_eq!(f.failed("a", "v2".into()), Duration::from_secs(20));
    }

    #[test]
    fn keys_of_any_type_are_looked_up_by_what_they_borrow_as() {
        let f: Failures<(String, String)> = failures_of(10_000);
        let key = ("vol".to_owned(), "node".to_owned());
        f.failed(&key, ());
        assert!(f.backing_off(&key, &()));
        assert!(!f.backing_off(&("vol".to_owned(), "other".to_owned()), &()));
        f.succeeded(&key);
        assert!(!f.backing_off(&key, &()));
    }

    #[test]
    fn keys_whose_wait_is_over_are_due_and_gone_keys_are_forgotten() {
        let f = failures(0);
        f.record("a", (), false);
        f.record("b", (), false);
        let mut due = f.due();
        due.sort();
        assert_eq!(due, ["a", "b"]);
        f.retain(|k| k == "b");
        assert_eq!(f.due(), ["b"]);
    }
}
