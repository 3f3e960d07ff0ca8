//! Fault injection, call counting, /_sim endpoints, /metrics and /healthz.

mod common;

use std::time::{Duration, Instant};

use common::start;
use ec2_sim::{Faults, SimConfig, Throttle, Timing};

#[tokio::test]
async fn call_counts_via_api_and_endpoint() {
    let s = start(Timing::Instant).await;
    s.ec2.ok("DescribeVolumes", &[]).await;
    s.ec2.ok("DescribeVolumes", &[]).await;
    s.ec2
        .fails(
            "DescribeVolumes",
            &[("MaxResults", "1")],
            400,
            "InvalidParameterValue",
        )
        .await;
    s.ec2.ok("DescribeAvailabilityZones", &[]).await;
    let counts = s.sim.call_counts();
    assert_eq!(counts.get("DescribeVolumes"), Some(&3), "errors count too");
    assert_eq!(counts.get("DescribeAvailabilityZones"), Some(&1));
    let (status, body) = s.ec2.raw("GET", "/_sim/calls", "").await;
    assert_eq!(status, 200);
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["DescribeVolumes"], 3);
    let (status, _) = s.ec2.raw("POST", "/_sim/calls/reset", "").await;
    assert_eq!(status, 200);
    assert!(s.sim.call_counts().is_empty());

    let (status, metrics) = s.ec2.raw("GET", "/metrics", "").await;
    assert_eq!(status, 200);
    assert!(
        metrics.contains(r#"ec2sim_calls_total{action="DescribeVolumes",code="OK"} 2"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"code="InvalidParameterValue"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains("ec2sim_request_duration_seconds_bucket"),
        "{metrics}"
    );
    let (status, body) = s.ec2.raw("GET", "/healthz", "").await;
    assert_eq!((status, body.trim()), (200, "ok"));
}

#[tokio::test]
async fn throttle_next_n_then_recover() {
    let s = start(Timing::Instant).await;
    let (status, body) = s
        .ec2
        .raw(
            "PUT",
            "/_sim/faults",
            r#"{"throttle":[{"action":"DescribeVolumes","next":2}]}"#,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    s.ec2
        .fails("DescribeVolumes", &[], 503, "RequestLimitExceeded")
        .await;
    // Other actions are not throttled.
    s.ec2.ok("DescribeAvailabilityZones", &[]).await;
    s.ec2
        .fails("DescribeVolumes", &[], 503, "RequestLimitExceeded")
        .await;
    s.ec2.ok("DescribeVolumes", &[]).await;
    let (_, body) = s.ec2.raw("GET", "/_sim/faults", "").await;
    let f: Faults = serde_json::from_str(&body).unwrap();
    assert_eq!(f.throttle[0].next, 0, "the budget counted down");
    assert_eq!(s.sim.call_counts().get("DescribeVolumes"), Some(&3));
    // Bad fault JSON is refused with the field named, and the old faults stay.
    let (status, body) = s
        .ec2
        .raw("PUT", "/_sim/faults", r#"{"throttle":[{"rate":7}]}"#)
        .await;
    assert_eq!(status, 400);
    assert!(body.contains("faults.throttle[0].rate"), "{body}");
}

#[tokio::test]
async fn throttle_rate_all_actions() {
    let s = common::start_with(SimConfig {
        timing: Timing::Instant,
        faults: Faults {
            throttle: vec![Throttle {
                action: None,
                rate: 1.0,
                next: 0,
            }],
            ..Faults::default()
        },
        ..SimConfig::default()
    })
    .await;
    for action in ["DescribeVolumes", "CreateVolume", "DescribeInstances"] {
        s.ec2.fails(action, &[], 503, "RequestLimitExceeded").await;
    }
    s.sim.set_faults(Faults::default());
    s.ec2.ok("DescribeVolumes", &[]).await;
}

#[tokio::test]
async fn added_latency_per_action() {
    let s = start(Timing::Instant).await;
    s.sim.set_faults(Faults {
        latency_ms: [("DescribeVolumes".to_string(), 300)].into_iter().collect(),
        ..Faults::default()
    });
    let t = Instant::now();
    s.ec2.ok("DescribeVolumes", &[]).await;
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
    let t = Instant::now();
    s.ec2.ok("DescribeAvailabilityZones", &[]).await;
    assert!(
        t.elapsed() < Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
}

#[tokio::test]
async fn stuck_attaching_until_cleared() {
    let s = start(Timing::Fast).await;
    let i = s.ec2.run_instance("us-east-1a").await;
    let v = s.ec2.create_volume("us-east-1a", "1", &[]).await;
    s.ec2.wait_status(&v, "available").await;
    s.sim.set_faults(Faults {
        stuck_attaching: vec![v.clone()],
        ..Faults::default()
    });
    s.ec2
        .ok(
            "AttachVolume",
            &[
                ("VolumeId", &v),
                ("InstanceId", &i),
                ("Device", "/dev/xvdba"),
            ],
        )
        .await;
    // Well past the Fast attach time it is still attaching.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        s.ec2.volume(&v).await.at("attachmentSet/item/status"),
        "attaching"
    );
    s.sim.set_faults(Faults::default());
    s.ec2.wait_attached(&v).await;
}

#[tokio::test]
async fn detach_that_never_finishes_unless_forced() {
    let s = start(Timing::Fast).await;
    let i = s.ec2.run_instance("us-east-1a").await;
    let v = s.ec2.create_volume("us-east-1a", "1", &[]).await;
    s.ec2.wait_status(&v, "available").await;
    s.ec2
        .ok(
            "AttachVolume",
            &[
                ("VolumeId", &v),
                ("InstanceId", &i),
                ("Device", "/dev/xvdba"),
            ],
        )
        .await;
    s.ec2.wait_attached(&v).await;
    let (status, _) = s
        .ec2
        .raw("PUT", "/_sim/faults", r#"{"stuck_detaching_all":true}"#)
        .await;
    assert_eq!(status, 200);
    s.ec2.ok("DetachVolume", &[("VolumeId", &v)]).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        s.ec2.volume(&v).await.at("attachmentSet/item/status"),
        "detaching"
    );
    // A repeated detach reports the detach in progress; Force finishes it.
    let x = s.ec2.ok("DetachVolume", &[("VolumeId", &v)]).await;
    assert_eq!(x.get("status"), "detaching");
    s.ec2
        .ok("DetachVolume", &[("VolumeId", &v), ("Force", "true")])
        .await;
    s.ec2.wait_status(&v, "available").await;
}
