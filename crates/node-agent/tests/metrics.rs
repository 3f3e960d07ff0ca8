//! The agent's /metrics and /healthz: volume stats from NodeGetVolumeStats per PVC, operation
//! durations and the plugin manager's count, with the kubelet's metric names.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Env, PATIENCE, http_get};
use test_support::net::free_port;
use volume_plugins::SkipAttachMode;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volume_stats_and_operation_metrics_use_the_kubelets_names() {
    if !common::can_mount() {
        return;
    }
    let mut env = Env::new().await;
    env.create_csidriver(false).await;
    let n = env.add_node("node-a").await;
    let port = free_port();
    let options = env.agent_options(n, SkipAttachMode::BypassAdc);
    env.start_agent_with_http(n, options, Some(format!("127.0.0.1:{port}")));
    env.create_bound_claim(n, "pv-1", "claim-1", false).await;
    env.create_pod("pod-1", "node-a", "claim-1").await;
    env.wait_ready("pod-1").await;

    let labels = r#"{namespace="default",persistentvolumeclaim="claim-1"}"#;
    let metrics = test_support::eventually("volume stats of claim-1", PATIENCE, || async {
        let body = http_get(port, "/metrics").await?;
        body.contains(&format!("kubelet_volume_stats_capacity_bytes{labels}"))
            .then_some(body)
    })
    .await;
    for name in [
        "kubelet_volume_stats_available_bytes",
        "kubelet_volume_stats_used_bytes",
        "kubelet_volume_stats_inodes",
        "kubelet_volume_stats_inodes_free",
        "kubelet_volume_stats_inodes_used",
    ] {
        assert!(
            metrics.contains(&format!("{name}{labels}")),
            "{name} missing:\n{metrics}"
        );
    }
    let capacity: f64 = metrics
        .lines()
        .find(|l| l.starts_with(&format!("kubelet_volume_stats_capacity_bytes{labels}")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert!(capacity > 0.0, "a real filesystem's size: {capacity}");
    assert!(
        metrics.lines().any(
            |l| l.starts_with("storage_operation_duration_seconds_count")
                && l.contains(r#"operation_name="volume_mount""#)
                && l.contains(r#"status="success""#)
        ),
        "a successful volume_mount is counted:\n{metrics}"
    );
    assert!(
        metrics.contains("plugin_manager_total_plugins"),
        "{metrics}"
    );
    assert!(
        http_get(port, "/healthz").await.is_some(),
        "/healthz answers 200"
    );

    // Gone with the pod.
    env.delete_pod_and_wait("pod-1").await;
    test_support::eventually("claim-1's stats removed", PATIENCE, || async {
        let body = http_get(port, "/metrics").await?;
        (!body.contains(&format!("kubelet_volume_stats_capacity_bytes{labels}"))).then_some(())
    })
    .await;
    env.shutdown().await;
}
