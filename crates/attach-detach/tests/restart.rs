//! A controller stopped in the middle of attaching 50 volumes and started again attaches
//! nothing twice (50 VolumeAttachment creates in the audit trail, not one refused as
//! existing) and leaks nothing (every VolumeAttachment goes once the pods do).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use volume_plugins::SkipAttachMode::BypassAdc;

const PODS: usize = 50;
const NODES: [&str; 2] = ["node-a", "node-b"];

#[tokio::test]
async fn a_restart_mid_reconcile_attaches_nothing_twice_and_leaks_nothing() {
    let mut env = Env::new().await;
    // A slow driver, so the first controller stops with attaches in flight.
    env.start_attacher_with_delay(DRIVER, Duration::from_millis(300))
        .await;
    for node in NODES {
        env.create_node(node, &[DRIVER], None).await;
    }
    for i in 0..PODS {
        env.create_csi_pv(
            &format!("pv-{i}"),
            &format!("c-{i}"),
            DRIVER,
            &format!("h-{i}"),
            "ReadWriteOnce",
        )
        .await;
    }
    env.start_adc(fast_options(BypassAdc));
    for i in 0..PODS / 2 {
        env.create_pod(&format!("pod-{i}"), NODES[i % 2], &format!("c-{i}"))
            .await;
    }
    eventually(
        "the first controller has created some VolumeAttachments",
        || async { (env.va_creates() >= 5).then_some(()) },
    )
    .await;
    env.stop_adc().await;
    let created = env.va_creates();
    let attached = env
        .vas()
        .await
        .iter()
        .filter(|va| va.status.as_ref().is_some_and(|s| s.attached))
        .count();
    assert!(
        created <= PODS / 2 && attached < created,
        "stopped mid-reconcile: {created} created, {attached} attached"
    );
    for i in PODS / 2..PODS {
        env.create_pod(&format!("pod-{i}"), NODES[i % 2], &format!("c-{i}"))
            .await;
    }

    env.start_adc(fast_options(BypassAdc));
    for (n, node) in NODES.iter().enumerate() {
        let names: Vec<String> = (0..PODS)
            .filter(|i| i % 2 == n)
            .map(|i| csi_name(DRIVER, &format!("h-{i}")))
            .collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        env.wait_volumes_attached(node, &names).await;
    }
    for i in 0..PODS {
        env.wait_va_attached(&format!("h-{i}"), DRIVER, NODES[i % 2])
            .await;
    }
    assert_eq!(
        env.va_creates(),
        PODS,
        "one VolumeAttachment create per volume"
    );
    assert_eq!(
        env.adc_requests("create", "volumeattachments").len(),
        PODS,
        "no create refused as already existing either"
    );
    assert_eq!(env.vas().await.len(), PODS);

    for i in 0..PODS {
        env.delete_pod(&format!("pod-{i}")).await;
    }
    eventually("every VolumeAttachment deleted", || async {
        env.vas().await.is_empty().then_some(())
    })
    .await;
    for node in NODES {
        env.wait_volumes_attached(node, &[]).await;
    }
    env.shutdown().await;
}
