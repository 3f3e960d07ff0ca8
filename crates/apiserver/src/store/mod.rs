//! The object store: every object as JSON text ([`Stored`]), one global resourceVersion counter
//! (etcd's revision),
//! a bounded log of recent events for watch resume and consistent paging, and the fan-out to
//! watchers.
//!
//! Every write happens under one mutex, so the resourceVersion order, the log order and the order
//! each watcher receives events in are the same. Fan-out uses `try_send` into a bounded channel
//! per watcher: a watcher that falls behind is dropped (its stream ends), never waited for, as the
//! real server closes a watch whose buffer overflows.

mod persist;
mod stored;

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::Value;
use tokio::sync::mpsc;

use crate::http_util::meta_mut;
use crate::resources::{RESOURCES, ResourceId};
use crate::selectors::Selectors;
use crate::status::{ApiError, ApiResult};

pub(crate) use persist::Persister;
pub(crate) use stored::{Key, Stored, key_of};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One committed change. `old` is the object before it (for MODIFIED and DELETED), which lets a
/// filtered watch turn a label change into ADDED/DELETED and lets a list roll back to a version.
#[derive(Debug)]
pub(crate) struct Event {
    pub rv: u64,
    pub res: ResourceId,
    pub kind: EventType,
    pub object: Arc<Stored>,
    pub old: Option<Arc<Stored>>,
}

/// What a watcher wants to see.
#[derive(Debug, Clone)]
pub(crate) struct WatchFilter {
    pub res: ResourceId,
    pub namespace: Option<String>,
    pub selectors: Selectors,
}

impl WatchFilter {
    fn in_scope(&self, obj: &Stored) -> bool {
        self.namespace
            .as_deref()
            .is_none_or(|ns| obj.namespace() == ns)
    }

    /// Whether `obj` is in the selection, decided from its namespace and name alone when the
    /// selectors ask nothing more (`None`: the object must be looked at).
    fn by_key(&self, obj: &Stored) -> Option<bool> {
        if !self.in_scope(obj) {
            return Some(false);
        }
        self.selectors.by_key(obj.namespace(), obj.name())
    }

    /// Whether `obj` is in the selection; `value` is its parsed form, asked for only when a
    /// selector looks past its name and namespace (a watch of one object by `metadata.name`
    /// parses nothing).
    fn selects<'v>(&self, obj: &Stored, value: impl FnOnce() -> &'v Value) -> bool {
        self.by_key(obj)
            .unwrap_or_else(|| self.selectors.matches(value()))
    }

    /// Whether `obj` is in the selection.
    pub fn matches(&self, obj: &Stored) -> bool {
        let mut parsed = None;
        self.selects(obj, || parsed.insert(obj.value()))
    }

    /// Whether the event concerns this watcher at all (it matched before or matches after).
    pub fn wants(&self, ev: &Event) -> bool {
        self.wants_parsed(ev, None, &mut None)
    }

    /// [`Self::wants`], with the new object's `Value` when at hand (at commit time) and the
    /// old one parsed into `old_value` at most once (shared by all watchers of a commit).
    fn wants_parsed(&self, ev: &Event, new: Option<&Value>, old_value: &mut Option<Value>) -> bool {
        if ev.res != self.res {
            return false;
        }
        let mut new_parsed = None;
        let new_selected = self.selects(&ev.object, || match new {
            Some(v) => v,
            None => new_parsed.insert(ev.object.value()),
        });
        new_selected
            || ev.old.as_deref().is_some_and(|old| {
                self.selects(old, || old_value.get_or_insert_with(|| old.value()))
            })
    }
}

/// Where a watch starts.
#[derive(Debug, Clone, Copy)]
pub(crate) enum WatchStart {
    /// Synthetic ADDED events for the current objects, then changes.
    Snapshot,
    /// Changes after this resourceVersion (from the log).
    After(u64),
}

/// A registered watch: what to send first, then the live channel.
#[derive(Debug)]
pub(crate) struct Subscription {
    pub backlog: Vec<Arc<Event>>,
    pub rx: mpsc::Receiver<Arc<Event>>,
    /// The resourceVersion at registration: everything up to it is in `backlog`.
    pub rv: u64,
}

/// What a write closure decides.
#[derive(Debug)]
pub(crate) enum Mutation {
    /// Store this object (created or updated).
    Put(Value),
    /// Store this object, then remove it (the last finalizer went away in an update).
    PutThenDelete(Value),
    /// Remove the object; the value is its final state for the DELETED event.
    Delete(Value),
    /// Nothing changes; answer with the current object.
    Unchanged,
}

/// The result of a committed write.
#[derive(Debug)]
pub(crate) struct Committed {
    /// The object as written (its final state for a delete), for the answer.
    pub object: Value,
    pub kind: Option<EventType>,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct StoreConfig {
    /// How many events the log keeps for watch resume; older versions answer 410 Gone.
    pub window: usize,
    /// Events buffered per watcher before a slow watcher is closed.
    pub watcher_buffer: usize,
}

struct Slot {
    filter: WatchFilter,
    tx: mpsc::Sender<Arc<Event>>,
}

struct State {
    rv: u64,
    /// The newest resourceVersion no longer in the log (0: nothing evicted yet).
    compacted: u64,
    objects: Vec<BTreeMap<Key, Arc<Stored>>>,
    log: VecDeque<Arc<Event>>,
    watchers: Vec<Slot>,
}

pub(crate) struct Store {
    state: Mutex<State>,
    config: StoreConfig,
    persist: Option<Persister>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Store {
    pub fn new(config: StoreConfig) -> Self {
        Self {
            state: Mutex::new(State {
                rv: 1,
                compacted: 0,
                objects: RESOURCES.iter().map(|_| BTreeMap::new()).collect(),
                log: VecDeque::new(),
                watchers: Vec::new(),
            }),
            config,
            persist: None,
        }
    }

    /// A store that loads from and appends to `dir`.
    pub fn open(config: StoreConfig, dir: &Path) -> Result<Self, crate::Error> {
        let (persister, loaded) = Persister::open(dir)?;
        let mut store = Self::new(config);
        {
            let st = store.state.get_mut().unwrap_or_else(|e| e.into_inner());
            st.rv = st.rv.max(loaded.rv);
            for (res, obj) in loaded.objects {
                st.objects[res].insert(key_of(&obj), Arc::new(Stored::new(&obj)));
            }
            // Versions before the restart are not in the log: a watch from one must re-list.
            st.compacted = st.rv;
        }
        store.persist = Some(persister);
        Ok(store)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave half a write: commits are assembled
        // first and applied with infallible operations, so the data is still consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn current_rv(&self) -> u64 {
        self.lock().rv
    }

    pub fn get(&self, res: ResourceId, key: &Key) -> Option<Arc<Stored>> {
        self.lock().objects[res].get(key).cloned()
    }

    /// The objects of `res` (in `ns` if given, with keys after `after` if given), ordered by
    /// key, as of `at` (now when `None`), together with the resourceVersion of the list.
    pub fn list(
        &self,
        res: ResourceId,
        ns: Option<&str>,
        at: Option<u64>,
        after: Option<&Key>,
    ) -> Result<(u64, Vec<Arc<Stored>>), u64> {
        use std::ops::Bound;
        let st = self.lock();
        let in_ns = |k: &Key| ns.is_none_or(|n| k.0 == n);
        let after_start = |k: &Key| after.is_none_or(|a| k > a);
        // Pages start after the last key of the previous page: seek there instead of scanning.
        let lower = match after {
            Some(a) => Bound::Excluded(a.clone()),
            None => Bound::Unbounded,
        };
        let at = match at {
            Some(at) if at < st.rv => at,
            _ => {
                let items = st.objects[res]
                    .range((lower, Bound::Unbounded))
                    .filter(|(k, _)| in_ns(k))
                    .map(|(_, v)| v.clone())
                    .collect();
                return Ok((st.rv, items));
            }
        };
        if at < st.compacted {
            return Err(st.compacted);
        }
        // Roll the current objects back through the log to the state at `at`.
        let mut map: BTreeMap<Key, Arc<Stored>> = st.objects[res]
            .iter()
            .filter(|(k, _)| in_ns(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for ev in st.log.iter().rev().take_while(|e| e.rv > at) {
            if ev.res != res {
                continue;
            }
            let key = ev.object.key();
            if !in_ns(key) {
                continue;
            }
            match (ev.kind, &ev.old) {
                (EventType::Added, _) => {
                    map.remove(key);
                }
                (_, Some(old)) => {
                    map.insert(key.clone(), old.clone());
                }
                (_, None) => {}
            }
        }
        let items = map
            .into_iter()
            .filter(|(k, _)| after_start(k))
            .map(|(_, v)| v)
            .collect();
        Ok((at, items))
    }

    /// Applies one write to the object at `key` atomically: `f` sees the current object (parsed
    /// from the store's text) and decides. With `dry_run` nothing is stored.
    pub fn mutate<F>(&self, res: ResourceId, key: &Key, dry_run: bool, f: F) -> ApiResult<Committed>
    where
        F: FnOnce(Option<&Value>) -> ApiResult<Mutation>,
    {
        // A write that cannot be made durable is refused, not acknowledged and lost later
        // (kube-apiserver's answer when etcd is out of space: a 500).
        if !dry_run && let Some(why) = self.persist.as_ref().and_then(Persister::failing) {
            return Err(ApiError::internal(format!(
                "the API server's storage is failing, writes are refused until it recovers: {why}"
            )));
        }
        let mut st = self.lock();
        let current = st.objects[res].get(key).cloned();
        let mut current_value = current.as_deref().map(Stored::value);
        let mutation = f(current_value.as_ref())?;
        if dry_run {
            let object = match mutation {
                Mutation::Put(v) | Mutation::PutThenDelete(v) | Mutation::Delete(v) => v,
                Mutation::Unchanged => current_value
                    .take()
                    .ok_or_else(|| ApiError::internal("dry run of nothing"))?,
            };
            return Ok(Committed { object, kind: None });
        }
        match mutation {
            Mutation::Unchanged => {
                let object = current_value
                    .take()
                    .ok_or_else(|| ApiError::internal("unchanged write of a missing object"))?;
                Ok(Committed { object, kind: None })
            }
            Mutation::Put(obj) => {
                let kind = if current.is_some() {
                    EventType::Modified
                } else {
                    EventType::Added
                };
                let (_, object) = self.commit(&mut st, res, key, kind, obj, current);
                Ok(Committed {
                    object,
                    kind: Some(kind),
                })
            }
            Mutation::PutThenDelete(obj) => {
                let kind = if current.is_some() {
                    EventType::Modified
                } else {
                    EventType::Added
                };
                let (stored, last) = self.commit(&mut st, res, key, kind, obj, current);
                let (_, object) =
                    self.commit(&mut st, res, key, EventType::Deleted, last, Some(stored));
                Ok(Committed {
                    object,
                    kind: Some(EventType::Deleted),
                })
            }
            Mutation::Delete(obj) => {
                let (_, object) = self.commit(&mut st, res, key, EventType::Deleted, obj, current);
                Ok(Committed {
                    object,
                    kind: Some(EventType::Deleted),
                })
            }
        }
    }

    /// Stores `obj` at the next resourceVersion and tells the watchers; returns what was
    /// stored and `obj` with its new resourceVersion.
    fn commit(
        &self,
        st: &mut State,
        res: ResourceId,
        key: &Key,
        kind: EventType,
        mut obj: Value,
        old: Option<Arc<Stored>>,
    ) -> (Arc<Stored>, Value) {
        st.rv += 1;
        let rv = st.rv;
        meta_mut(&mut obj).insert("resourceVersion".into(), Value::String(rv.to_string()));
        let object = Arc::new(Stored::new(&obj));
        if kind == EventType::Deleted {
            st.objects[res].remove(key);
        } else {
            st.objects[res].insert(key.clone(), object.clone());
        }
        if let Some(p) = &self.persist {
            p.record(res, rv, &object, kind == EventType::Deleted);
        }
        let ev = Arc::new(Event {
            rv,
            res,
            kind,
            object: object.clone(),
            old,
        });
        let mut old_value = None;
        st.watchers.retain(|w| {
            if !w.filter.wants_parsed(&ev, Some(&obj), &mut old_value) {
                return !w.tx.is_closed();
            }
            // Full or closed: the watcher is dropped; its stream ends and the client re-watches.
            w.tx.try_send(ev.clone()).is_ok()
        });
        st.log.push_back(ev);
        while st.log.len() > self.config.window {
            if let Some(old) = st.log.pop_front() {
                st.compacted = old.rv;
            }
        }
        (object, obj)
    }

    /// Registers a watcher. Fails with the compacted resourceVersion when `After` is too old.
    pub fn watch(&self, filter: WatchFilter, start: WatchStart) -> Result<Subscription, u64> {
        let mut st = self.lock();
        let backlog = match start {
            WatchStart::Snapshot => st.objects[filter.res]
                .values()
                .filter(|o| filter.matches(o))
                .map(|o| {
                    Arc::new(Event {
                        rv: o.rv(),
                        res: filter.res,
                        kind: EventType::Added,
                        object: o.clone(),
                        old: None,
                    })
                })
                .collect(),
            WatchStart::After(after) => {
                if after < st.compacted {
                    return Err(st.compacted);
                }
                st.log
                    .iter()
                    .filter(|e| e.rv > after && filter.wants(e))
                    .cloned()
                    .collect()
            }
        };
        let (tx, rx) = mpsc::channel(self.config.watcher_buffer.max(1));
        st.watchers.push(Slot { filter, tx });
        Ok(Subscription {
            backlog,
            rx,
            rv: st.rv,
        })
    }

    pub fn watcher_count(&self) -> usize {
        let mut st = self.lock();
        st.watchers.retain(|w| !w.tx.is_closed());
        st.watchers.len()
    }

    /// Makes pending persisted writes durable (on shutdown).
    pub fn flush(&self) {
        if let Some(p) = &self.persist {
            p.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cfg(window: usize) -> StoreConfig {
        StoreConfig {
            window,
            watcher_buffer: 4,
        }
    }

    fn put(store: &Store, name: &str, label: &str) -> Value {
        let obj = json!({"metadata": {"name": name, "labels": {"l": label}}});
        store
            .mutate(0, &("".into(), name.into()), false, |_| {
                Ok(Mutation::Put(obj))
            })
            .unwrap()
            .object
    }

    fn filter() -> WatchFilter {
        WatchFilter {
            res: 0,
            namespace: None,
            selectors: Selectors::default(),
        }
    }

    #[test]
    fn versions_increase_and_list_rolls_back() {
        let s = Store::new(cfg(100));
        let a = put(&s, "a", "1");
        let rv_a: u64 = a["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        put(&s, "b", "1");
        put(&s, "a", "2");
        let (rv, now) = s.list(0, None, None, None).unwrap();
        assert_eq!(rv, rv_a + 2);
        assert_eq!(now.len(), 2);
        assert_eq!(now[0].value()["metadata"]["labels"]["l"], "2");
        let (_, then) = s.list(0, None, Some(rv_a), None).unwrap();
        assert_eq!(then.len(), 1);
        assert_eq!(then[0].value()["metadata"]["labels"]["l"], "1");
    }

    #[test]
    fn a_filtered_watcher_is_told_of_changes_into_and_out_of_its_selection() {
        use crate::selectors::LabelSelector;
        let s = Store::new(cfg(100));
        let mut sub = s
            .watch(
                WatchFilter {
                    selectors: Selectors {
                        labels: LabelSelector::parse("l=1").unwrap(),
                        ..Selectors::default()
                    },
                    ..filter()
                },
                WatchStart::After(s.current_rv()),
            )
            .unwrap();
        put(&s, "a", "1"); // into the selection
        put(&s, "b", "2"); // never in it
        put(&s, "a", "2"); // out of it: only the old version matched
        put(&s, "a", "3"); // neither version matches
        let mut got = Vec::new();
        while let Ok(ev) = sub.rx.try_recv() {
            got.push((
                ev.object.name().to_string(),
                ev.object.value()["metadata"]["labels"]["l"].clone(),
            ));
        }
        assert_eq!(
            got,
            vec![("a".to_string(), json!("1")), ("a".to_string(), json!("2"))]
        );
        // A watch resumed from the log chooses the same events.
        let resumed = s.watch(
            WatchFilter {
                selectors: Selectors {
                    labels: LabelSelector::parse("l=1").unwrap(),
                    ..Selectors::default()
                },
                ..filter()
            },
            WatchStart::After(1),
        );
        assert_eq!(resumed.unwrap().backlog.len(), 2);
    }

    #[test]
    fn old_versions_expire_from_the_window() {
        let s = Store::new(cfg(2));
        for i in 0..5 {
            put(&s, &format!("o{i}"), "x");
        }
        let compacted = s.watch(filter(), WatchStart::After(1)).unwrap_err();
        assert!(compacted > 1);
        assert!(s.list(0, None, Some(2), None).is_err());
        let sub = s
            .watch(filter(), WatchStart::After(s.current_rv() - 1))
            .unwrap();
        assert_eq!(sub.backlog.len(), 1);
    }

    #[test]
    fn slow_watchers_are_closed_not_waited_for() {
        let s = Store::new(cfg(100));
        let mut sub = s
            .watch(filter(), WatchStart::After(s.current_rv()))
            .unwrap();
        for i in 0..10 {
            put(&s, &format!("o{i}"), "x");
        }
        // The writer never blocked; the watcher got its buffer's worth and was then dropped.
        let mut got = 0;
        while sub.rx.try_recv().is_ok() {
            got += 1;
        }
        assert_eq!(got, 4);
        assert_eq!(s.watcher_count(), 0);
    }
}
