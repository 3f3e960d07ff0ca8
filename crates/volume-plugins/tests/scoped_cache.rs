//! A scoped `ObjectCache` over apiserver-lite: it holds only what its readers asked for,
//! learns about changes of those objects by fetching them again, and drops what nobody asks
//! for any more.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use tokio_util::sync::CancellationToken;
use volume_plugins::{ObjectCache, ScopedPolicy};

fn claim(name: &str, size: &str) -> PersistentVolumeClaim {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}
    }))
    .unwrap()
}

fn size(c: &PersistentVolumeClaim) -> String {
    c.spec
        .as_ref()
        .unwrap()
        .resources
        .as_ref()
        .unwrap()
        .requests
        .as_ref()
        .unwrap()["storage"]
        .0
        .clone()
}

/// Polls `check` on the cache until it holds (10 s at most).
async fn until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(std::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn holds_only_what_is_asked_for_follows_it_and_forgets_it() {
    let server = apiserver::ApiServer::start(apiserver::Config::default())
        .await
        .expect("api server");
    let client = server.client();
    let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    for name in ["a", "b", "c"] {
        api.create(&PostParams::default(), &claim(name, "1Gi"))
            .await
            .unwrap();
    }
    let stop = CancellationToken::new();
    let c = client.clone();
    let policy = ScopedPolicy {
        fast: Duration::from_millis(50),
        slow: Duration::from_millis(200),
        idle: Duration::from_millis(700),
        parallel: 4,
    };
    let cache: ObjectCache<PersistentVolumeClaim> = ObjectCache::spawn_scoped(
        move |ns| Api::namespaced(c.clone(), ns.unwrap_or("default")),
        policy,
        stop.clone(),
    );
    assert!(cache.is_ready(), "a scoped cache has nothing to list first");

    // A miss registers the object; it comes in, and only it.
    let mut changed = cache.changed();
    assert!(cache.get_namespaced("default", "a").is_none());
    tokio::time::timeout(Duration::from_secs(5), changed.changed())
        .await
        .expect("changed fires once the object is in")
        .unwrap();
    until("a cached", || {
        cache.get_namespaced("default", "a").is_some()
    })
    .await;
    assert_eq!(
        cache.len(),
        1,
        "only what was asked for: {:?}",
        cache.list().len()
    );
    assert_eq!(cache.interest_len(), 1);

    // A change of an object someone keeps asking about is seen within the slow interval.
    let mut a = api.get("a").await.unwrap();
    a.spec
        .as_mut()
        .unwrap()
        .resources
        .as_mut()
        .unwrap()
        .requests = Some(
        [(
            "storage".to_string(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("2Gi".into()),
        )]
        .into(),
    );
    api.replace("a", &PostParams::default(), &a).await.unwrap();
    until("a's new size", || {
        cache
            .get_namespaced("default", "a")
            .is_some_and(|c| size(&c) == "2Gi")
    })
    .await;

    // An object that does not exist stays absent; once created it comes in.
    assert!(cache.get_namespaced("default", "d").is_none());
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(cache.get_namespaced("default", "d").is_none());
    api.create(&PostParams::default(), &claim("d", "1Gi"))
        .await
        .unwrap();
    until("d cached after its creation", || {
        cache.get_namespaced("default", "d").is_some()
    })
    .await;

    // Deleted: gone from the cache too.
    api.delete("d", &DeleteParams::default()).await.unwrap();
    until("d gone", || cache.get_namespaced("default", "d").is_none()).await;

    // Nobody asks for "a" and "d" any more: dropped after `idle`, memory back.
    until("everything dropped", || {
        cache.is_empty() && cache.interest_len() == 0
    })
    .await;
    assert!(
        cache.list().is_empty(),
        "b and c were never asked for, a and d are idle"
    );
    stop.cancel();
}
