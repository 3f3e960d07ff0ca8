//! One watch cache per kind for every controller of a process, as kube-controller-manager
//! shares one informer factory among its controllers: in `csi-cluster` the attach/detach
//! controller, the PV controller, the scheduler, the StatefulSet and ephemeral-volume
//! controllers read one copy of the cluster's pods, claims and volumes instead of one each.
//! A component run as its own process makes its own (private) one.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use kube::runtime::watcher;
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;

use crate::ObjectCache;

/// Cheap to clone; clones share the caches.
#[derive(Clone)]
pub struct SharedCaches {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    runtime: tokio::runtime::Handle,
    stop: CancellationToken,
    /// `ObjectCache<K>` by `TypeId::of::<K>()`.
    caches: Mutex<HashMap<TypeId, Box<dyn Any + Send + Sync>>>,
}

impl std::fmt::Debug for SharedCaches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kinds = self.lock().len();
        f.debug_struct("SharedCaches")
            .field("kinds", &kinds)
            .finish()
    }
}

impl SharedCaches {
    /// Caches read through `client`, their watches running on `runtime` until `stop`. Shared
    /// by components on other runtimes, they must run on one that outlives them all.
    pub fn new(client: Client, runtime: tokio::runtime::Handle, stop: CancellationToken) -> Self {
        Self {
            inner: Arc::new(Inner {
                client,
                runtime,
                stop,
                caches: Mutex::default(),
            }),
        }
    }

    /// Caches of one component of its own: on the current runtime, stopped with `stop`.
    pub fn private(client: Client, stop: CancellationToken) -> Self {
        Self::new(client, tokio::runtime::Handle::current(), stop)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<TypeId, Box<dyn Any + Send + Sync>>> {
        // The map only ever gains complete entries: a panic elsewhere leaves it consistent.
        self.inner
            .caches
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Every object of kind `K`, watched; started on first use, the same cache afterwards.
    pub fn all<K>(&self) -> ObjectCache<K>
    where
        K: crate::object_cache::CachedKind,
    {
        let mut caches = self.lock();
        if let Some(cache) = caches
            .get(&TypeId::of::<K>())
            .and_then(|c| c.downcast_ref::<ObjectCache<K>>())
        {
            return cache.clone();
        }
        let cache = ObjectCache::spawn_on(
            &self.inner.runtime,
            Api::all(self.inner.client.clone()),
            watcher::Config::default(),
            self.inner.stop.clone(),
        );
        caches.insert(TypeId::of::<K>(), Box::new(cache.clone()));
        cache
    }

    /// How many kinds are cached.
    pub fn kinds(&self) -> usize {
        self.lock().len()
    }
}
