//! The decision of the migration design (docs/design/migration.md) wired into the controller, for
//! an in-tree `awsElasticBlockStore` PV and an inline one, by the node's CSINode and the
//! controller's `--feature-gates`. The migrated path's VolumeAttachments are fulfilled by the real
//! csi-attacher (which translates the in-tree PV itself) against csi-mock named `ebs.csi.aws.com`.
//! The in-tree path with a real EC2 (ec2-sim) is `crates/e2e/tests/adc_migration.rs`; here the
//! controller has no cloud.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use attach_detach::Options;
use common::*;
use serde_json::json;
use volume_plugins::MigratedPlugins;
use volume_plugins::SkipAttachMode::BypassAdc;

const EBS_DRIVER: &str = "ebs.csi.aws.com";
const PLUGIN: &str = "kubernetes.io/aws-ebs";

fn options(gates: &str) -> Options {
    Options {
        migrated: MigratedPlugins::from_feature_gates(gates).unwrap(),
        ..fast_options(BypassAdc)
    }
}

async fn ebs_pv(env: &Env, pv: &str, claim: &str, volume_id: &str) {
    env.create_bound_pv(
        pv,
        claim,
        "ReadWriteOnce",
        json!({"awsElasticBlockStore": {"volumeID": volume_id, "fsType": "ext4"}}),
    )
    .await;
}

fn inline(name: &str, volume_id: &str) -> serde_json::Value {
    json!({"name": name, "awsElasticBlockStore": {"volumeID": volume_id}})
}

#[tokio::test]
async fn node_and_controller_migrated_attach_through_the_csi_driver() {
    let mut env = Env::new().await;
    env.start_attacher(EBS_DRIVER).await;
    env.create_node("node-m", &[EBS_DRIVER], Some(PLUGIN)).await;
    ebs_pv(&env, "pv-ebs", "ebs", "aws://us-east-1a/vol-0123").await;
    env.create_pod_with(
        "pod-m",
        "node-m",
        vec![claim_volume("ebs"), inline("scratch", "vol-0456")],
    )
    .await;
    env.start_adc(options("CSIMigrationAWS=true"));

    let va = env.wait_va_attached("vol-0123", EBS_DRIVER, "node-m").await;
    assert_eq!(va.spec.attacher, EBS_DRIVER);
    assert_eq!(
        va.spec.source.persistent_volume_name.as_deref(),
        Some("pv-ebs")
    );
    let va = env.wait_va_attached("vol-0456", EBS_DRIVER, "node-m").await;
    assert_eq!(va.spec.source.persistent_volume_name, None);
    let spec = va
        .spec
        .source
        .inline_volume_spec
        .expect("an inline volume's translated spec");
    assert_eq!(
        spec.csi.map(|c| c.volume_handle).as_deref(),
        Some("vol-0456")
    );
    env.wait_volumes_attached(
        "node-m",
        &[
            &csi_name(EBS_DRIVER, "vol-0123"),
            &csi_name(EBS_DRIVER, "vol-0456"),
        ],
    )
    .await;
    env.wait_pod_event("pod-m", "SuccessfulAttachVolume", "\"pv-ebs\"")
        .await;
    env.wait_pod_event("pod-m", "SuccessfulAttachVolume", "\"scratch\"")
        .await;
    assert_eq!(env.va_creates(), 2);

    env.delete_pod("pod-m").await;
    env.wait_va_gone("vol-0123", EBS_DRIVER, "node-m").await;
    env.wait_va_gone("vol-0456", EBS_DRIVER, "node-m").await;
    env.wait_volumes_attached("node-m", &[]).await;
    env.shutdown().await;
}

#[tokio::test]
async fn in_tree_without_a_cloud_records_an_event_and_attaches_nothing() {
    let mut env = Env::new().await;
    // No CSINode at all, and a CSINode whose annotation lacks the plugin: both in-tree.
    env.create_node("node-old", &[], None).await;
    env.create_node("node-off", &[EBS_DRIVER], Some("kubernetes.io/gce-pd"))
        .await;
    ebs_pv(&env, "pv-old", "old", "vol-0aaa").await;
    ebs_pv(&env, "pv-off", "off", "vol-0bbb").await;
    env.create_pod("pod-old", "node-old", "old").await;
    env.create_pod_with(
        "pod-off",
        "node-off",
        vec![claim_volume("off"), inline("scratch", "vol-0ccc")],
    )
    .await;
    env.start_adc(options("CSIMigrationAWS=true"));

    let message = env
        .wait_pod_event("pod-old", "FailedAttachVolume", "no cloud configured")
        .await;
    assert!(
        message.starts_with("AttachVolume.Attach failed for volume \"pv-old\" : "),
        "{message}"
    );
    assert!(message.contains("--cloud-provider=aws"), "{message}");
    env.wait_pod_event(
        "pod-off",
        "FailedAttachVolume",
        "volume \"pv-off\" : the in-tree",
    )
    .await;
    env.wait_pod_event(
        "pod-off",
        "FailedAttachVolume",
        "volume \"scratch\" : the in-tree",
    )
    .await;
    stays("nothing attached", Duration::from_millis(500), || async {
        env.vas().await.is_empty()
            && env.volumes_attached("node-old").await.is_empty()
            && env.volumes_attached("node-off").await.is_empty()
    })
    .await;
    assert_eq!(env.adc_requests("create", "volumeattachments").len(), 0);
    env.shutdown().await;
}

#[tokio::test]
async fn a_node_migrated_ahead_of_the_controller_is_refused() {
    let mut env = Env::new().await;
    env.create_node("node-new", &[EBS_DRIVER], Some(PLUGIN))
        .await;
    ebs_pv(&env, "pv-new", "new", "vol-0ddd").await;
    env.create_pod_with(
        "pod-new",
        "node-new",
        vec![claim_volume("new"), inline("scratch", "vol-0eee")],
    )
    .await;
    env.start_adc(options(""));
    for volume in ["pv-new", "scratch"] {
        let message = env
            .wait_pod_event(
                "pod-new",
                "FailedAttachVolume",
                &format!("volume \"{volume}\""),
            )
            .await;
        assert!(message.contains("CSIMigrationAWS=true"), "{message}");
        assert!(message.contains(EBS_DRIVER), "{message}");
    }
    stays("nothing attached", Duration::from_millis(500), || async {
        env.vas().await.is_empty() && env.volumes_attached("node-new").await.is_empty()
    })
    .await;
    assert_eq!(env.adc_requests("create", "volumeattachments").len(), 0);
    let refusals = env
        .pod_events("pod-new")
        .await
        .into_iter()
        .filter(|(r, _)| r == "FailedAttachVolume")
        .count();
    assert_eq!(refusals, 2, "one Event per volume, not one per pass");
    env.shutdown().await;
}
