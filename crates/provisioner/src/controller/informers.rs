//! Watch caches several provisioners in one process can share, as client-go's shared informer
//! factory lets the controllers of one binary share theirs.
//!
//! A csi-provisioner run with `--node-deployment` on every node watches every claim and
//! volume of the cluster, like the Go sidecar (it cannot know which claims will pick its node).
//! `csi-cluster` runs one per node in one process: ten copies of every PV and PVC were ~95 MiB
//! at 1,000 pods (docs/benchmarks.md). With [`Informers`], one watch per kind fills one store,
//! and each provisioner subscribes to its changes. A provisioner run alone starts its own
//! `Informers` and is their only subscriber: one code path either way.

use std::fmt::Debug;
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass};
use kube::runtime::reflector::{self, Store};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use super::watch;

type Callback<K> = Box<dyn FnMut(&K) + Send>;

struct Subscribers<K> {
    next_id: u64,
    callbacks: Vec<(u64, Callback<K>)>,
}

/// One watch of `K` feeding one store, whose changes go to every subscriber.
pub struct SharedWatch<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    store: Store<K>,
    subscribers: Arc<Mutex<Subscribers<K>>>,
    /// True once the first list is in the store.
    ready: tokio::sync::watch::Receiver<bool>,
}

impl<K> Clone for SharedWatch<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            subscribers: self.subscribers.clone(),
            ready: self.ready.clone(),
        }
    }
}

impl<K> SharedWatch<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    /// Starts the watch on `runtime` until `stop`.
    fn spawn(api: Api<K>, runtime: &tokio::runtime::Handle, stop: CancellationToken) -> Self {
        let (store, writer) = reflector::store();
        let subscribers = Arc::new(Mutex::new(Subscribers {
            next_id: 0,
            callbacks: Vec::new(),
        }));
        let subs = subscribers.clone();
        runtime.spawn(watch::watch_loop(
            api,
            writer,
            store.clone(),
            stop.clone(),
            move |obj: &K| {
                let mut subs = subs.lock().unwrap_or_else(PoisonError::into_inner);
                for (_, callback) in &mut subs.callbacks {
                    callback(obj);
                }
            },
        ));
        // The store's own wait wakes only the last of several waiters (one oneshot receiver
        // underneath), and every subscriber waits: one task waits there and tells them all.
        let (ready_tx, ready) = tokio::sync::watch::channel(false);
        let waiting = store.clone();
        runtime.spawn(async move {
            tokio::select! {
                r = waiting.wait_until_ready() => {
                    if r.is_ok() {
                        let _ = ready_tx.send(true);
                    }
                }
                () = stop.cancelled() => {}
            }
        });
        Self {
            store,
            subscribers,
            ready,
        }
    }

    /// Waits until the first list is in the store; `Err` when the watch stopped first.
    pub async fn wait_until_ready(&self) -> Result<(), String> {
        let mut ready = self.ready.clone();
        ready
            .wait_for(|r| *r)
            .await
            .map(|_| ())
            .map_err(|_| format!("the shared watch of {} stopped", K::kind(&())))
    }

    /// The shared store.
    pub fn store(&self) -> Store<K> {
        self.store.clone()
    }

    /// Calls `on_change` with every object in the store now, then with every change, until the
    /// returned guard is dropped. Both happen under the lock the watch dispatches under, so no
    /// change falls between the two (one may come twice, which a work queue absorbs).
    pub fn subscribe(&self, mut on_change: impl FnMut(&K) + Send + 'static) -> Subscription {
        let mut subs = self
            .subscribers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for obj in self.store.state() {
            on_change(&obj);
        }
        let id = subs.next_id;
        subs.next_id += 1;
        subs.callbacks.push((id, Box::new(on_change)));
        let weak = Arc::downgrade(&self.subscribers);
        Subscription {
            cancel: Some(Box::new(move || {
                if let Some(subs) = weak.upgrade() {
                    subs.lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .callbacks
                        .retain(|(i, _)| *i != id);
                }
            })),
        }
    }

    /// How many subscribers there are (for tests).
    pub fn subscribers(&self) -> usize {
        self.subscribers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .callbacks
            .len()
    }
}

/// Unsubscribes when dropped.
pub struct Subscription {
    cancel: Option<Box<dyn FnOnce() + Send>>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if let Some(cancel) = self.cancel.take() {
            cancel();
        }
    }
}

/// The five watches a provisioner reads, shared.
#[derive(Clone)]
pub struct Informers {
    pub(crate) pvcs: SharedWatch<PersistentVolumeClaim>,
    pub(crate) pvs: SharedWatch<PersistentVolume>,
    pub(crate) classes: SharedWatch<StorageClass>,
    pub(crate) csinodes: SharedWatch<CSINode>,
    pub(crate) nodes: SharedWatch<Node>,
}

impl std::fmt::Debug for Informers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Informers")
            .field("claims", &self.pvcs.store.state().len())
            .field("volumes", &self.pvs.store.state().len())
            .finish_non_exhaustive()
    }
}

impl Informers {
    /// Waits until every watch has its first list in.
    pub async fn wait_until_ready(&self) -> Result<(), String> {
        self.pvcs.wait_until_ready().await?;
        self.pvs.wait_until_ready().await?;
        self.classes.wait_until_ready().await?;
        self.csinodes.wait_until_ready().await?;
        self.nodes.wait_until_ready().await
    }

    /// The claims' watch.
    pub fn claims(&self) -> &SharedWatch<PersistentVolumeClaim> {
        &self.pvcs
    }

    /// Starts the watches with `client` (whose identity must be allowed to list and watch what
    /// a csi-provisioner does) on `runtime`, until `stop`.
    pub fn spawn(
        client: &Client,
        runtime: &tokio::runtime::Handle,
        stop: &CancellationToken,
    ) -> Self {
        Self {
            pvcs: SharedWatch::spawn(Api::all(client.clone()), runtime, stop.clone()),
            pvs: SharedWatch::spawn(Api::all(client.clone()), runtime, stop.clone()),
            classes: SharedWatch::spawn(Api::all(client.clone()), runtime, stop.clone()),
            csinodes: SharedWatch::spawn(Api::all(client.clone()), runtime, stop.clone()),
            nodes: SharedWatch::spawn(Api::all(client.clone()), runtime, stop.clone()),
        }
    }
}
