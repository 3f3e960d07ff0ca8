//! One EC2 call through the real aws-sdk-ec2 (serialization, signing, HTTP, XML parsing)
//! against ec2-sim, and against moto_server for comparison when it is installed.
//!
//! `cargo bench -p ec2-conformance --bench sdk_roundtrip`
#![allow(clippy::unwrap_used, clippy::expect_used)]

use criterion::{Criterion, criterion_group, criterion_main};
use ec2_conformance::{MotoServer, SimServer, client, find_moto_server};

async fn fill(c: &aws_sdk_ec2::Client, volumes: usize) {
    for _ in 0..volumes {
        c.create_volume()
            .availability_zone("us-east-1a")
            .size(1)
            .send()
            .await
            .unwrap();
    }
}

fn bench(crit: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let sim = SimServer::start_with(|c| c.timing = ec2_sim::Timing::Instant).unwrap();
    let sim_client = client(sim.endpoint());
    rt.block_on(fill(&sim_client, 50));
    let moto = if find_moto_server().is_some() {
        let moto = rt.block_on(MotoServer::start()).unwrap();
        let moto_client = client(moto.endpoint());
        rt.block_on(fill(&moto_client, 50));
        Some((moto, moto_client))
    } else {
        eprintln!("moto_server not found: benchmarking ec2-sim only");
        None
    };

    let mut group = crit.benchmark_group("sdk_roundtrip");
    let mut targets = vec![("ec2-sim", sim_client.clone())];
    if let Some((_, moto_client)) = &moto {
        targets.push(("moto", moto_client.clone()));
    }
    for (name, c) in &targets {
        group.bench_function(format!("{name}/DescribeVolumes(50 volumes)"), |b| {
            b.to_async(&rt).iter(|| async {
                let out = c.describe_volumes().send().await.unwrap();
                assert_eq!(out.volumes().len(), 50);
            });
        });
        group.bench_function(format!("{name}/DescribeVolumes(one id)"), |b| {
            let id = rt.block_on(async {
                let out = c.describe_volumes().send().await.unwrap();
                out.volumes()[0].volume_id().unwrap().to_string()
            });
            b.to_async(&rt).iter(|| async {
                c.describe_volumes().volume_ids(&id).send().await.unwrap();
            });
        });
        group.bench_function(format!("{name}/CreateVolume+DeleteVolume"), |b| {
            b.to_async(&rt).iter(|| async {
                let out = c
                    .create_volume()
                    .availability_zone("us-east-1a")
                    .size(1)
                    .send()
                    .await
                    .unwrap();
                c.delete_volume()
                    .volume_id(out.volume_id().unwrap())
                    .send()
                    .await
                    .unwrap();
            });
        });
    }
    group.finish();
    drop(moto);
    drop(sim);
}

criterion_group!(benches, bench);
criterion_main!(benches);
