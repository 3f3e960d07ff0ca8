//! Fault injection seen through the SDK: throttling with retries off and on, latency, a stuck
//! attach, a detach that never finishes; and the per-action call counts.

use std::time::{Duration, Instant};

use aws_sdk_ec2::error::SdkError;
use aws_sdk_ec2::types::{VolumeAttachmentState, VolumeState};
use ec2_conformance::{ClientOptions, Retries, client_with, wait};
use ec2_sim::{Faults, Throttle};

use crate::common::*;

fn throttle(action: &str, next: u64, rate: f64) -> Faults {
    Faults {
        throttle: vec![Throttle {
            action: Some(action.to_string()),
            rate,
            next,
        }],
        ..Faults::default()
    }
}

#[tokio::test]
async fn throttling_is_request_limit_exceeded_without_retries() {
    let t = sim();
    t.sim()
        .set_faults(throttle("DescribeVolumes", 2, 0.0))
        .await
        .unwrap();
    for _ in 0..2 {
        let result = t.client.describe_volumes().send().await;
        let failure = ec2_conformance::expect_code(result).unwrap();
        assert_eq!(failure.code.as_deref(), Some("RequestLimitExceeded"));
        assert_eq!(failure.status, Some(503));
    }
    // Other actions were never throttled; the budget is spent now.
    t.client.describe_availability_zones().send().await.unwrap();
    t.client.describe_volumes().send().await.unwrap();
    let calls = t.sim().call_counts().await.unwrap();
    assert_eq!(calls.get("DescribeVolumes"), Some(&3));
    assert_eq!(calls.get("DescribeAvailabilityZones"), Some(&1));
}

#[tokio::test]
async fn the_sdk_retries_through_throttling() {
    let t = sim();
    let retrying = client_with(
        &t.endpoint,
        &ClientOptions {
            retries: Retries::Standard { max_attempts: 4 },
            ..ClientOptions::default()
        },
    );
    t.sim()
        .set_faults(throttle("CreateVolume", 3, 0.0))
        .await
        .unwrap();
    let out = retrying
        .create_volume()
        .availability_zone(ZONE_A)
        .size(4)
        .client_token("retried-create")
        .send()
        .await
        .unwrap();
    assert!(out.volume_id().is_some());
    let calls = t.sim().call_counts().await.unwrap();
    // Three throttled attempts and the one that went through.
    assert_eq!(calls.get("CreateVolume"), Some(&4));
    let all = t.client.describe_volumes().send().await.unwrap();
    assert_eq!(
        all.volumes().len(),
        1,
        "retries must not create extra volumes"
    );

    // Throttled every time: the SDK gives up after max_attempts with the EC2 code.
    t.sim()
        .set_faults(throttle("DescribeVolumes", 0, 1.0))
        .await
        .unwrap();
    let result = retrying.describe_volumes().send().await;
    assert_eq!(code_of(result), "RequestLimitExceeded");
    let calls = t.sim().call_counts().await.unwrap();
    assert_eq!(calls.get("DescribeVolumes"), Some(&(1 + 4)));
}

#[tokio::test]
async fn latency_is_added_and_client_timeouts_fire() {
    let t = sim();
    let mut faults = Faults::default();
    faults.latency_ms.insert("DescribeVolumes".into(), 400);
    t.sim().set_faults(faults).await.unwrap();

    let started = Instant::now();
    t.client.describe_volumes().send().await.unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "{:?}",
        started.elapsed()
    );
    // Other actions are not delayed (no lower bound to assert; they simply succeed).
    t.client.describe_availability_zones().send().await.unwrap();

    let impatient = client_with(
        &t.endpoint,
        &ClientOptions {
            operation_timeout: Duration::from_millis(100),
            ..ClientOptions::default()
        },
    );
    let result = impatient.describe_volumes().send().await;
    assert!(
        matches!(result, Err(SdkError::TimeoutError(_))),
        "expected the SDK's operation timeout, got {result:?}"
    );
}

#[tokio::test]
async fn stuck_attaching_until_the_fault_is_cleared() {
    let t = sim();
    let c = &t.client;
    let vol = available_volume(c, ZONE_A, 4).await;
    let inst = instance(c, ZONE_A).await;
    t.sim()
        .set_faults(Faults {
            stuck_attaching: vec![vol.clone()],
            ..Faults::default()
        })
        .await
        .unwrap();
    c.attach_volume()
        .volume_id(&vol)
        .instance_id(&inst)
        .device("/dev/xvdba")
        .send()
        .await
        .unwrap();
    // Far longer than the fast attach time: still attaching.
    let stuck = wait::attachment_state(
        c,
        &vol,
        &inst,
        VolumeAttachmentState::Attached,
        Duration::from_millis(500),
    )
    .await;
    assert!(stuck.is_err(), "attached despite the fault");
    let v = wait::describe_volume(c, &vol).await.unwrap().unwrap();
    assert_eq!(
        v.attachments()[0].state(),
        Some(&VolumeAttachmentState::Attaching)
    );
    t.sim().set_faults(Faults::default()).await.unwrap();
    wait::attachment_state(c, &vol, &inst, VolumeAttachmentState::Attached, WAIT)
        .await
        .unwrap();

    // A stuck attach can be abandoned by detaching it.
    let other = available_volume(c, ZONE_A, 4).await;
    t.sim()
        .set_faults(Faults {
            stuck_attaching_all: true,
            ..Faults::default()
        })
        .await
        .unwrap();
    c.attach_volume()
        .volume_id(&other)
        .instance_id(&inst)
        .device("/dev/xvdbb")
        .send()
        .await
        .unwrap();
    c.detach_volume()
        .volume_id(&other)
        .instance_id(&inst)
        .send()
        .await
        .unwrap();
    let (v, _) = wait::detached(c, &other, &inst, WAIT).await.unwrap();
    assert_eq!(v.unwrap().state(), Some(&VolumeState::Available));
}

#[tokio::test]
async fn detach_never_finishes_unless_forced() {
    let t = sim();
    let c = &t.client;
    let vol = available_volume(c, ZONE_A, 4).await;
    let inst = instance(c, ZONE_A).await;
    c.attach_volume()
        .volume_id(&vol)
        .instance_id(&inst)
        .device("/dev/xvdba")
        .send()
        .await
        .unwrap();
    wait::attachment_state(c, &vol, &inst, VolumeAttachmentState::Attached, WAIT)
        .await
        .unwrap();
    t.sim()
        .set_faults(Faults {
            stuck_detaching_all: true,
            ..Faults::default()
        })
        .await
        .unwrap();
    c.detach_volume()
        .volume_id(&vol)
        .instance_id(&inst)
        .send()
        .await
        .unwrap();
    let stuck = wait::detached(c, &vol, &inst, Duration::from_millis(500)).await;
    assert!(stuck.is_err(), "detached despite the fault");
    // Asking again reports the detach in progress.
    let again = c
        .detach_volume()
        .volume_id(&vol)
        .instance_id(&inst)
        .send()
        .await
        .unwrap();
    assert_eq!(again.state(), Some(&VolumeAttachmentState::Detaching));
    let v = wait::describe_volume(c, &vol).await.unwrap().unwrap();
    assert_eq!(v.state(), Some(&VolumeState::InUse));
    assert_eq!(
        v.attachments()[0].state(),
        Some(&VolumeAttachmentState::Detaching)
    );
    // Deleting is still refused while the detach hangs.
    assert_eq!(
        code_of(c.delete_volume().volume_id(&vol).send().await),
        "VolumeInUse"
    );
    // Force gets it out, fault or not.
    c.detach_volume()
        .volume_id(&vol)
        .instance_id(&inst)
        .force(true)
        .send()
        .await
        .unwrap();
    let (v, _) = wait::detached(c, &vol, &inst, WAIT).await.unwrap();
    assert_eq!(v.unwrap().state(), Some(&VolumeState::Available));
}

#[tokio::test]
async fn call_counts_per_action() {
    let t = sim();
    let c = &t.client;
    assert!(
        t.sim()
            .call_counts()
            .await
            .unwrap()
            .values()
            .all(|n| *n == 0)
    );
    let vol = available_volume(c, ZONE_A, 4).await;
    let before = t.sim().call_counts().await.unwrap();
    let polls = before.get("DescribeVolumes").copied().unwrap_or(0);
    assert!(polls >= 1);
    assert_eq!(before.get("CreateVolume"), Some(&1));
    // A failed call counts too.
    let _ = c
        .delete_volume()
        .volume_id("vol-0123456789abcdef0")
        .send()
        .await;
    c.delete_volume().volume_id(&vol).send().await.unwrap();
    c.describe_availability_zones().send().await.unwrap();
    let after = t.sim().call_counts().await.unwrap();
    assert_eq!(after.get("DeleteVolume"), Some(&2));
    assert_eq!(after.get("DescribeAvailabilityZones"), Some(&1));
    assert_eq!(after.get("DescribeVolumes"), Some(&polls));
    assert_eq!(after.get("AttachVolume").copied().unwrap_or(0), 0);
}

#[tokio::test]
async fn sim_http_endpoints_drive_faults_and_count_calls() {
    let t = sim();
    let c = &t.client;
    let throttle_once = r#"{"throttle": [{"action": "DescribeVolumes", "next": 1}]}"#;
    // The endpoints take the EC2 endpoint's signature: unsigned (401 AuthFailure) or signed
    // with the wrong secret (403 SignatureDoesNotMatch), a request is refused like an EC2 call
    // and changes nothing.
    let (status, body) = http(&t.endpoint, "PUT", "/_sim/faults", throttle_once).await;
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("<Code>AuthFailure</Code>"), "{body}");
    let (status, body) = http(&t.endpoint, "GET", "/_sim/calls", "").await;
    assert_eq!(status, 401, "{body}");
    let host = t.endpoint.trim_start_matches("http://");
    let (key, _) = ec2_conformance::client::CREDENTIALS;
    let forged = ec2_sim::sign_request(
        "PUT",
        "/_sim/faults",
        "",
        host,
        throttle_once.as_bytes(),
        ec2_conformance::REGION,
        key,
        "not-the-secret",
        std::time::SystemTime::now(),
    );
    let (status, body) =
        http_with_headers(&t.endpoint, "PUT", "/_sim/faults", throttle_once, &forged).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body.contains("<Code>SignatureDoesNotMatch</Code>"),
        "{body}"
    );
    c.describe_volumes().send().await.unwrap(); // not throttled: nothing was set
    // Faults set over HTTP, signed, reach the SDK like the in-process ones.
    let (status, _) = http_signed(&t.endpoint, "PUT", "/_sim/faults", throttle_once).await;
    assert_eq!(status, 200);
    assert_eq!(
        code_of(c.describe_volumes().send().await),
        "RequestLimitExceeded"
    );
    c.describe_volumes().send().await.unwrap();
    // A bad document is refused naming the field, and changes nothing.
    let (status, body) = http_signed(
        &t.endpoint,
        "PUT",
        "/_sim/faults",
        r#"{"throttle": [{"rate": 7}]}"#,
    )
    .await;
    assert_eq!(status, 400);
    assert!(body.contains("faults.throttle[0].rate"), "{body}");
    c.describe_volumes().send().await.unwrap();

    let (status, calls) = http_signed(&t.endpoint, "GET", "/_sim/calls", "").await;
    assert_eq!(status, 200);
    assert!(calls.contains(r#""DescribeVolumes":4"#), "{calls}");
    let (status, metrics) = http(&t.endpoint, "GET", "/metrics", "").await;
    assert_eq!(status, 200);
    let line = |code: &str| {
        metrics
            .lines()
            .find(|l| {
                l.starts_with("ec2sim_calls_total{")
                    && l.contains(r#"action="DescribeVolumes""#)
                    && l.contains(&format!(r#"code="{code}""#))
            })
            .unwrap_or_else(|| panic!("no DescribeVolumes/{code} counter in\n{metrics}"))
            .to_string()
    };
    assert!(line("RequestLimitExceeded").ends_with(" 1"), "{metrics}");
    assert!(line("OK").ends_with(" 3"), "{metrics}");
}
