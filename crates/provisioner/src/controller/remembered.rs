//! A bounded set of names or UIDs the controller remembers between watch events, so that its
//! own writes coming back through a watch do not repeat a call. Forgetting is always safe (the
//! calls it saves are idempotent), so past [`Remembered::LIMIT`] entries it starts over instead
//! of growing without bound.

use std::collections::HashSet;
use std::sync::{Mutex, MutexGuard};

#[derive(Debug, Default)]
pub(crate) struct Remembered(Mutex<HashSet<String>>);

impl Remembered {
    /// Far above what is in flight at once; reached only if watch events stop arriving.
    const LIMIT: usize = 10_000;

    fn set(&self) -> MutexGuard<'_, HashSet<String>> {
        // Plain set operations only: a panicking holder leaves it usable.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn contains(&self, key: &str) -> bool {
        self.set().contains(key)
    }

    pub(crate) fn insert(&self, key: &str) {
        let mut set = self.set();
        if set.len() >= Self::LIMIT {
            set.clear();
        }
        set.insert(key.to_string());
    }

    pub(crate) fn remove(&self, key: &str) {
        self.set().remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_forgets_and_starts_over_at_the_limit() {
        let r = Remembered::default();
        r.insert("a");
        assert!(r.contains("a") && !r.contains("b"));
        r.remove("a");
        assert!(!r.contains("a"));
        for i in 0..Remembered::LIMIT {
            r.insert(&i.to_string());
        }
        assert!(r.contains("0"));
        r.insert("next");
        assert!(r.contains("next") && !r.contains("0"), "full: starts over");
    }
}
