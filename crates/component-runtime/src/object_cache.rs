//! A watch-fed cache of one kind of Kubernetes object that also says *when* it changed: the
//! informer of client-go, reduced to what the attach/detach controller and the node agent need.
//! Lookups never hit the API server (the skip-attach design,
//! docs/design/skip-attach.md, asks for a CSIDriver cache, not a GET per call), and
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

/// What a watch-fed cache can hold: a cluster- or namespace-scoped API kind (static type
/// information), decodable, and shareable across the watch task and its readers.
pub trait CachedKind:
    Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
}

impl<K> CachedKind for K where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
}

/// One kind's cache. Cheap to clone; every clone sees the same objects.
#[derive(Clone)]
pub struct ObjectCache<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    store: Store<K>,
    generation: watch::Receiver<u64>,
    by_name: Arc<NameNotifiers>,
    /// Scoped caches ([`ObjectCache::spawn_scoped`]) only: the objects asked for.
    interest: Option<Arc<Interest>>,
    /// Told of each change of a watch-fed cache ([`ObjectCache::subscribe`]).
    subscribers: Arc<Subscribers<K>>,
}

/// A change a subscriber ([`ObjectCache::subscribe`]) is told of, after the cache applied it.
#[derive(Debug)]
pub enum Change<'a, K> {
    /// Added or modified: the new copy.
    Applied(&'a K),
    /// Deleted: its last copy.
    Deleted(&'a K),
    /// A re-list replaced the whole cache (after a watch error): anything may have changed.
    Relisted,
}

// Not derived: that would ask K to be Clone/Copy, and only references are copied.
impl<K> Clone for Change<'_, K> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K> Copy for Change<'_, K> {}

type Callback<K> = Box<dyn FnMut(Change<'_, K>) + Send>;

/// The next id, and each subscriber with the id it was given.
type SubscriberList<K> = (u64, Vec<(u64, Callback<K>)>);

/// The subscribers of one cache.
struct Subscribers<K>(Mutex<SubscriberList<K>>);

impl<K> Default for Subscribers<K> {
    fn default() -> Self {
        Self(Mutex::new((0, Vec::new())))
    }
}

impl<K> Subscribers<K> {
    fn lock(&self) -> std::sync::MutexGuard<'_, SubscriberList<K>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn tell(&self, change: Change<'_, K>) {
        let mut subs = self.lock();
        for (_, callback) in &mut subs.1 {
            callback(change);
        }
    }
}

/// Unsubscribes when dropped.
#[must_use = "dropping the subscription unsubscribes"]
pub struct Subscription(Option<Box<dyn FnOnce() + Send + Sync>>);

impl Drop for Subscription {
    fn drop(&mut self) {
        if let Some(cancel) = self.0.take() {
            cancel();
        }
    }
}

impl Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Subscription")
    }
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

    /// Whether someone holds a waiter for `name` now.
    fn is_waited(&self, name: &str) -> bool {
        self.map().get(name).is_some_and(|w| w.strong_count() > 0)
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
    K: CachedKind,
{
    /// Starts watching `api` (list + watch, re-listing with backoff after an error) until
    /// `stop`. The cache is empty until the first list arrives: see [`Self::wait_until_ready`].
    pub fn spawn(api: Api<K>, config: watcher::Config, stop: CancellationToken) -> Self {
        Self::spawn_on(&tokio::runtime::Handle::current(), api, config, stop)
    }

    /// [`Self::spawn`], with the watch running on `runtime` (a cache shared by components
    /// on other runtimes, [`crate::SharedCaches`]).
    pub fn spawn_on(
        runtime: &tokio::runtime::Handle,
        api: Api<K>,
        config: watcher::Config,
        stop: CancellationToken,
    ) -> Self {
        let (store, writer) = reflector::store();
        let (tx, generation) = watch::channel(0u64);
        let by_name = Arc::new(NameNotifiers::default());
        let subscribers = Arc::new(Subscribers::default());
        let told = Told {
            by_name: by_name.clone(),
            subscribers: subscribers.clone(),
        };
        runtime.spawn(feed(api, config, writer, tx, told, stop));
        Self {
            store,
            generation,
            by_name,
            interest: None,
            subscribers,
        }
    }

    /// A cache of only the objects its readers ask for, fetched with GETs, as the kubelet reads
    /// the claims, volumes and attachments of its own pods: what the Node authorizer lets a
    /// node read, and memory that follows the node's pods rather than the cluster.
    ///
    /// A lookup ([`Self::get`], [`Self::get_namespaced`]) that misses registers the object and
    /// wakes the fetcher; [`Self::changed`] fires once it is in (or known to be absent). Every
    /// object asked for is fetched again on a backoff: `policy.fast` after it changed, doubling
    /// up to `policy.slow` while it stays the same, and every `policy.fast` while someone waits
    /// on it ([`Self::name_changed`]). An object nobody asked for in `policy.idle` is dropped.
    /// `api` gives the `Api` for a namespace (`None`: cluster-scoped).
    pub fn spawn_scoped<F>(api: F, policy: ScopedPolicy, stop: CancellationToken) -> Self
    where
        F: Fn(Option<&str>) -> Api<K> + Send + Sync + 'static,
    {
        let (store, mut writer) = reflector::store();
        writer.apply_watcher_event(&Event::Init);
        writer.apply_watcher_event(&Event::InitDone);
        let (tx, generation) = watch::channel(1u64);
        let by_name = Arc::new(NameNotifiers::default());
        let interest = Arc::new(Interest::default());
        tokio::spawn(fetch(
            api,
            policy,
            store.clone(),
            writer,
            tx,
            by_name.clone(),
            interest.clone(),
            stop,
        ));
        Self {
            store,
            generation,
            by_name,
            interest: Some(interest),
            subscribers: Arc::default(),
        }
    }

    /// Waits until the first full list is in (or `timeout` passes: returns false then).
    pub async fn wait_until_ready(&self, timeout: Duration) -> bool {
        // Not the store's own wait: it wakes only the last of several concurrent waiters (one
        // oneshot receiver underneath), and a shared cache has one per component.
        let mut generation = self.generation.clone();
        tokio::time::timeout(timeout, generation.wait_for(|g| *g > 0))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// True once the first full list is in.
    pub fn is_ready(&self) -> bool {
        *self.generation.borrow() > 0
    }

    /// This cache's first-list flag with its kind's name, to wait for caches of several kinds
    /// together ([`wait_all_ready`]).
    pub fn readiness(&self) -> Readiness {
        Readiness {
            kind: K::kind(&()).into_owned(),
            generation: self.generation.clone(),
        }
    }
}

/// Whether one cache has had its first full list ([`ObjectCache::readiness`]).
#[derive(Clone, Debug)]
pub struct Readiness {
    kind: String,
    generation: watch::Receiver<u64>,
}

impl Readiness {
    /// The kind of the cache.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// Waits, without a deadline, until the cache has its first full list: true then, false
    /// when its watch stopped first.
    pub async fn wait(mut self) -> bool {
        self.generation.wait_for(|g| *g > 0).await.is_ok()
    }
}

/// A cache that did not fill in time. A component cannot work from an empty cache (it would
/// take every object for deleted), so it stops with this instead.
#[derive(Debug, thiserror::Error)]
#[error(
    "the {kind} cache did not fill within {waited:?} (can this component list and watch {kind}?)"
)]
pub struct CacheNotReady {
    /// The kind whose first list did not arrive.
    pub kind: String,
    /// How long it was waited for.
    pub waited: Duration,
}

/// Waits until every cache in `caches` has its first full list, all under one `timeout`
/// (Kubernetes' `WaitForCacheSync` over a controller's informers). Names the first cache, in
/// the order given, that did not fill.
pub async fn wait_all_ready(
    caches: impl IntoIterator<Item = Readiness>,
    timeout: Duration,
) -> Result<(), CacheNotReady> {
    let deadline = tokio::time::Instant::now() + timeout;
    for mut cache in caches {
        let filled = tokio::time::timeout_at(deadline, cache.generation.wait_for(|g| *g > 0))
            .await
            .is_ok_and(|r| r.is_ok());
        if !filled {
            return Err(CacheNotReady {
                kind: cache.kind,
                waited: timeout,
            });
        }
    }
    Ok(())
}

impl<K> ObjectCache<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    /// A cluster-scoped object by name.
    pub fn get(&self, name: &str) -> Option<Arc<K>> {
        if let Some(i) = &self.interest {
            i.want(None, name);
        }
        self.store.get(&ObjectRef::new(name))
    }

    /// A namespaced object.
    pub fn get_namespaced(&self, namespace: &str, name: &str) -> Option<Arc<K>> {
        if let Some(i) = &self.interest {
            i.want(Some(namespace), name);
        }
        self.store.get(&ObjectRef::new(name).within(namespace))
    }

    /// A scoped cache: the reader waits for this object to change (a claim to be bound, a
    /// volume to appear), so it is fetched every `policy.fast` for a while instead of backing
    /// off. A no-op on a watch-fed cache, which sees every change anyway.
    pub fn hot(&self, namespace: Option<&str>, name: &str) {
        if let Some(i) = &self.interest {
            i.want(namespace, name);
            let mut map = i.map();
            let woke = map
                .get_mut(&(namespace.map(str::to_string), name.to_string()))
                .is_some_and(|k| !std::mem::replace(&mut k.hot, true));
            drop(map);
            if woke {
                i.wake.notify_one();
            }
        }
    }

    /// A scoped cache: fetches the object now and returns once the cache holds what the API
    /// server has (or after `timeout`), for a decision that must not rest on a copy up to
    /// `policy.slow` old: mounting on a VolumeAttachment that may be being deleted. A no-op on
    /// a watch-fed cache.
    pub async fn refresh(&self, namespace: Option<&str>, name: &str, timeout: Duration) {
        let Some(i) = &self.interest else {
            return;
        };
        let mut rounds = i.rounds.subscribe();
        i.want(namespace, name);
        if let Some(k) = i
            .map()
            .get_mut(&(namespace.map(str::to_string), name.to_string()))
        {
            k.next = None;
        }
        // Marked due: the next round to start takes it. One already running may not have
        // (it chose what is due when it began), so wait for a round that starts after now.
        let (started, _) = *rounds.borrow_and_update();
        let want = started + 1;
        i.wake.notify_one();
        let _ = tokio::time::timeout(timeout, async {
            while rounds.borrow_and_update().1 < want {
                if rounds.changed().await.is_err() {
                    return;
                }
            }
        })
        .await;
    }

    /// The object as read from the API server at or after `since` (`Some(None)`: known absent
    /// then), or `None` when the cache has not read it since: it is then fetched at once, and
    /// [`Self::changed`] fires when it is in, changed or not. The kubelet reads a new pod's
    /// claim and volume from the API server, not from a cache; this is that read, shared with
    /// the cache (a claim deleted and recreated under the same name must not hand a new pod
    /// the old claim's volume from a copy seconds old). A watch-fed cache is always current.
    pub fn fresh_since(
        &self,
        namespace: Option<&str>,
        name: &str,
        since: std::time::Instant,
    ) -> Option<Option<Arc<K>>> {
        let r = object_ref(namespace, name);
        let Some(i) = &self.interest else {
            return Some(self.store.get(&r));
        };
        i.want(namespace, name);
        let key = (namespace.map(str::to_string), name.to_string());
        let mut map = i.map();
        let k = map.get_mut(&key)?;
        if k.fetched.is_some_and(|at| at >= since) {
            drop(map);
            return Some(self.store.get(&r));
        }
        // Due now; the fetcher reports it even if it did not change.
        k.fresh_wanted = true;
        k.next = None;
        drop(map);
        i.wake.notify_one();
        None
    }

    /// How many objects a scoped cache is asked about (0 for a watch-fed one).
    pub fn interest_len(&self) -> usize {
        self.interest.as_ref().map_or(0, |i| i.map().len())
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

    /// The reflector store underneath (a cheap clone that sees the same objects), for code
    /// written against kube-runtime's `Store`.
    pub fn store(&self) -> Store<K> {
        self.store.clone()
    }

    /// How many subscribers ([`Self::subscribe`]) the cache has now.
    pub fn subscribers(&self) -> usize {
        self.subscribers.lock().1.len()
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
        let n = self.by_name.get(name);
        if let Some(i) = &self.interest {
            // A scoped cache looks at what is waited on every `fast`: from now on.
            i.wake.notify_one();
        }
        n
    }

    /// Calls `on_change` after each change the watch applies, from the watch's task, until the
    /// returned guard is dropped: a controller learns *which* objects changed (client-go's
    /// event handlers) and syncs only those. It runs while the cache is locked for the next
    /// change, so it must only note what changed. Changes before the first full list are not
    /// told (read the cache once it is ready). A scoped cache tells nobody.
    pub fn subscribe(&self, on_change: impl FnMut(Change<'_, K>) + Send + 'static) -> Subscription {
        let mut subs = self.subscribers.lock();
        let id = subs.0;
        subs.0 += 1;
        subs.1.push((id, Box::new(on_change)));
        let weak = Arc::downgrade(&self.subscribers);
        Subscription(Some(Box::new(move || {
            if let Some(subs) = weak.upgrade() {
                subs.lock().1.retain(|(i, _)| *i != id);
            }
        })))
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
            interest: None,
            subscribers: Arc::default(),
        }
    }
}

/// The events of a watch on `api` until `stop`: the watcher re-lists with backoff after an
/// error, which is logged and not passed on.
pub fn watch_events<K: CachedKind>(
    api: Api<K>,
    config: watcher::Config,
    stop: CancellationToken,
) -> impl futures::Stream<Item = Event<K>> + Send {
    let kind = K::kind(&()).to_string();
    watcher::watcher(api, config)
        .default_backoff()
        .take_until(stop.cancelled_owned())
        .filter_map(move |event| {
            std::future::ready(match event {
                Ok(event) => Some(event),
                Err(e) => {
                    tracing::warn!(kind = %kind, error = %e, "watch failed; re-listing with backoff");
                    None
                }
            })
        })
}

/// Who a watch-fed cache tells of its changes.
struct Told<K> {
    by_name: Arc<NameNotifiers>,
    subscribers: Arc<Subscribers<K>>,
}

async fn feed<K>(
    api: Api<K>,
    config: watcher::Config,
    mut writer: reflector::store::Writer<K>,
    generation: watch::Sender<u64>,
    told: Told<K>,
    stop: CancellationToken,
) where
    K: CachedKind,
{
    let mut events = std::pin::pin!(watch_events(api, config, stop));
    let mut listed = false;
    while let Some(event) = events.next().await {
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
            // Subscribers first: a controller woken by the generation finds its changes noted.
            match &event {
                Event::Apply(obj) => told.subscribers.tell(Change::Applied(obj)),
                Event::Delete(obj) => told.subscribers.tell(Change::Deleted(obj)),
                _ => told.subscribers.tell(Change::Relisted),
            }
            generation.send_modify(|g| *g += 1);
            match &event {
                Event::Apply(obj) | Event::Delete(obj) => {
                    if let Some(name) = obj.meta().name.as_deref() {
                        told.by_name.notify(name);
                    }
                }
                _ => told.by_name.notify_all(),
            }
        }
    }
}

/// How a scoped cache ([`ObjectCache::spawn_scoped`]) refreshes what it holds.
#[derive(Debug, Clone, Copy)]
pub struct ScopedPolicy {
    /// Between fetches of an object that just changed or that someone waits on.
    pub fast: Duration,
    /// The longest time between fetches of an object that stays the same.
    pub slow: Duration,
    /// An object nobody asked for this long is dropped.
    pub idle: Duration,
    /// GETs in flight at once.
    pub parallel: usize,
}

impl Default for ScopedPolicy {
    fn default() -> Self {
        Self {
            fast: Duration::from_millis(100),
            slow: Duration::from_secs(5),
            idle: Duration::from_secs(60),
            parallel: 16,
        }
    }
}

type Key = (Option<String>, String);

/// The store's reference of `name` in `namespace` (`None`: cluster-scoped).
fn object_ref<K>(namespace: Option<&str>, name: &str) -> ObjectRef<K>
where
    K: Resource<DynamicType = ()>,
{
    match namespace {
        Some(ns) => ObjectRef::new(name).within(ns),
        None => ObjectRef::new(name),
    }
}

/// The objects a scoped cache is asked about, and when to fetch each again.
struct Interest {
    keys: Mutex<HashMap<Key, KeyState>>,
    wake: Notify,
    /// Fetch rounds (started, finished), for [`ObjectCache::refresh`] to wait for one that
    /// began after its request.
    rounds: watch::Sender<(u64, u64)>,
}

impl Default for Interest {
    fn default() -> Self {
        Self {
            keys: Mutex::default(),
            wake: Notify::new(),
            rounds: watch::channel((0, 0)).0,
        }
    }
}

struct KeyState {
    wanted: std::time::Instant,
    /// `None`: never fetched (fetch now).
    next: Option<std::time::Instant>,
    interval: Duration,
    /// Marked [`ObjectCache::hot`] since the last fetch.
    hot: bool,
    /// When the round of the last successful fetch began (its GET was sent after that).
    fetched: Option<std::time::Instant>,
    /// A reader waits for a fetch ([`ObjectCache::fresh_since`]): report it even unchanged.
    fresh_wanted: bool,
}

impl Interest {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<Key, KeyState>> {
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn want(&self, namespace: Option<&str>, name: &str) {
        let now = std::time::Instant::now();
        let key = (namespace.map(str::to_string), name.to_string());
        let new = {
            let mut map = self.map();
            match map.get_mut(&key) {
                Some(k) => {
                    k.wanted = now;
                    false
                }
                None => {
                    map.insert(
                        key,
                        KeyState {
                            wanted: now,
                            next: None,
                            interval: Duration::ZERO,
                            hot: false,
                            fetched: None,
                            fresh_wanted: false,
                        },
                    );
                    true
                }
            }
        };
        if new {
            self.wake.notify_one();
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn fetch<K, F>(
    api: F,
    policy: ScopedPolicy,
    store: Store<K>,
    mut writer: reflector::store::Writer<K>,
    generation: watch::Sender<u64>,
    by_name: Arc<NameNotifiers>,
    interest: Arc<Interest>,
    stop: CancellationToken,
) where
    K: CachedKind,
    F: Fn(Option<&str>) -> Api<K> + Send + Sync + 'static,
{
    let kind = K::kind(&()).to_string();
    loop {
        let now = std::time::Instant::now();
        let round_start = now;
        // What is due, what nobody wants any more, and when to look next.
        let (due, dropped) = {
            let mut map = interest.map();
            let mut dropped = Vec::new();
            map.retain(|key, k| {
                let keep = now.duration_since(k.wanted) < policy.idle;
                if !keep {
                    dropped.push(key.clone());
                }
                keep
            });
            let mut due = Vec::new();
            for (key, k) in map.iter_mut() {
                // Someone waits on it: look often.
                if k.next.is_some() && (k.hot || by_name.is_waited(&key.1)) {
                    k.interval = k.interval.min(policy.fast);
                    k.next = k.next.map(|n| n.min(now + policy.fast));
                }
                if k.next.is_none_or(|at| at <= now) {
                    due.push(key.clone());
                }
            }
            (due, dropped)
        };
        interest.rounds.send_modify(|r| r.0 += 1);
        let mut changed = Vec::new();
        for (ns, name) in dropped {
            let r = object_ref(ns.as_deref(), &name);
            if let Some(obj) = store.get(&r) {
                writer.apply_watcher_event(&Event::Delete((*obj).clone()));
                changed.push(name);
            }
        }
        let fetched: Vec<(Key, Result<Option<K>, kube::Error>)> =
            futures::stream::iter(due.into_iter().map(|key| {
                let api = api(key.0.as_deref());
                async move {
                    let got = api.get_opt(&key.1).await;
                    (key, got)
                }
            }))
            .buffer_unordered(policy.parallel.max(1))
            .collect()
            .await;
        let now = std::time::Instant::now();
        for (key, got) in fetched {
            let r = object_ref(key.0.as_deref(), &key.1);
            let had = store.get(&r);
            // Refused: not ours to read any more (the Node authorizer, once the node's last
            // pod using it is gone). Forget it, as if nobody had asked.
            if let Err(kube::Error::Api(e)) = &got
                && e.code == 403
            {
                tracing::debug!(kind = %kind, name = %key.1, "no longer readable (403): dropped from the cache");
                interest.map().remove(&key);
                if let Some(old) = &had {
                    writer.apply_watcher_event(&Event::Delete(K::clone(old)));
                    changed.push(key.1);
                }
                continue;
            }
            let ok = got.is_ok();
            let differs = match (&got, &had) {
                (Ok(Some(new)), Some(old)) => {
                    new.meta().resource_version != old.meta().resource_version
                        || new.meta().uid != old.meta().uid
                }
                (Ok(Some(_)), None) | (Ok(None), Some(_)) => true,
                (Ok(None), None) | (Err(_), _) => false,
            };
            match got {
                Ok(Some(obj)) if differs => writer.apply_watcher_event(&Event::Apply(obj)),
                Ok(None) if differs => {
                    if let Some(old) = &had {
                        writer.apply_watcher_event(&Event::Delete(K::clone(old)));
                    }
                }
                Err(e) => {
                    tracing::debug!(kind = %kind, name = %key.1, error = %e, "fetch failed; trying again")
                }
                _ => {}
            }
            let mut map = interest.map();
            let mut report = differs;
            if let Some(k) = map.get_mut(&key) {
                if ok {
                    k.fetched = Some(round_start);
                    report |= std::mem::take(&mut k.fresh_wanted);
                }
                let first = k.next.is_none();
                let hot = std::mem::take(&mut k.hot);
                k.interval = if differs || first || hot {
                    policy.fast
                } else {
                    (k.interval * 2).clamp(policy.fast, policy.slow)
                };
                k.next = Some(now + k.interval);
            }
            drop(map);
            if report {
                changed.push(key.1);
            }
        }
        if !changed.is_empty() {
            generation.send_modify(|g| *g += 1);
            for name in &changed {
                by_name.notify(name);
            }
        }
        interest.rounds.send_modify(|r| r.1 += 1);
        // The earliest next fetch, the ones just made included; a waited-on or hot object
        // is looked at again within `fast`.
        let next = {
            let now = std::time::Instant::now();
            let map = interest.map();
            map.iter()
                .filter_map(|(key, k)| {
                    let at = k.next?;
                    Some(if k.hot || by_name.is_waited(&key.1) {
                        at.min(now + policy.fast)
                    } else {
                        at
                    })
                })
                .min()
                .unwrap_or(now + policy.slow)
                .min(now + policy.slow)
        };
        tokio::select! {
            () = stop.cancelled() => return,
            () = interest.wake.notified() => {}
            () = tokio::time::sleep_until(next.into()) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};

    /// A cache fed by a watch that never lists: nothing listens on port 1.
    fn never_filled(stop: &CancellationToken) -> ObjectCache<PersistentVolumeClaim> {
        crate::install_crypto_provider();
        let config = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        ObjectCache::spawn(Api::all(client), watcher::Config::default(), stop.clone())
    }

    #[tokio::test]
    async fn waiting_for_all_caches_names_the_one_that_did_not_fill() {
        let stop = CancellationToken::new();
        let pods = ObjectCache::<Pod>::from_objects([]);
        let claims = never_filled(&stop);
        wait_all_ready([pods.readiness()], Duration::from_millis(10))
            .await
            .expect("a cache built from objects is filled");

        let e = wait_all_ready(
            [pods.readiness(), claims.readiness(), pods.readiness()],
            Duration::from_millis(200),
        )
        .await
        .expect_err("the claims never came");
        assert_eq!(e.kind, "PersistentVolumeClaim");
        assert_eq!(e.waited, Duration::from_millis(200));
        assert!(
            e.to_string()
                .contains("list and watch PersistentVolumeClaim"),
            "{e}"
        );
        stop.cancel();
    }
}
