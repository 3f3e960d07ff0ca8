//! Watches feeding the caches and the queue. Each watch applies its events to its reflector
//! store itself, then tells the controller which object changed; after a re-list, the objects
//! that vanished meanwhile are reported too (the worker finds them gone).

use std::fmt::Debug;
use std::sync::Arc;

use futures::StreamExt;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

/// Runs one watch until `stop`, calling `on_change` with every changed (or vanished) object.
pub(crate) async fn watch_loop<K, F>(
    api: Api<K>,
    mut writer: Writer<K>,
    store: Store<K>,
    stop: CancellationToken,
    mut on_change: F,
) where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    F: FnMut(&K) + Send,
{
    let kind = K::kind(&()).to_string();
    let mut stream = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut before_relist: Option<Vec<Arc<K>>> = None;
    loop {
        let event = tokio::select! {
            () = stop.cancelled() => return,
            ev = stream.next() => ev,
        };
        let event = match event {
            None => return,
            Some(Err(e)) => {
                tracing::warn!(kind = %kind, error = %e, "watch failed; retrying with backoff");
                continue;
            }
            Some(Ok(ev)) => ev,
        };
        writer.apply_watcher_event(&event);
        match &event {
            Event::Apply(obj) | Event::InitApply(obj) | Event::Delete(obj) => on_change(obj),
            Event::Init => before_relist = Some(store.state()),
            Event::InitDone => {
                for obj in before_relist.take().unwrap_or_default() {
                    if store.get(&ObjectRef::from_obj(obj.as_ref())).is_none() {
                        on_change(obj.as_ref());
                    }
                }
            }
        }
    }
}
