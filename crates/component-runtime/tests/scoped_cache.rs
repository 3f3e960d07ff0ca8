//! A scoped `ObjectCache` over apiserver-lite: it holds only what its readers asked for,
//! learns about changes of those objects by fetching them again, and drops what nobody asks
//! for any more.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use component_runtime::ScopedPolicy;
use kube::api::{DeleteParams, PostParams};
use tokio_util::sync::CancellationToken;

mod common;

use common::{claim, scoped_claims, server_with_claims, size, until};

#[tokio::test]
async fn holds_only_what_is_asked_for_follows_it_and_forgets_it() {
    let (server, api) = server_with_claims(&["a", "b", "c"]).await;
    let stop = CancellationToken::new();
    let policy = ScopedPolicy {
        fast: Duration::from_millis(50),
        slow: Duration::from_millis(200),
        idle: Duration::from_millis(700),
        parallel: 4,
    };
    let cache = scoped_claims(&server, policy, &stop);
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

/// A claim deleted and recreated under the same name while the cache holds the old copy: a
/// read that must be fresh (`fresh_since`, a new pod's claim) does not take the copy, fetches
/// at once and is told when it is in, also for an object that did not change.
#[tokio::test]
async fn a_fresh_read_never_answers_with_a_copy_older_than_asked() {
    let (server, api) = server_with_claims(&["a", "b"]).await;
    let stop = CancellationToken::new();
    // Refetches far apart: only the fresh read can bring the new claim within the test.
    let policy = ScopedPolicy {
        fast: Duration::from_secs(30),
        slow: Duration::from_secs(60),
        idle: Duration::from_secs(120),
        parallel: 4,
    };
    let cache = scoped_claims(&server, policy, &stop);
    cache.get_namespaced("default", "a");
    cache.get_namespaced("default", "b");
    until("a and b cached", || {
        cache.get_namespaced("default", "a").is_some()
            && cache.get_namespaced("default", "b").is_some()
    })
    .await;
    let old_uid = cache
        .get_namespaced("default", "a")
        .unwrap()
        .metadata
        .uid
        .clone();

    api.delete("a", &DeleteParams::default()).await.unwrap();
    api.create(&PostParams::default(), &claim("a", "2Gi"))
        .await
        .unwrap();
    let since = std::time::Instant::now();
    assert_eq!(
        cache.get_namespaced("default", "a").unwrap().metadata.uid,
        old_uid,
        "the plain read still answers with the old copy"
    );
    let mut changed = cache.changed();
    changed.borrow_and_update();
    assert!(
        cache.fresh_since(Some("default"), "a", since).is_none(),
        "not read since: no answer"
    );
    assert!(cache.fresh_since(Some("default"), "b", since).is_none());
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let (a, b) = loop {
        let a = cache.fresh_since(Some("default"), "a", since);
        let b = cache.fresh_since(Some("default"), "b", since);
        if let (Some(a), Some(b)) = (a, b) {
            break (a, b);
        }
        assert!(std::time::Instant::now() < deadline, "no fresh read in 5 s");
        tokio::time::timeout(Duration::from_secs(5), changed.changed())
            .await
            .expect("changed fires for a fresh read")
            .unwrap();
    };
    let a = a.expect("a exists");
    assert_ne!(a.metadata.uid, old_uid, "the recreated claim, not the copy");
    assert_eq!(size(&a), "2Gi");
    assert_eq!(size(&b.expect("b exists")), "1Gi", "b unchanged, but read");
    assert!(
        cache
            .fresh_since(Some("default"), "gone", std::time::Instant::now())
            .is_none()
    );
    until("an absent object is known absent", || {
        cache
            .fresh_since(Some("default"), "gone", since)
            .is_some_and(|o| o.is_none())
    })
    .await;
    stop.cancel();
}
