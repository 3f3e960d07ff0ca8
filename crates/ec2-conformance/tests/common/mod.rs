//! Shared test support: an endpoint (ec2-sim or moto_server) with a client, and small helpers.
//!
//! Test-only code: a failed expectation panics the test, so unwrap/expect are fine here.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::time::Duration;

use aws_sdk_ec2::Client;
use aws_sdk_ec2::types::{ResourceType, Tag, TagSpecification, VolumeState, VolumeType};
use ec2_conformance::{
    ClientOptions, Flavor, MotoServer, Retries, SimServer, client, client_with, find_moto_server,
};

/// Generous bound for state changes: the fast profile needs tens of milliseconds, a loaded CI
/// machine may need more.
pub const WAIT: Duration = Duration::from_secs(30);
pub const ZONE_A: &str = "us-east-1a";
pub const ZONE_B: &str = "us-east-1b";

/// The process behind an endpoint, stopped when the target drops.
pub enum Guard {
    Sim(SimServer),
    Moto(MotoServer),
}

/// An endpoint to run a scenario against.
pub struct Target {
    pub flavor: Flavor,
    pub client: Client,
    pub endpoint: String,
    pub guard: Guard,
}

impl Target {
    pub fn sim(&self) -> &SimServer {
        match &self.guard {
            Guard::Sim(sim) => sim,
            Guard::Moto(_) => panic!("this step needs ec2-sim"),
        }
    }
}

/// ec2-sim with its default config (fast timing, file backing, zones us-east-1a..c).
pub fn sim() -> Target {
    sim_with(|_| {})
}

pub fn sim_with(adjust: impl FnOnce(&mut ec2_sim::SimConfig)) -> Target {
    let sim = SimServer::start_with(adjust).expect("start ec2-sim");
    let endpoint = sim.endpoint().to_string();
    Target {
        flavor: Flavor::Aws,
        client: client(&endpoint),
        endpoint,
        guard: Guard::Sim(sim),
    }
}

/// A fresh moto_server, or `None` (with the reason printed) when moto_server is not installed.
pub async fn moto() -> Option<Target> {
    if find_moto_server().is_none() {
        test_support::skip_or_fail(
            "moto_server not found ($CSI_RS_VENV/bin, PATH, ~/.cache/csi-rs-venv/bin); \
             run scripts/setup",
        );
        return None;
    }
    let moto = MotoServer::start().await.expect("start moto_server");
    let endpoint = moto.endpoint().to_string();
    // moto_server (a Python dev server) now and then closes a pooled keep-alive connection just
    // as the next request goes out ("connection closed before message completed"; seen with
    // two test runs at once). The SDK's standard mode retries exactly such transport errors, as
    // a production caller would; no scenario run against moto expects a 5xx or throttling code
    // (the only other errors that mode retries), so every asserted error code is still exact.
    // ec2-sim keeps retries off: a dropped connection there is a bug to see.
    let options = ClientOptions {
        retries: Retries::Standard { max_attempts: 3 },
        ..ClientOptions::default()
    };
    Some(Target {
        flavor: Flavor::Moto,
        client: client_with(&endpoint, &options),
        endpoint,
        guard: Guard::Moto(moto),
    })
}

/// Runs a scenario against ec2-sim and against moto_server, one test each.
#[macro_export]
macro_rules! both_endpoints {
    ($($scenario:ident),* $(,)?) => {
        $(
            mod $scenario {
                #[tokio::test]
                async fn ec2_sim() {
                    let target = $crate::common::sim();
                    super::$scenario(&target).await;
                }

                #[tokio::test]
                async fn moto() {
                    if let Some(target) = $crate::common::moto().await {
                        super::$scenario(&target).await;
                    }
                }
            }
        )*
    };
}

pub fn tag(key: &str, value: &str) -> Tag {
    Tag::builder().key(key).value(value).build()
}

pub fn volume_tags(tags: &[(&str, &str)]) -> TagSpecification {
    let mut spec = TagSpecification::builder().resource_type(ResourceType::Volume);
    for (k, v) in tags {
        spec = spec.tags(tag(k, v));
    }
    spec.build()
}

/// Tags as sorted `(key, value)` pairs, for comparisons.
pub fn tag_pairs(tags: &[Tag]) -> Vec<(String, String)> {
    let mut pairs: Vec<(String, String)> = tags
        .iter()
        .map(|t| {
            (
                t.key().unwrap_or_default().to_string(),
                t.value().unwrap_or_default().to_string(),
            )
        })
        .collect();
    pairs.sort();
    pairs
}

pub fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = items
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    v.sort();
    v
}

/// Creates a gp3 volume of `size` GiB in `zone` and waits until it is available.
pub async fn available_volume(client: &Client, zone: &str, size: i32) -> String {
    let out = client
        .create_volume()
        .availability_zone(zone)
        .size(size)
        .volume_type(VolumeType::Gp3)
        .send()
        .await
        .expect("CreateVolume");
    let id = out.volume_id().expect("volume id").to_string();
    ec2_conformance::wait::volume_state(client, &id, VolumeState::Available, WAIT)
        .await
        .expect("volume becomes available");
    id
}

/// Starts one instance in `zone` and returns its ID.
pub async fn instance(client: &Client, zone: &str) -> String {
    let out = client
        .run_instances()
        .image_id("ami-12345678")
        .instance_type(aws_sdk_ec2::types::InstanceType::M5Large)
        .min_count(1)
        .max_count(1)
        .placement(
            aws_sdk_ec2::types::Placement::builder()
                .availability_zone(zone)
                .build(),
        )
        .send()
        .await
        .expect("RunInstances");
    out.instances()[0]
        .instance_id()
        .expect("instance id")
        .to_string()
}

/// The EC2 error code of a call that must fail.
pub fn code_of<T: std::fmt::Debug, E, R>(
    result: Result<T, aws_sdk_ec2::error::SdkError<E, R>>,
) -> String
where
    E: aws_sdk_ec2::error::ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug + ec2_conformance::errors::HttpStatus,
{
    let failure = ec2_conformance::expect_code(result).unwrap_or_else(|e| panic!("{e}"));
    failure
        .code
        .unwrap_or_else(|| panic!("no EC2 error code in {}", failure.display))
}

/// Asserts that an SDK timestamp lies within a few minutes of now (parsed, not defaulted).
pub fn assert_recent(what: &str, t: Option<&aws_sdk_ec2::primitives::DateTime>) {
    let t = t.unwrap_or_else(|| panic!("{what}: no timestamp"));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let skew = (t.secs() - now).abs();
    assert!(skew < 300, "{what}: {t:?} is {skew}s away from now");
}

/// A plain, unsigned HTTP/1.0 request (for the simulator's open endpoints, `/metrics` and
/// `/healthz`, and for checking that the others refuse it); returns the status code and the
/// body.
pub async fn http(endpoint: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    http_with_headers(endpoint, method, path, body, &[]).await
}

/// Like [`http`], signed (SigV4, service `ec2`, [`ec2_conformance::REGION`]) with
/// [`ec2_conformance::client::CREDENTIALS`], the pair the simulator of [`sim`] accepts: what
/// the simulator's `/_sim/*` endpoints, which the SDK does not know, need.
pub async fn http_signed(endpoint: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let host = endpoint.trim_start_matches("http://").trim_end_matches('/');
    let (p, query) = path.split_once('?').unwrap_or((path, ""));
    let (key, secret) = ec2_conformance::client::CREDENTIALS;
    let headers = ec2_sim::sign_request(
        method,
        p,
        query,
        host,
        body.as_bytes(),
        ec2_conformance::REGION,
        key,
        secret,
        std::time::SystemTime::now(),
    );
    http_with_headers(endpoint, method, path, body, &headers).await
}

/// Like [`http`], with these extra headers.
pub async fn http_with_headers(
    endpoint: &str,
    method: &str,
    path: &str,
    body: &str,
    headers: &[(&str, String)],
) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = endpoint.trim_start_matches("http://").trim_end_matches('/');
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let extra: String = headers
        .iter()
        .map(|(name, value)| format!("{name}: {value}\r\n"))
        .collect();
    let request = format!(
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         {extra}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.unwrap();
    let text = String::from_utf8_lossy(&response).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {head:?}"));
    (status, body.to_string())
}
