//! AWS Signature Version 4 on the EC2 endpoint: who gets in, who does not and what they are
//! told; the binary's credentials (flags, environment, the generated file). The real
//! aws-sdk-ec2's signing is checked in ec2-conformance (`strict::auth`), boto3's here.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, SystemTime};

use common::{Ec2, Reply, parse, spawn_binary_with, start, start_with};
use ec2_sim::{Credentials, SimConfig, Timing};

const DESCRIBE: &str = "Action=DescribeVolumes&Version=2016-11-15";

fn reply(status: u16, body: String) -> Reply {
    let xml = parse(&body);
    Reply { status, body, xml }
}

/// An EC2 error reply: the status, the code, and EC2's error document with a request ID.
fn assert_refused(r: &Reply, status: u16, code: &str) {
    assert_eq!((r.status, r.code().as_str()), (status, code), "{}", r.body);
    assert_eq!(r.xml.name, "Response", "{}", r.body);
    assert!(!r.xml.get("RequestID").is_empty(), "{}", r.body);
}

#[tokio::test]
async fn unsigned_requests_are_refused_and_change_nothing() {
    let s = start(Timing::Instant).await;
    let anonymous = Ec2::with_credentials(s.sim.local_addr(), None);
    let r = anonymous
        .call(
            "CreateVolume",
            &[("AvailabilityZone", "us-east-1a"), ("Size", "1")],
        )
        .await;
    assert_refused(&r, 401, "AuthFailure");
    assert_eq!(
        r.xml.at("Errors/Error/Message"),
        "AWS was not able to validate the provided access credentials"
    );
    // The query-string form too.
    let (status, body) = anonymous
        .raw(
            "GET",
            "/?Action=DescribeAvailabilityZones&Version=2016-11-15",
            "",
        )
        .await;
    assert_refused(&reply(status, body), 401, "AuthFailure");
    // Nothing was created, and refused calls are not counted as calls of their action.
    let v = s.ec2.ok("DescribeVolumes", &[]).await;
    assert!(v.all("volumeSet/item").is_empty(), "{v:?}");
    assert_eq!(s.sim.call_counts().get("CreateVolume"), None);
    // /healthz stays open (the `/_sim/*` endpoints do not: tests/faults_and_sim_endpoints.rs).
    let (status, _) = anonymous.raw("GET", "/healthz", "").await;
    assert_eq!(status, 200);
    let (status, body) = anonymous.raw("GET", "/_sim/calls", "").await;
    assert_refused(&reply(status, body), 401, "AuthFailure");
}

#[tokio::test]
async fn wrong_secret_unknown_key_and_tampered_body() {
    let s = start(Timing::Instant).await;
    let addr = s.sim.local_addr();
    let volume = s.ec2.create_volume("us-east-1a", "1", &[]).await;
    s.ec2.wait_status(&volume, "available").await;

    let wrong_secret = Ec2::with_credentials(addr, Some(("AKIDTEST", "not-the-secret")));
    let r = wrong_secret
        .call("DeleteVolume", &[("VolumeId", &volume)])
        .await;
    assert_refused(&r, 403, "SignatureDoesNotMatch");

    let unknown = Ec2::with_credentials(addr, Some(("AKIDSTRANGER", "secret")));
    let r = unknown.call("DeleteVolume", &[("VolumeId", &volume)]).await;
    assert_refused(&r, 401, "AuthFailure");

    // A valid signature of a harmless body, sent with a destructive one.
    let headers = s.ec2.signature("POST", "/", DESCRIBE);
    let tampered = format!("Action=DeleteVolume&Version=2016-11-15&VolumeId={volume}");
    let (status, body) = s.ec2.send("POST", "/", &tampered, &headers).await;
    assert_refused(&reply(status, body), 403, "SignatureDoesNotMatch");
    // The same headers with the body they sign are fine.
    let (status, body) = s.ec2.send("POST", "/", DESCRIBE, &headers).await;
    assert_eq!(status, 200, "{body}");
    // Still there after all that.
    assert_eq!(s.ec2.volume(&volume).await.get("status"), "available");
    assert_eq!(s.sim.call_counts().get("DeleteVolume"), None);
}

#[tokio::test]
async fn requests_dated_more_than_fifteen_minutes_off_are_expired() {
    let s = start(Timing::Instant).await;
    let host = s.sim.local_addr().to_string();
    for (at, want) in [
        (SystemTime::now() - Duration::from_secs(20 * 60), 400),
        (SystemTime::now() + Duration::from_secs(20 * 60), 400),
        (SystemTime::now() - Duration::from_secs(10 * 60), 200),
    ] {
        let headers = ec2_sim::sign_post(
            &host,
            DESCRIBE.as_bytes(),
            "us-east-1",
            "AKIDTEST",
            "secret",
            at,
        );
        let (status, body) = s.ec2.send("POST", "/", DESCRIBE, &headers).await;
        if want == 200 {
            assert_eq!(status, 200, "{body}");
        } else {
            assert_refused(&reply(status, body), 400, "RequestExpired");
        }
    }
}

#[tokio::test]
async fn configured_keys_are_the_only_ones_accepted() {
    let mut credentials = Credentials::single("AKIDONE", "one-secret");
    credentials.insert("AKIDTWO", "two-secret");
    let s = start_with(SimConfig {
        timing: Timing::Instant,
        credentials,
        ..SimConfig::default()
    })
    .await;
    let addr = s.sim.local_addr();
    for (key, secret) in [("AKIDONE", "one-secret"), ("AKIDTWO", "two-secret")] {
        Ec2::with_credentials(addr, Some((key, secret)))
            .ok("DescribeAvailabilityZones", &[])
            .await;
    }
    // The default test pair is not one of them.
    let r = s.ec2.call("DescribeAvailabilityZones", &[]).await;
    assert_refused(&r, 401, "AuthFailure");
    // Nor is a key with another key's secret.
    let r = Ec2::with_credentials(addr, Some(("AKIDONE", "two-secret")))
        .call("DescribeAvailabilityZones", &[])
        .await;
    assert_refused(&r, 403, "SignatureDoesNotMatch");
    // A signature for another region.
    let mut other_region = Ec2::with_credentials(addr, Some(("AKIDONE", "one-secret")));
    other_region.region = "eu-west-1".into();
    let r = other_region.call("DescribeAvailabilityZones", &[]).await;
    assert_refused(&r, 403, "SignatureDoesNotMatch");
    // And no keys at all is a configuration error, not an open door.
    let err = ec2_sim::Simulator::start(
        SimConfig {
            state_dir: s.dir.path().join("empty"),
            credentials: Credentials::empty(),
            ..SimConfig::default()
        },
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("credentials"), "{err}");
}

#[tokio::test]
async fn binary_generates_a_private_credentials_file_and_keeps_it() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let args = [
        "--state-dir",
        state.to_str().unwrap(),
        "--timing",
        "instant",
    ];
    let (child, addr, log) = spawn_binary_with(&args, &[]);
    let file = state.join("credentials");
    let mode = std::fs::metadata(&file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{}", file.display());
    let creds = Credentials::from_file(&file).unwrap();
    let (key, secret) = creds.first().unwrap();
    assert!(key.starts_with("AKIA") && secret.len() == 40, "{key}");
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(
        text.starts_with("[default]\naws_access_key_id = "),
        "{text}"
    );
    // The log says where, and never the secret.
    {
        let lines = log.lock().unwrap();
        assert!(
            lines
                .iter()
                .any(|l| l.contains("generated") && l.contains(file.to_str().unwrap())),
            "{lines:?}"
        );
        assert!(!lines.iter().any(|l| l.contains(secret)), "{lines:?}");
    }
    Ec2::with_credentials(addr, Some((key, secret)))
        .ok("DescribeAvailabilityZones", &[])
        .await;
    let r = Ec2::new(addr).call("DescribeAvailabilityZones", &[]).await;
    assert_refused(&r, 401, "AuthFailure");
    drop(child);

    // A restart on the same state dir keeps the pair.
    let (_child, addr, _log) = spawn_binary_with(&args, &[]);
    assert_eq!(Credentials::from_file(&file).unwrap(), creds);
    Ec2::with_credentials(addr, Some((key, secret)))
        .ok("DescribeAvailabilityZones", &[])
        .await;
}

#[tokio::test]
async fn binary_takes_keys_from_a_file_and_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let file = dir.path().join("keys");
    std::fs::write(
        &file,
        "[default]\naws_access_key_id = AKIDFILE\naws_secret_access_key = file-secret\n\n\
         [other]\naws_access_key_id = AKIDFILE2\naws_secret_access_key = file-secret-2\n",
    )
    .unwrap();
    let (_child, addr, _log) = spawn_binary_with(
        &[
            "--state-dir",
            state.to_str().unwrap(),
            "--credentials-file",
            file.to_str().unwrap(),
        ],
        &[
            ("EC2_SIM_ACCESS_KEY_ID", "AKIDENV"),
            ("EC2_SIM_SECRET_ACCESS_KEY", "env-secret"),
        ],
    );
    for (key, secret) in [
        ("AKIDFILE", "file-secret"),
        ("AKIDFILE2", "file-secret-2"),
        ("AKIDENV", "env-secret"),
    ] {
        Ec2::with_credentials(addr, Some((key, secret)))
            .ok("DescribeAvailabilityZones", &[])
            .await;
    }
    let r = Ec2::new(addr).call("DescribeAvailabilityZones", &[]).await;
    assert_refused(&r, 401, "AuthFailure");
    // Given keys are not written anywhere.
    assert!(!state.join("credentials").exists());

    // Half a pair is an error, not a generated key.
    let out = Command::new(env!("CARGO_BIN_EXE_ec2-sim"))
        .args(["--state-dir", state.to_str().unwrap()])
        .env_remove("EC2_SIM_SECRET_ACCESS_KEY")
        .env_remove("EC2_SIM_CREDENTIALS_FILE")
        .env("EC2_SIM_ACCESS_KEY_ID", "AKIDENV")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("EC2_SIM_SECRET_ACCESS_KEY"), "{stderr}");
    assert!(!state.join("credentials").exists());
}

/// The venv's Python (scripts/setup installs boto3 there), or `None`.
fn venv_python() -> Option<PathBuf> {
    let venv = std::env::var_os("CSI_RS_VENV")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/csi-rs-venv"))
        })?;
    let python = venv.join("bin/python3");
    python.exists().then_some(python)
}

/// boto3 (botocore's own SigV4 signer, which signs more headers than ours) gets in with the
/// right secret and is told SignatureDoesNotMatch / AuthFailure otherwise.
#[tokio::test]
async fn boto3_signs_and_is_checked() {
    let Some(python) = venv_python() else {
        test_support::skip_or_fail("no venv with boto3 (run scripts/setup)");
        return;
    };
    let s = start(Timing::Instant).await;
    let script = r#"
import sys, boto3, botocore.exceptions
endpoint = sys.argv[1]
def client(key, secret):
    return boto3.client("ec2", region_name="us-east-1", endpoint_url=endpoint,
                        aws_access_key_id=key, aws_secret_access_key=secret,
                        config=botocore.config.Config(retries={"max_attempts": 1}))
ok = client("AKIDTEST", "secret")
v = ok.create_volume(AvailabilityZone="us-east-1a", Size=1, VolumeType="gp3",
                     TagSpecifications=[{"ResourceType": "volume",
                                         "Tags": [{"Key": "Name", "Value": "a b/c=d"}]}])
print("created", v["VolumeId"])
for key, secret in [("AKIDTEST", "wrong"), ("AKIDNOBODY", "secret")]:
    try:
        client(key, secret).describe_volumes()
        print("accepted", key)
    except botocore.exceptions.ClientError as e:
        print("refused", key, e.response["Error"]["Code"], e.response["ResponseMetadata"]["HTTPStatusCode"])
"#;
    let endpoint = s.sim.endpoint();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .arg("-c")
            .arg(script)
            .arg(endpoint)
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env_remove("AWS_PROFILE")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stderr.contains("No module named 'boto3'") {
        test_support::skip_or_fail("boto3 is not installed in the venv (run scripts/setup)");
        return;
    }
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines[0].starts_with("created vol-"), "{stdout}");
    let volume = lines[0].trim_start_matches("created ");
    assert_eq!(
        s.ec2.volume(volume).await.at("tagSet/item/value"),
        "a b/c=d"
    );
    assert_eq!(
        &lines[1..],
        [
            "refused AKIDTEST SignatureDoesNotMatch 403",
            "refused AKIDNOBODY AuthFailure 401"
        ],
        "{stdout}"
    );
}
