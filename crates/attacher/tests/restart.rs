//! Restarting the attacher in the middle of a batch: nothing lost (all attached), nothing
//! attached twice (each volume published on exactly one node, never two publishes of one volume
//! at once).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use csi_mock::{Call, Method, MockConfig};

const BATCH: usize = 50;
const DELAY: Duration = Duration::from_millis(20);

async fn attached_count(env: &Env) -> usize {
    env.vas()
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|va| va.status.as_ref().is_some_and(|s| s.attached))
        .count()
}

async fn wait_some_attached(env: &Env, n: usize) -> usize {
    eventually(&format!("at least {n} attached"), || async {
        let c = attached_count(env).await;
        (c >= n).then_some(c)
    })
    .await
}

/// Every volume is published on exactly our node, and publishes of one volume never overlap.
fn assert_published_once(env: &Env) -> BTreeMap<String, Vec<Call>> {
    let published = env.mock().published();
    assert_eq!(published.len(), BATCH, "{published:?}");
    for (volume, nodes) in &published {
        assert_eq!(nodes.len(), 1, "{volume} on {nodes:?}");
        assert!(nodes.contains(NODE_ID));
    }
    let mut by_volume: BTreeMap<String, Vec<Call>> = BTreeMap::new();
    for call in env.mock().calls_of(Method::ControllerPublishVolume) {
        by_volume
            .entry(call.volume_id.clone())
            .or_default()
            .push(call);
    }
    for (volume, calls) in &by_volume {
        for pair in calls.windows(2) {
            assert!(
                pair[1].at - pair[0].at >= DELAY,
                "{volume}: a second publish arrived while the first was in flight"
            );
        }
    }
    by_volume
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_restart_mid_batch_loses_nothing_and_repeats_nothing() {
    let mut env = Env::new(MockConfig {
        delay: DELAY,
        ..MockConfig::default()
    })
    .await;
    for i in 0..BATCH {
        env.create_pair(&format!("r{i}")).await;
    }
    let mut options = fast_options();
    options.workers = 2;
    env.start(options.clone()).await;
    let at_stop = wait_some_attached(&env, 10).await;
    env.stop().await;
    let after_stop = attached_count(&env).await;
    assert!(after_stop >= at_stop);
    assert!(
        after_stop < BATCH,
        "the restart must land mid-batch ({after_stop} done)"
    );

    env.start(options).await;
    for i in 0..BATCH {
        env.wait_attached(&format!("va-r{i}")).await;
    }
    env.stop().await;
    let by_volume = assert_published_once(&env);
    // A graceful stop finishes the keys in progress: no publish is ever repeated.
    assert!(by_volume.values().all(|c| c.len() == 1), "{by_volume:?}");
    let writes = env.controller_writes();
    assert_eq!(
        writes.len(),
        3 * BATCH,
        "two VolumeAttachment writes and one PV write each"
    );
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_binary_restarted_mid_batch_attaches_everything_once() {
    let env = Env::new(MockConfig {
        delay: DELAY,
        ..MockConfig::default()
    })
    .await;
    let kubeconfig = env.kubeconfig_file();
    let args = vec![
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--csi-address={}", env.mock().endpoint()),
        "--retry-interval-start=50ms".into(),
        "--worker-threads=4".into(),
        "--kube-api-qps=-1".into(),
    ];
    for i in 0..BATCH {
        env.create_pair(&format!("k{i}")).await;
    }
    let first = spawn_attacher(env.dir.path(), "first", &args);
    wait_some_attached(&env, 10).await;
    drop(first); // SIGKILL: no graceful anything
    let after_kill = attached_count(&env).await;
    assert!(
        after_kill < BATCH,
        "the kill must land mid-batch ({after_kill} done)"
    );

    let mut second = spawn_attacher(env.dir.path(), "second", &args);
    for i in 0..BATCH {
        env.wait_attached(&format!("va-k{i}")).await;
    }
    let by_volume = assert_published_once(&env);
    // Only publishes in flight at the kill may be repeated (idempotently), at most once each.
    let repeated = by_volume.values().filter(|c| c.len() > 1).count();
    assert!(
        repeated <= 4,
        "{repeated} volumes published again; at most one per worker"
    );
    assert!(by_volume.values().all(|c| c.len() <= 2));
    for i in 0..BATCH {
        let va = env.get_va(&format!("va-k{i}")).await.unwrap();
        assert_eq!(finalizers_of(&va), [FINALIZER]);
    }
    assert!(terminate(&mut second).await.success());
    env.shutdown().await;
}
