//! The newest copy of each object we wrote ourselves, until the watch cache catches up.
//!
//! A worker reads objects from the reflector's cache, which lags behind our own writes by one
//! watch round trip. Without this, a retry or a re-queue right after a write would see the old
//! object: add a finalizer twice (409), or call ControllerPublishVolume again for a
//! VolumeAttachment whose `attached: true` is not in the cache yet. Objects answered by our
//! PATCH calls are kept here and preferred while they are newer than the cached copy.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kube::Resource;

/// resourceVersions are opaque to clients, but every server we talk to (etcd-backed
/// kube-apiserver, the embedded server) uses increasing integers. When one does not parse, the
/// cache wins.
fn rv<K: Resource>(obj: &K) -> Option<u64> {
    obj.meta().resource_version.as_deref()?.parse().ok()
}

pub(crate) struct Fresh<K> {
    objects: Mutex<HashMap<String, Arc<K>>>,
}

impl<K> Default for Fresh<K> {
    fn default() -> Self {
        Self {
            objects: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Resource> Fresh<K> {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<K>>> {
        self.objects.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Remembers an object the API server answered a write with.
    pub(crate) fn record(&self, obj: Arc<K>) {
        let Some(name) = obj.meta().name.clone() else {
            return;
        };
        let mut map = self.map();
        let newer = match (
            map.get(&name).and_then(|o| rv(o.as_ref())),
            rv(obj.as_ref()),
        ) {
            (Some(have), Some(new)) => new >= have,
            _ => true,
        };
        if newer {
            map.insert(name, obj);
        }
    }

    /// The newer of the cached object and ours; `None` when the cache has none (deleted).
    pub(crate) fn pick(&self, name: &str, cached: Option<Arc<K>>) -> Option<Arc<K>> {
        let mut map = self.map();
        let Some(cached) = cached else {
            map.remove(name);
            return None;
        };
        let Some(ours) = map.get(name).cloned() else {
            return Some(cached);
        };
        match (rv(ours.as_ref()), rv(cached.as_ref())) {
            (Some(o), Some(c)) if o > c && ours.meta().uid == cached.meta().uid => Some(ours),
            _ => {
                map.remove(name);
                Some(cached)
            }
        }
    }

    /// The watch delivered `obj`: forget our copy once the cache has caught up with it.
    pub(crate) fn observe(&self, obj: &K) {
        let Some(name) = obj.meta().name.as_deref() else {
            return;
        };
        let mut map = self.map();
        let caught_up = map
            .get(name)
            .is_some_and(|ours| rv(obj) >= rv(ours.as_ref()));
        if caught_up {
            map.remove(name);
        }
    }

    pub(crate) fn remove(&self, name: &str) {
        self.map().remove(name);
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn cm(rv: &str, uid: &str) -> Arc<ConfigMap> {
        Arc::new(ConfigMap {
            metadata: ObjectMeta {
                name: Some("x".into()),
                resource_version: Some(rv.into()),
                uid: Some(uid.into()),
                ..Default::default()
            },
            ..Default::default()
        })
    }

    fn rv_of(o: Option<Arc<ConfigMap>>) -> Option<String> {
        o.and_then(|o| o.metadata.resource_version.clone())
    }

    #[test]
    fn our_newer_write_wins_until_the_cache_catches_up() {
        let f = Fresh::<ConfigMap>::default();
        f.record(cm("12", "u"));
        assert_eq!(rv_of(f.pick("x", Some(cm("10", "u")))), Some("12".into()));
        f.observe(&cm("12", "u"));
        assert_eq!(f.len(), 0);
        assert_eq!(rv_of(f.pick("x", Some(cm("12", "u")))), Some("12".into()));
    }

    #[test]
    fn a_newer_cache_or_another_object_wins() {
        let f = Fresh::<ConfigMap>::default();
        f.record(cm("12", "u"));
        assert_eq!(rv_of(f.pick("x", Some(cm("15", "u")))), Some("15".into()));
        assert_eq!(f.len(), 0);
        f.record(cm("20", "old-uid"));
        assert_eq!(
            rv_of(f.pick("x", Some(cm("18", "new-uid")))),
            Some("18".into())
        );
    }

    #[test]
    fn a_deleted_object_stays_deleted() {
        let f = Fresh::<ConfigMap>::default();
        f.record(cm("12", "u"));
        assert!(f.pick("x", None).is_none());
        assert_eq!(f.len(), 0);
    }

    #[test]
    fn older_answers_do_not_replace_newer_ones() {
        let f = Fresh::<ConfigMap>::default();
        f.record(cm("12", "u"));
        f.record(cm("11", "u"));
        assert_eq!(rv_of(f.pick("x", Some(cm("5", "u")))), Some("12".into()));
    }
}
