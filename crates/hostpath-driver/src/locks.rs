//! One operation per volume (or per CreateVolume name) at a time: a second call for the same
//! key waits for the first to finish and then finds its work done, which is what makes
//! retries and concurrent duplicates idempotent. Calls for other keys never wait on it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::OwnedMutexGuard;

#[derive(Debug, Default)]
pub(crate) struct Locks {
    map: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl Locks {
    /// Waits until no other holder of `key` remains and returns the guard.
    pub(crate) async fn lock(&self, key: &str) -> OwnedMutexGuard<()> {
        let mutex = {
            let mut map = lock(&self.map);
            // Entries nobody holds or waits for go, so the map does not grow with every
            // volume ever seen.
            map.retain(|_, m| Arc::strong_count(m) > 1);
            Arc::clone(map.entry(key.to_string()).or_default())
        };
        mutex.lock_owned().await
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        lock(&self.map).len()
    }
}

/// The map is only inserted into and pruned, never left half-updated by a panic: recovering
/// from poisoning is safe.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn same_key_waits_other_keys_do_not() {
        let locks = Arc::new(Locks::default());
        let held = locks.lock("v1").await;
        // Another key is free at once.
        let other = tokio::time::timeout(Duration::from_secs(5), locks.lock("v2"))
            .await
            .unwrap();
        drop(other);
        // The same key waits until the holder lets go.
        let l = Arc::clone(&locks);
        let waiter = tokio::spawn(async move {
            let _g = l.lock("v1").await;
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "second holder got the lock early");
        drop(held);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap();
        // Unheld entries are pruned on the next lock.
        let _g = locks.lock("v3").await;
        assert_eq!(locks.len(), 1);
    }
}
