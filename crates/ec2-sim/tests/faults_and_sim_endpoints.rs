//! Fault injection, call counting, /_sim endpoints (and their authentication), /metrics and
//! /healthz.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{Ec2, Reply, parse, start};
use ec2_sim::{Faults, SimConfig, Throttle, Timing};

/// An EC2 error document with this status and code (and a request ID), as the EC2 endpoint
/// answers a refused signature.
fn assert_refused(status: u16, body: &str, want_status: u16, want_code: &str) {
    let r = Reply {
        status,
        body: body.to_string(),
        xml: parse(body),
    };
    assert_eq!(
        (r.status, r.code().as_str()),
        (want_status, want_code),
        "{body}"
    );
    assert_eq!(r.xml.name, "Response", "{body}");
    assert!(!r.xml.get("RequestID").is_empty(), "{body}");
}

/// Faults that differ from the default in a way every answer shows.
fn marked_faults() -> Faults {
    Faults {
        stuck_detaching_all: true,
        latency_ms: [("DescribeSnapshots".to_string(), 1)].into_iter().collect(),
        ..Faults::default()
    }
}

#[tokio::test]
async fn sim_endpoints_refuse_unsigned_requests_and_change_nothing() {
    let s = start(Timing::Instant).await;
    s.sim.set_faults(marked_faults());
    s.ec2.ok("DescribeVolumes", &[]).await;
    let anonymous = Ec2::with_credentials(s.sim.local_addr(), None);

    // Reading the faults: refused, and the answer does not show them.
    let (status, body) = anonymous.raw("GET", "/_sim/faults", "").await;
    assert_refused(status, &body, 401, "AuthFailure");
    assert!(body.contains("AWS was not able to validate the provided access credentials"));
    assert!(!body.contains("stuck_detaching_all"), "{body}");
    // Replacing them: refused, and they stay as they were.
    let (status, body) = anonymous
        .raw("PUT", "/_sim/faults", r#"{"throttle":[{"rate":1.0}]}"#)
        .await;
    assert_refused(status, &body, 401, "AuthFailure");
    assert_eq!(s.sim.faults(), marked_faults());
    s.ec2.ok("DescribeVolumes", &[]).await;
    // The counts can neither be read nor reset, nor the attachment history read.
    for (method, path) in [
        ("GET", "/_sim/calls"),
        ("POST", "/_sim/calls/reset"),
        ("GET", "/_sim/attachments"),
    ] {
        let (status, body) = anonymous.raw(method, path, "").await;
        assert_refused(status, &body, 401, "AuthFailure");
        assert!(!body.contains("DescribeVolumes"), "{method} {path}: {body}");
    }
    assert_eq!(s.sim.call_counts().get("DescribeVolumes"), Some(&2));
    // A header that is not SigV4 (a bearer token, say) is not a way in either.
    let (status, body) = anonymous
        .send(
            "PUT",
            "/_sim/faults",
            "{}",
            &[("authorization", "Bearer secret".to_string())],
        )
        .await;
    assert_refused(status, &body, 400, "IncompleteSignature");
    assert_eq!(s.sim.faults(), marked_faults());
    // /metrics and /healthz stay open: they only read, and change nothing.
    assert_eq!(anonymous.raw("GET", "/metrics", "").await.0, 200);
    assert_eq!(anonymous.raw("GET", "/healthz", "").await.0, 200);
}

#[tokio::test]
async fn sim_endpoints_refuse_wrong_signatures_and_accept_right_ones() {
    let s = start(Timing::Instant).await;
    s.sim.set_faults(marked_faults());
    let addr = s.sim.local_addr();
    let clear = r#"{}"#;

    let wrong_secret = Ec2::with_credentials(addr, Some(("AKIDTEST", "not-the-secret")));
    for (method, path, body) in [
        ("GET", "/_sim/faults", ""),
        ("PUT", "/_sim/faults", clear),
        ("POST", "/_sim/calls/reset", ""),
    ] {
        let (status, answer) = wrong_secret.raw(method, path, body).await;
        assert_refused(status, &answer, 403, "SignatureDoesNotMatch");
    }
    let unknown = Ec2::with_credentials(addr, Some(("AKIDSTRANGER", "secret")));
    let (status, answer) = unknown.raw("PUT", "/_sim/faults", clear).await;
    assert_refused(status, &answer, 401, "AuthFailure");
    // A valid signature of one request does not carry another: another body, path or method.
    let harmless = s
        .ec2
        .signature("PUT", "/_sim/faults", r#"{"stuck_detaching_all":true}"#);
    let (status, answer) = s.ec2.send("PUT", "/_sim/faults", clear, &harmless).await;
    assert_refused(status, &answer, 403, "SignatureDoesNotMatch");
    let read_calls = s.ec2.signature("GET", "/_sim/calls", "");
    let (status, answer) = s
        .ec2
        .send("POST", "/_sim/calls/reset", "", &read_calls)
        .await;
    assert_refused(status, &answer, 403, "SignatureDoesNotMatch");
    let read_faults = s.ec2.signature("GET", "/_sim/faults", "");
    let (status, answer) = s.ec2.send("PUT", "/_sim/faults", "", &read_faults).await;
    assert_refused(status, &answer, 403, "SignatureDoesNotMatch");
    // Another region's scope, as on the EC2 endpoint.
    let mut elsewhere = Ec2::new(addr);
    elsewhere.region = "eu-west-1".into();
    let (status, answer) = elsewhere.raw("PUT", "/_sim/faults", clear).await;
    assert_refused(status, &answer, 403, "SignatureDoesNotMatch");
    assert_eq!(
        s.sim.faults(),
        marked_faults(),
        "no refused request changed them"
    );

    // Signed right, each endpoint answers, and PUT replaces the faults.
    let (status, answer) = s.ec2.raw("GET", "/_sim/faults", "").await;
    assert_eq!(status, 200, "{answer}");
    let shown: Faults = serde_json::from_str(&answer).unwrap();
    assert_eq!(shown, marked_faults());
    let (status, answer) = s.ec2.raw("PUT", "/_sim/faults", clear).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(s.sim.faults(), Faults::default());
    // The signature of the very same request, sent again, is still good (like AWS, within
    // the 15 minutes); and the simulator signs for its own clients too.
    let (status, _) = s.ec2.send("GET", "/_sim/faults", "", &read_faults).await;
    assert_eq!(status, 200);
    let own = s.sim.sign_request("GET", "/_sim/attachments", b"");
    let (status, answer) = s.ec2.send("GET", "/_sim/attachments", "", &own).await;
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains("doubleAttachments"), "{answer}");
}

/// `curl --aws-sigv4 "aws:amz:REGION:ec2" --user KEY:SECRET` (documented in docs/ec2-sim.md)
/// signs requests the simulator accepts; without it, or with the wrong secret, curl is refused.
#[tokio::test]
async fn curl_aws_sigv4_reaches_the_sim_endpoints() {
    if which_curl().is_none() {
        test_support::skip_or_fail("curl is not installed (needed to check `curl --aws-sigv4`)");
        return;
    }
    let s = start(Timing::Instant).await;
    let addr = s.sim.local_addr();
    let signed = [
        "--aws-sigv4",
        "aws:amz:us-east-1:ec2",
        "--user",
        "AKIDTEST:secret",
    ];

    let (status, body) = curl(addr, &signed, "GET", "/_sim/faults", None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<Faults>(&body).unwrap(),
        Faults::default()
    );
    let (status, body) = curl(
        addr,
        &signed,
        "PUT",
        "/_sim/faults",
        Some(r#"{"stuck_detaching_all": true}"#),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(s.sim.faults().stuck_detaching_all);
    s.ec2.ok("DescribeVolumes", &[]).await;
    let (status, body) = curl(addr, &signed, "POST", "/_sim/calls/reset", None).await;
    assert_eq!(status, 200, "{body}");
    assert!(s.sim.call_counts().is_empty());

    let (status, body) = curl(addr, &[], "PUT", "/_sim/faults", Some("{}")).await;
    assert_refused(status, &body, 401, "AuthFailure");
    let wrong = [
        "--aws-sigv4",
        "aws:amz:us-east-1:ec2",
        "--user",
        "AKIDTEST:nope",
    ];
    let (status, body) = curl(addr, &wrong, "PUT", "/_sim/faults", Some("{}")).await;
    assert_refused(status, &body, 403, "SignatureDoesNotMatch");
    assert!(
        s.sim.faults().stuck_detaching_all,
        "the refused PUTs changed nothing"
    );
}

fn which_curl() -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("curl"))
        .find(|p| p.is_file())
}

/// Runs curl against the simulator; returns the status and the body.
async fn curl(
    addr: SocketAddr,
    auth: &[&str],
    method: &str,
    path: &str,
    body: Option<&str>,
) -> (u16, String) {
    let mut args: Vec<String> = ["-sS", "-X", method, "-w", "\n%{http_code}"]
        .iter()
        .map(|a| a.to_string())
        .collect();
    args.extend(auth.iter().map(|a| a.to_string()));
    if let Some(body) = body {
        args.extend([
            "-H".into(),
            "Content-Type: application/json".into(),
            "--data-binary".into(),
            body.to_string(),
        ]);
    }
    args.push(format!("http://{addr}{path}"));
    let out = tokio::process::Command::new("curl")
        .args(&args)
        .output()
        .await
        .expect("curl runs");
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "curl {args:?}: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (body, status) = stdout.rsplit_once('\n').expect("curl's status line");
    (status.trim().parse().unwrap(), body.to_string())
}

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
