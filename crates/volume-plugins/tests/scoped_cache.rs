//! A scoped `ObjectCache` over apiserver-lite: it holds only what its readers asked for,
//! learns about changes of those objects by fetching them again, and drops what nobody asks
//! for any more.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use kube::Api;
use kube::api::{DeleteParams, PostParams};
use tokio_util::sync::CancellationToken;
use volume_plugins::{ObjectCache, ScopedPolicy};

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

/// A node agent's VolumeAttachments come from a scoped cache, whose copy may be seconds old.
/// A VolumeAttachment that was attached and is now being deleted (its detach is underway and
/// cannot be taken back) must not be mounted on: the wait for attach reads it fresh. `csi-cluster
/// chaos` found a volume detached under a new pod's mount when the stale copy was trusted.
#[tokio::test]
async fn the_wait_for_attach_reads_a_volume_attachment_fresh_from_a_scoped_cache() {
    use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};
    use kube::api::{Patch, PatchParams};
    use volume_plugins::{CsiPlugin, SkipAttachMode, names::volume_attachment_name};

    let server = apiserver::ApiServer::start(apiserver::Config::default())
        .await
        .expect("api server");
    let client = server.client();
    let (driver, handle, node) = ("ebs.csi.aws.com", "vol-1", "node-1");
    let name = volume_attachment_name(handle, driver, node);
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let va: VolumeAttachment = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "finalizers": ["external-attacher/ebs-csi-aws-com"]},
        "spec": {"attacher": driver, "nodeName": node, "source": {"persistentVolumeName": "pv-1"}}
    }))
    .unwrap();
    vas.create(&PostParams::default(), &va).await.unwrap();
    vas.patch_status(
        &name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"status": {"attached": true}})),
    )
    .await
    .unwrap();

    // Refetched only every 30 s on its own: without a fresh read the copy stays stale.
    let stop = CancellationToken::new();
    let c = client.clone();
    let attachments: ObjectCache<VolumeAttachment> = ObjectCache::spawn_scoped(
        move |_| Api::all(c.clone()),
        ScopedPolicy {
            fast: Duration::from_secs(30),
            slow: Duration::from_secs(30),
            idle: Duration::from_secs(300),
            parallel: 4,
        },
        stop.clone(),
    );
    let csidriver: CSIDriver = serde_json::from_value(serde_json::json!({
        "metadata": {"name": driver}, "spec": {"attachRequired": true}
    }))
    .unwrap();
    let plugin = CsiPlugin::new(
        client.clone(),
        ObjectCache::from_objects([csidriver]),
        attachments.clone(),
        SkipAttachMode::default(),
    );
    let attached = plugin
        .wait_for_attach(driver, handle, node, Duration::from_secs(5))
        .await
        .expect("attached");
    assert_eq!(attached.volume_attachment.as_deref(), Some(name.as_str()));
    assert!(attachments.get(&name).is_some(), "now in the scoped cache");

    // The attach/detach controller deletes it; the attacher's finalizer keeps it while it
    // detaches. The next wait must see that, not the cached attached copy.
    vas.delete(&name, &kube::api::DeleteParams::default())
        .await
        .unwrap();
    let e = plugin
        .wait_for_attach(driver, handle, node, Duration::from_secs(5))
        .await
        .expect_err("a VolumeAttachment being deleted is not attached");
    assert!(e.to_string().contains("being deleted"), "{e}");
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
