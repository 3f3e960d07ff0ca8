//! `SharedCaches` over apiserver-lite: components asking for the same kind get one cache,
//! which runs on the runtime it was given and so outlives a component's runtime (a component
//! killed and started again inside `csi-cluster`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use component_runtime::{ObjectCache, SharedCaches};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::PostParams;
use tokio_util::sync::CancellationToken;

mod common;

use common::{claim, server_with_claims, until};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_cache_per_kind_that_outlives_the_runtime_of_who_asked() {
    let (server, api) = server_with_claims(&["a"]).await;
    let client = server.client();

    // The caches' own runtime, on a thread of its own (as csi-cluster's informers).
    let stop = CancellationToken::new();
    let (tx, rx) = std::sync::mpsc::channel();
    let until_stopped = stop.clone();
    let informers = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        tx.send(rt.handle().clone()).unwrap();
        rt.block_on(until_stopped.cancelled());
    });
    let shared = SharedCaches::new(client.clone(), rx.recv().unwrap(), stop.clone());

    // A component on a runtime of its own asks first, then its runtime goes (a kill).
    let s = shared.clone();
    let first: ObjectCache<PersistentVolumeClaim> = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let cache: ObjectCache<PersistentVolumeClaim> = s.all();
            assert!(cache.wait_until_ready(Duration::from_secs(10)).await);
            cache
        })
    })
    .join()
    .unwrap();
    assert_eq!(first.len(), 1);

    // Another component asking for the same kind gets the same cache; another kind adds one.
    let second: ObjectCache<PersistentVolumeClaim> = shared.all();
    let _pods: ObjectCache<Pod> = shared.all();
    assert_eq!(shared.kinds(), 2, "one cache per kind");
    assert!(second.is_ready(), "already listed: the same cache");

    // Still fed after the first component's runtime is gone.
    api.create(&PostParams::default(), &claim("b", "1Gi"))
        .await
        .unwrap();
    until("b seen by both readers", || {
        first.get_namespaced("default", "b").is_some()
            && second.get_namespaced("default", "b").is_some()
    })
    .await;

    stop.cancel();
    informers.join().unwrap();
}

/// Every component waits for the first list of the same cache at once (csi-cluster starts
/// them together): each must be woken. kube's own `Store::wait_until_ready` wakes only the
/// last of concurrent waiters, which left the attach/detach and ephemeral-volume controllers
/// waiting forever on shared caches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_concurrent_waiter_for_the_first_list_is_woken() {
    let server = apiserver::ApiServer::start(apiserver::Config::default())
        .await
        .expect("api server");
    let stop = CancellationToken::new();
    let shared = SharedCaches::private(server.client(), stop.clone());
    let waiters: Vec<_> = (0..6)
        .map(|_| {
            let s = shared.clone();
            tokio::spawn(async move {
                let cache: ObjectCache<Pod> = s.all();
                // A stuck waiter would only return at this timeout.
                cache.wait_until_ready(Duration::from_secs(60)).await
            })
        })
        .collect();
    let all = async {
        for w in waiters {
            assert!(w.await.unwrap());
        }
    };
    tokio::time::timeout(Duration::from_secs(5), all)
        .await
        .expect("every waiter woken by the first list, not by its timeout");
    stop.cancel();
}

/// A subscriber is told of each change after the cache has it, with the object (the deleted
/// one's last copy), and stops being told once its subscription is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_is_told_which_object_changed_until_it_unsubscribes() {
    use component_runtime::object_cache::Change;
    use std::sync::{Arc, Mutex};

    let (server, api) = server_with_claims(&["a"]).await;
    let stop = CancellationToken::new();
    let cache: ObjectCache<PersistentVolumeClaim> = ObjectCache::spawn(
        kube::Api::all(server.client()),
        kube::runtime::watcher::Config::default(),
        stop.clone(),
    );
    assert!(cache.wait_until_ready(Duration::from_secs(10)).await);
    let told: Arc<Mutex<Vec<String>>> = Arc::default();
    let (t, c) = (told.clone(), cache.clone());
    let subscription = cache.subscribe(move |change: Change<'_, PersistentVolumeClaim>| {
        let line = match change {
            Change::Applied(pvc) => {
                let name = pvc.metadata.name.clone().unwrap_or_default();
                // Told after the cache applied it.
                assert!(
                    c.get_namespaced("default", &name).is_some(),
                    "{name} not in the cache yet"
                );
                format!("applied {name}")
            }
            Change::Deleted(pvc) => {
                format!("deleted {}", pvc.metadata.name.clone().unwrap_or_default())
            }
            Change::Relisted => "relisted".to_string(),
        };
        t.lock().unwrap().push(line);
    });
    api.create(&PostParams::default(), &claim("b", "1Gi"))
        .await
        .unwrap();
    api.delete("a", &Default::default()).await.unwrap();
    until("b applied and a deleted told", || {
        let t = told.lock().unwrap();
        t.contains(&"applied b".to_string()) && t.contains(&"deleted a".to_string())
    })
    .await;
    assert!(
        !told.lock().unwrap().contains(&"applied a".to_string()),
        "a was there before: not told"
    );

    drop(subscription);
    let before = told.lock().unwrap().len();
    api.create(&PostParams::default(), &claim("c", "1Gi"))
        .await
        .unwrap();
    until("c in the cache", || {
        cache.get_namespaced("default", "c").is_some()
    })
    .await;
    assert_eq!(
        told.lock().unwrap().len(),
        before,
        "nothing told after unsubscribing"
    );
    stop.cancel();
}
