//! Watch through kube-rs: order, resume, 410 Gone, bookmarks, timeouts, selectors, slow
//! watchers, and kube-runtime's watcher (list-then-watch and streaming lists).
// Test code (helpers included): a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{start, start_with};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::watcher;
use serde_json::json;

fn va(name: &str, node: &str) -> VolumeAttachment {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"node": node}},
        "spec": {"attacher": "ebs.csi.aws.com", "nodeName": node, "source": {"persistentVolumeName": format!("pv-{name}")}}
    }))
    .unwrap()
}

fn summary(ev: &WatchEvent<VolumeAttachment>) -> String {
    match ev {
        WatchEvent::Added(o) => format!("ADDED {}", o.metadata.name.as_deref().unwrap_or("")),
        WatchEvent::Modified(o) => format!("MODIFIED {}", o.metadata.name.as_deref().unwrap_or("")),
        WatchEvent::Deleted(o) => format!("DELETED {}", o.metadata.name.as_deref().unwrap_or("")),
        WatchEvent::Bookmark(_) => "BOOKMARK".into(),
        WatchEvent::Error(e) => format!("ERROR {}", e.code),
    }
}

async fn next_n<S>(stream: &mut S, n: usize) -> Vec<String>
where
    S: futures::Stream<Item = kube::Result<WatchEvent<VolumeAttachment>>> + Unpin,
{
    let mut out = Vec::new();
    while out.len() < n {
        let ev = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("event within 10s")
            .expect("stream open")
            .expect("event decodes");
        let s = summary(&ev);
        if s != "BOOKMARK" {
            out.push(s);
        }
    }
    out
}

#[tokio::test]
async fn events_arrive_in_order_and_resume_from_a_version() {
    let server = start().await;
    let vas: Api<VolumeAttachment> = Api::all(server.client());
    let list = vas.list(&ListParams::default()).await.unwrap();
    let rv0 = list.metadata.resource_version.unwrap();
    let mut w = vas
        .watch(&WatchParams::default(), &rv0)
        .await
        .unwrap()
        .boxed();

    vas.create(&PostParams::default(), &va("a", "n1"))
        .await
        .unwrap();
    let m = vas
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "1"}}})),
        )
        .await
        .unwrap();
    let mid_rv = m.metadata.resource_version.unwrap();
    vas.create(&PostParams::default(), &va("b", "n1"))
        .await
        .unwrap();
    vas.delete("a", &DeleteParams::default()).await.unwrap();
    assert_eq!(
        next_n(&mut w, 4).await,
        vec!["ADDED a", "MODIFIED a", "ADDED b", "DELETED a"]
    );

    // A new watch from a version in the middle replays exactly what came after it.
    let mut resumed = vas
        .watch(&WatchParams::default(), &mid_rv)
        .await
        .unwrap()
        .boxed();
    assert_eq!(next_n(&mut resumed, 2).await, vec!["ADDED b", "DELETED a"]);
    // Without a version: the current objects as ADDED, then changes.
    let mut fresh = vas
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    vas.create(&PostParams::default(), &va("c", "n1"))
        .await
        .unwrap();
    assert_eq!(next_n(&mut fresh, 2).await, vec!["ADDED b", "ADDED c"]);
}

#[tokio::test]
async fn an_expired_version_is_410_gone() {
    let server = start_with(common::small_window(5)).await;
    let vas: Api<VolumeAttachment> = Api::all(server.client());
    let rv0 = server.resource_version().to_string();
    for i in 0..10 {
        vas.create(&PostParams::default(), &va(&format!("v{i}"), "n1"))
            .await
            .unwrap();
    }
    let mut w = vas
        .watch(&WatchParams::default(), &rv0)
        .await
        .unwrap()
        .boxed();
    let ev = tokio::time::timeout(Duration::from_secs(5), w.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    match ev {
        WatchEvent::Error(e) => {
            assert_eq!((e.code, e.reason.as_str()), (410, "Expired"));
            assert!(
                e.message.starts_with("too old resource version"),
                "{}",
                e.message
            );
        }
        other => panic!("expected a 410 ERROR event, got {}", summary(&other)),
    }
}

#[tokio::test]
async fn bookmarks_and_timeouts() {
    let server = start_with(common::fast_bookmarks()).await;
    let vas: Api<VolumeAttachment> = Api::all(server.client());
    vas.create(&PostParams::default(), &va("a", "n1"))
        .await
        .unwrap();
    let rv = server.resource_version();
    let wp = WatchParams::default().timeout(3);
    let mut w = vas.watch(&wp, &rv.to_string()).await.unwrap().boxed();
    let mut bookmark_rv = None;
    let mut events = 0;
    let started = std::time::Instant::now();
    while let Some(ev) = tokio::time::timeout(Duration::from_secs(10), w.next())
        .await
        .expect("stream ends by its timeout")
    {
        match ev.unwrap() {
            WatchEvent::Bookmark(b) => bookmark_rv = Some(b.metadata.resource_version),
            _ => events += 1,
        }
    }
    assert_eq!(events, 0);
    assert_eq!(bookmark_rv.as_deref(), Some(rv.to_string().as_str()));
    // timeoutSeconds=3 closed the stream (not the 10 s guard).
    assert!(started.elapsed() < Duration::from_secs(9));
}

#[tokio::test]
async fn label_selector_watch_sees_objects_enter_and_leave() {
    let server = start().await;
    let vas: Api<VolumeAttachment> = Api::all(server.client());
    let rv = server.resource_version().to_string();
    let mut w = vas
        .watch(&WatchParams::default().labels("node=n1"), &rv)
        .await
        .unwrap()
        .boxed();
    vas.create(&PostParams::default(), &va("a", "n2"))
        .await
        .unwrap();
    vas.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"node": "n1"}}})),
    )
    .await
    .unwrap();
    vas.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"extra": "1"}}})),
    )
    .await
    .unwrap();
    vas.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"node": "n3"}}})),
    )
    .await
    .unwrap();
    vas.create(&PostParams::default(), &va("b", "n1"))
        .await
        .unwrap();
    assert_eq!(
        next_n(&mut w, 4).await,
        vec!["ADDED a", "MODIFIED a", "DELETED a", "ADDED b"]
    );
}

#[tokio::test]
async fn a_slow_watcher_is_closed_and_writers_never_wait() {
    let config = apiserver::Config {
        watcher_buffer: 8,
        ..Default::default()
    };
    let server = start_with(config).await;
    let vas: Api<VolumeAttachment> = Api::all(server.client());
    let rv = server.resource_version().to_string();
    // Opened but never read: its buffers fill up.
    let stalled = vas.watch(&WatchParams::default(), &rv).await.unwrap();
    let mut healthy = vas
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    let total = 400;
    let reader = tokio::spawn(async move { next_n(&mut healthy, total).await.len() });
    // Big objects, so the stalled stream overflows the sockets' buffers and then its own.
    let padding = "x".repeat(64 * 1024);
    for i in 0..total {
        let mut v = va(&format!("v{i}"), "n1");
        v.metadata.annotations = Some([("padding".to_string(), padding.clone())].into());
        vas.create(&PostParams::default(), &v).await.unwrap();
    }
    assert_eq!(
        reader.await.unwrap(),
        total,
        "the healthy watcher sees every event"
    );
    // The stalled one was dropped by the server (only the healthy one had been left).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while server.watcher_count() > 0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(server.watcher_count(), 0);
    drop(stalled);
}

#[tokio::test]
async fn kube_runtime_watcher_lists_and_follows() {
    let server = start().await;
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    let p: Pod = serde_json::from_value(
        json!({"metadata": {"name": "p0"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}),
    )
    .unwrap();
    pods.create(&PostParams::default(), &p).await.unwrap();

    for streaming in [false, true] {
        let mut cfg = watcher::Config::default().page_size(1);
        if streaming {
            cfg = cfg.streaming_lists();
        }
        let mut stream = watcher(pods.clone(), cfg).boxed();
        let mut seen_init_done = false;
        let mut names = Vec::new();
        while !seen_init_done {
            match tokio::time::timeout(Duration::from_secs(10), stream.try_next())
                .await
                .unwrap()
                .unwrap()
                .unwrap()
            {
                watcher::Event::InitApply(p) => names.push(p.metadata.name.unwrap()),
                watcher::Event::InitDone => seen_init_done = true,
                _ => {}
            }
        }
        assert_eq!(names, vec!["p0"], "streaming={streaming}");
        let name = format!("p-{streaming}");
        let mut p2 = p.clone();
        p2.metadata.name = Some(name.clone());
        pods.create(&PostParams::default(), &p2).await.unwrap();
        loop {
            match tokio::time::timeout(Duration::from_secs(10), stream.try_next())
                .await
                .unwrap()
                .unwrap()
                .unwrap()
            {
                watcher::Event::Apply(p) if p.metadata.name.as_deref() == Some(name.as_str()) => {
                    break;
                }
                _ => {}
            }
        }
        pods.delete(&name, &DeleteParams::default()).await.unwrap();
    }
}

#[tokio::test]
async fn send_initial_events_needs_bookmarks() {
    let server = start().await;
    let (code, body) = common::raw(
        &server,
        "GET",
        "/apis/storage.k8s.io/v1/volumeattachments?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan",
        None,
        None,
    )
    .await;
    assert_eq!((code, body["reason"].as_str()), (422, Some("Invalid")));
}
