//! Benchmarks of the embedded API server over real HTTP on 127.0.0.1:
//! - list latency with 10,000 objects (raw HTTP and kube-rs typed),
//! - JSON merge-patch writes per second,
//! - watch delivery to 10 watchers under 1,000 writes/s (latency p50/p99, nothing dropped);
//!   this one is a timed scenario, printed as a table before criterion runs.
//!
//! Run: `cargo bench -p apiserver --bench apiserver`
#![allow(clippy::unwrap_used, clippy::expect_used)] // bench code: a failure aborts the run

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group};
use futures::StreamExt;
use http_body_util::BodyExt;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;

fn va(name: &str) -> VolumeAttachment {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"node": "node-1"}},
        "spec": {"attacher": "ebs.csi.aws.com", "nodeName": "node-1", "source": {"persistentVolumeName": format!("pv-{name}")}}
    }))
    .unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
}

async fn server_with(n: usize) -> apiserver::RunningApiServer {
    let server = apiserver::ApiServer::start(apiserver::Config::default())
        .await
        .unwrap();
    let vas: Api<VolumeAttachment> = Api::all(server.client());
    let mut tasks = Vec::new();
    for w in 0..8 {
        let vas = vas.clone();
        tasks.push(tokio::spawn(async move {
            for i in (w..n).step_by(8) {
                vas.create(&PostParams::default(), &va(&format!("va-{i:05}")))
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    server
}

fn bench_list(c: &mut Criterion) {
    let rt = runtime();
    let server = rt.block_on(server_with(10_000));
    let client = server.client();
    let mut g = c.benchmark_group("list_10000_volumeattachments");
    g.sample_size(20).measurement_time(Duration::from_secs(10));
    g.bench_function("raw_http", |b| {
        b.to_async(&rt).iter(|| async {
            let req = http::Request::get("/apis/storage.k8s.io/v1/volumeattachments")
                .body(kube::client::Body::empty())
                .unwrap();
            let resp = client.send(req).await.unwrap();
            let bytes = resp.into_body().collect().await.unwrap().to_bytes();
            assert!(bytes.len() > 10_000 * 200);
        })
    });
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    g.bench_function("kube_rs_typed", |b| {
        b.to_async(&rt).iter(|| async {
            let l = vas.list(&ListParams::default()).await.unwrap();
            assert_eq!(l.items.len(), 10_000);
        })
    });
    g.bench_function("kube_rs_paged_500", |b| {
        b.to_async(&rt).iter(|| async {
            let mut token: Option<String> = None;
            let mut n = 0;
            loop {
                let mut lp = ListParams::default().limit(500);
                if let Some(t) = &token {
                    lp = lp.continue_token(t);
                }
                let l = vas.list(&lp).await.unwrap();
                n += l.items.len();
                token = l.metadata.continue_;
                if token.is_none() {
                    break;
                }
            }
            assert_eq!(n, 10_000);
        })
    });
    g.finish();
    rt.block_on(server.shutdown()).unwrap();
}

fn bench_patch(c: &mut Criterion) {
    let rt = runtime();
    let server = rt.block_on(server_with(1));
    let vas: Api<VolumeAttachment> = Api::all(server.client());
    let mut g = c.benchmark_group("merge_patch");
    g.throughput(Throughput::Elements(1));
    g.sample_size(30).measurement_time(Duration::from_secs(8));
    let mut i = 0u64;
    g.bench_function("label_on_one_object", |b| {
        b.to_async(&rt).iter(|| {
            i += 1;
            let vas = vas.clone();
            let patch = json!({"metadata": {"labels": {"n": i.to_string()}}});
            async move {
                vas.patch("va-00000", &PatchParams::default(), &Patch::Merge(patch))
                    .await
                    .unwrap();
            }
        })
    });
    g.finish();
    rt.block_on(server.shutdown()).unwrap();
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx]
}

/// 10 watchers, writes paced at 1,000/s for 5 s: every watcher must see every write.
fn watch_fanout() {
    const WATCHERS: usize = 10;
    const RATE: u64 = 1000;
    const SECONDS: u64 = 5;
    let total = (RATE * SECONDS) as usize;
    let rt = runtime();
    rt.block_on(async {
        let server = apiserver::ApiServer::start(apiserver::Config::default()).await.unwrap();
        let vas: Api<VolumeAttachment> = Api::all(server.client());
        let origin = Arc::new(Instant::now());
        let rv = server.resource_version().to_string();
        let mut readers = Vec::new();
        for _ in 0..WATCHERS {
            let mut stream = vas.watch(&WatchParams::default(), &rv).await.unwrap().boxed();
            let origin = origin.clone();
            readers.push(tokio::spawn(async move {
                let mut lat = Vec::with_capacity(total);
                while lat.len() < total {
                    match tokio::time::timeout(Duration::from_secs(20), stream.next()).await {
                        Ok(Some(Ok(WatchEvent::Added(o)))) => {
                            let sent: u64 = o.metadata.annotations.unwrap()["sent-ns"].parse().unwrap();
                            let now = origin.elapsed().as_nanos() as u64;
                            lat.push(Duration::from_nanos(now.saturating_sub(sent)));
                        }
                        Ok(Some(Ok(_))) => {}
                        _ => break,
                    }
                }
                lat
            }));
        }
        // Four writers, each paced at RATE/4 per second.
        let started = Instant::now();
        let mut writers = Vec::new();
        for w in 0..4u64 {
            let vas = vas.clone();
            let origin = origin.clone();
            writers.push(tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_micros(4_000));
                for i in (w..RATE * SECONDS).step_by(4) {
                    tick.tick().await;
                    let mut v = va(&format!("w-{i:06}"));
                    let sent = origin.elapsed().as_nanos() as u64;
                    v.metadata.annotations = Some([("sent-ns".to_string(), sent.to_string())].into());
                    vas.create(&PostParams::default(), &v).await.unwrap();
                }
            }));
        }
        for w in writers {
            w.await.unwrap();
        }
        let write_secs = started.elapsed().as_secs_f64();
        let mut all = Vec::new();
        let mut min_seen = usize::MAX;
        for r in readers {
            let lat = r.await.unwrap();
            min_seen = min_seen.min(lat.len());
            all.extend(lat);
        }
        all.sort();
        println!("\nwatch fan-out: {WATCHERS} watchers, {total} creates paced at {RATE}/s");
        println!("| achieved writes/s | events delivered | fewest seen by one watcher | p50 | p99 | max |");
        println!("|---|---|---|---|---|---|");
        println!(
            "| {:.0} | {} / {} | {} / {} | {:.2?} | {:.2?} | {:.2?} |\n",
            total as f64 / write_secs,
            all.len(),
            total * WATCHERS,
            min_seen,
            total,
            percentile(&all, 0.50),
            percentile(&all, 0.99),
            all.last().copied().unwrap_or_default(),
        );
        assert_eq!(min_seen, total, "a watcher missed events");
        server.shutdown().await.unwrap();
    });
}

criterion_group!(benches, bench_list, bench_patch);

fn main() {
    // `cargo test --benches` runs benches in test mode: keep that quick.
    let test_mode = std::env::args().any(|a| a == "--test");
    if !test_mode {
        watch_fanout();
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
