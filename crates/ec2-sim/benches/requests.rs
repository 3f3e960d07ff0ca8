//! Request throughput of the simulator over real HTTP (hyper-util client, 127.0.0.1).
//!
//! `cargo bench -p ec2-sim --bench requests`
#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ec2_sim::{SimConfig, Simulator, Timing};
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

type HttpClient = Client<HttpConnector, Full<Bytes>>;

async fn call(client: &HttpClient, base: &str, body: String) -> Bytes {
    // Signed like every client must (part of the cost being measured).
    let host = base
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let mut req = http::Request::builder()
        .method("POST")
        .uri(base)
        .header("content-type", "application/x-www-form-urlencoded");
    for (k, v) in ec2_sim::sign_post(
        &host,
        body.as_bytes(),
        "us-east-1",
        ec2_sim::DEFAULT_ACCESS_KEY_ID,
        ec2_sim::DEFAULT_SECRET_ACCESS_KEY,
        std::time::SystemTime::now(),
    ) {
        req = req.header(k, v);
    }
    let req = req.body(Full::new(Bytes::from(body))).unwrap();
    let resp = client.request(req).await.unwrap();
    assert!(resp.status().is_success(), "{}", resp.status());
    resp.into_body().collect().await.unwrap().to_bytes()
}

fn volume_id(xml: &[u8]) -> String {
    let s = std::str::from_utf8(xml).unwrap();
    let start = s.find("<volumeId>").unwrap() + "<volumeId>".len();
    let end = start + s[start..].find('<').unwrap();
    s[start..end].to_string()
}

const CREATE: &str =
    "Action=CreateVolume&Version=2016-11-15&AvailabilityZone=us-east-1a&Size=1&VolumeType=gp3";

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (sim, client, base, first) = rt.block_on(async {
        let sim = Simulator::start(
            SimConfig {
                state_dir: dir.path().join("state"),
                timing: Timing::Instant,
                ..SimConfig::default()
            },
            "127.0.0.1:0".parse().unwrap(),
        )
        .await
        .unwrap();
        let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
        let base = format!("{}/", sim.endpoint());
        let mut first = String::new();
        for n in 0..1000 {
            let body = call(&client, &base, CREATE.to_string()).await;
            if n == 0 {
                first = volume_id(&body);
            }
        }
        (sim, client, base, first)
    });

    let mut g = c.benchmark_group("ec2-sim");
    g.throughput(Throughput::Elements(1));
    g.bench_function("DescribeAvailabilityZones", |b| {
        b.to_async(&rt).iter(|| {
            call(
                &client,
                &base,
                "Action=DescribeAvailabilityZones&Version=2016-11-15".into(),
            )
        })
    });
    g.bench_function("DescribeVolumes one ID of 1000", |b| {
        b.to_async(&rt).iter(|| {
            call(
                &client,
                &base,
                format!("Action=DescribeVolumes&Version=2016-11-15&VolumeId.1={first}"),
            )
        })
    });
    g.bench_function("DescribeVolumes tag filter over 1000", |b| {
        b.to_async(&rt).iter(|| {
            call(
                &client,
                &base,
                "Action=DescribeVolumes&Version=2016-11-15&Filter.1.Name=tag:CSIVolumeName&Filter.1.Value.1=pvc-1".into(),
            )
        })
    });
    g.sample_size(20);
    g.bench_function("DescribeVolumes all 1000", |b| {
        b.to_async(&rt).iter(|| {
            call(
                &client,
                &base,
                "Action=DescribeVolumes&Version=2016-11-15".into(),
            )
        })
    });
    g.bench_function("CreateVolume (1000+ volumes, fsync'd state)", |b| {
        b.to_async(&rt)
            .iter(|| call(&client, &base, CREATE.to_string()))
    });
    g.finish();
    rt.block_on(sim.shutdown()).unwrap();
}

criterion_group!(benches, bench);
criterion_main!(benches);
