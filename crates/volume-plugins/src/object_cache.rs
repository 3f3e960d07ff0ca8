//! A watch-fed cache of one kind of Kubernetes object that also says *when* it changed: the
//! informer of client-go, reduced to what the attach/detach controller and the node agent need.
//! Lookups never hit the API server (seed 000 asks for a CSIDriver cache, not a GET per call), and
//! a waiter (an attach waiting for `status.attached`, a detach waiting for the VolumeAttachment to
//! go) sleeps on [`ObjectCache::changed`] instead of polling.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::StreamExt;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

/// One kind's cache. Cheap to clone; every clone sees the same objects.
#[derive(Clone)]
pub struct ObjectCache<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    store: Store<K>,
    generation: watch::Receiver<u64>,
    by_name: Arc<NameNotifiers>,
}

/// Who waits for which object, by name: a waiter for one VolumeAttachment among thousands is
/// woken by changes of that object only (a wake-up per change of any object would make n
/// concurrent waits cost O(n²)). Namespaced kinds share a name across namespaces: a waiter may
/// then wake for a namespace it does not care about, and just looks again.
#[derive(Default)]
struct NameNotifiers(Mutex<HashMap<String, Weak<Notify>>>);

impl NameNotifiers {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Weak<Notify>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn get(&self, name: &str) -> Arc<Notify> {
        let mut map = self.map();
        if let Some(n) = map.get(name).and_then(Weak::upgrade) {
            return n;
        }
        if map.len() >= 1024 {
            map.retain(|_, w| w.strong_count() > 0);
        }
        let n = Arc::new(Notify::new());
        map.insert(name.to_string(), Arc::downgrade(&n));
        n
    }

    fn notify(&self, name: &str) {
        let n = self.map().get(name).and_then(Weak::upgrade);
        if let Some(n) = n {
            n.notify_waiters();
        }
    }

    fn notify_all(&self) {
        let mut map = self.map();
        map.retain(|_, w| w.strong_count() > 0);
        for n in map.values().filter_map(Weak::upgrade) {
            n.notify_waiters();
        }
    }
}

impl<K> Debug for ObjectCache<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectCache")
            .field("kind", &K::kind(&()))
            .field("objects", &self.store.len())
            .finish()
    }
}

impl<K> ObjectCache<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    /// Starts watching `api` (list + watch, re-listing with backoff after an error) until
    /// `stop`. The cache is empty until the first list arrives: see [`Self::wait_until_ready`].
    pub fn spawn(api: Api<K>, config: watcher::Config, stop: CancellationToken) -> Self {
        let (store, writer) = reflector::store();
        let (tx, generation) = watch::channel(0u64);
        let by_name = Arc::new(NameNotifiers::default());
        tokio::spawn(feed(api, config, writer, tx, by_name.clone(), stop));
        Self {
            store,
            generation,
            by_name,
        }
    }

    /// Waits until the first full list is in (or `timeout` passes: returns false then).
    pub async fn wait_until_ready(&self, timeout: Duration) -> bool {
        tokio::time::timeout(timeout, self.store.wait_until_ready())
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// True once the first full list is in.
    pub fn is_ready(&self) -> bool {
        *self.generation.borrow() > 0
    }
}

impl<K> ObjectCache<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    /// A cluster-scoped object by name.
    pub fn get(&self, name: &str) -> Option<Arc<K>> {
        self.store.get(&ObjectRef::new(name))
    }

    /// A namespaced object.
    pub fn get_namespaced(&self, namespace: &str, name: &str) -> Option<Arc<K>> {
        self.store.get(&ObjectRef::new(name).within(namespace))
    }

    /// Every cached object, in no particular order.
    pub fn list(&self) -> Vec<Arc<K>> {
        self.store.state()
    }

    /// How many objects are cached.
    pub fn len(&self) -> usize {
        self.store.len()
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.store.is_empty()
    }

    /// A receiver whose `changed()` fires after every change applied to the cache (coalesced:
    /// a slow reader sees the latest generation, not each step).
    pub fn changed(&self) -> watch::Receiver<u64> {
        self.generation.clone()
    }

    /// Woken (`notify_waiters`) after each change of the object(s) named `name`, and after a
    /// re-list. Create the `notified()` future and `enable()` it before looking at the cache,
    /// so that a change in between is not missed. Hold the returned `Arc` while waiting.
    pub fn name_changed(&self, name: &str) -> Arc<Notify> {
        self.by_name.get(name)
    }

    /// A cache over a fixed set of objects that never changes: for unit tests of code that
    /// reads a cache.
    pub fn from_objects(objects: impl IntoIterator<Item = K>) -> Self {
        let (store, mut writer) = reflector::store();
        writer.apply_watcher_event(&Event::Init);
        for obj in objects {
            writer.apply_watcher_event(&Event::InitApply(obj));
        }
        writer.apply_watcher_event(&Event::InitDone);
        let (_tx, generation) = watch::channel(1u64);
        Self {
            store,
            generation,
            by_name: Arc::default(),
        }
    }
}

async fn feed<K>(
    api: Api<K>,
    config: watcher::Config,
    mut writer: reflector::store::Writer<K>,
    generation: watch::Sender<u64>,
    by_name: Arc<NameNotifiers>,
    stop: CancellationToken,
) where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let kind = K::kind(&()).to_string();
    let mut stream = watcher::watcher(api, config).default_backoff().boxed();
    let mut listed = false;
    loop {
        let event = tokio::select! {
            () = stop.cancelled() => return,
            ev = stream.next() => ev,
        };
        let event = match event {
            None => return,
            Some(Err(e)) => {
                tracing::warn!(kind = %kind, error = %e, "watch failed; re-listing with backoff");
                continue;
            }
            Some(Ok(ev)) => ev,
        };
        writer.apply_watcher_event(&event);
        // During a re-list the store swaps its contents only at InitDone: announce then, and
        // for every single change once listed.
        let announce = match &event {
            Event::Init | Event::InitApply(_) => false,
            Event::InitDone => {
                listed = true;
                true
            }
            Event::Apply(_) | Event::Delete(_) => listed,
        };
        if announce {
            generation.send_modify(|g| *g += 1);
            match &event {
                Event::Apply(obj) | Event::Delete(obj) => {
                    if let Some(name) = obj.meta().name.as_deref() {
                        by_name.notify(name);
                    }
                }
                _ => by_name.notify_all(),
            }
        }
    }
}
