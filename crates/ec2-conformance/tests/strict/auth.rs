//! SigV4 through the real aws-sdk-ec2 signer: the suite's client gets in, a wrong secret is
//! `SignatureDoesNotMatch` (403), an unknown key `AuthFailure` (401), and neither changes
//! anything.

use aws_sdk_ec2::config::retry::RetryConfig;
use aws_sdk_ec2::config::{BehaviorVersion, Credentials, Region};
use ec2_conformance::{expect_code, wait};

use crate::common::*;

fn client_as(endpoint: &str, key: &str, secret: &str) -> aws_sdk_ec2::Client {
    let config = aws_sdk_ec2::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new(key, secret, None, None, "auth-test"))
        .endpoint_url(endpoint)
        .retry_config(RetryConfig::disabled())
        .build();
    aws_sdk_ec2::Client::from_conf(config)
}

#[tokio::test]
async fn sdk_signatures_are_verified() {
    let t = sim();
    // The suite's own client (AKIDCONFORMANCE, which the SimServer accepts) gets in.
    let vol = available_volume(&t.client, ZONE_A, 1).await;

    let (key, secret) = ec2_conformance::client::CREDENTIALS;
    let wrong_secret = client_as(&t.endpoint, key, "not-the-secret");
    let f = expect_code(wrong_secret.delete_volume().volume_id(&vol).send().await).unwrap();
    assert_eq!(
        (f.code.as_deref(), f.status),
        (Some("SignatureDoesNotMatch"), Some(403)),
        "{}",
        f.display
    );

    let stranger = client_as(&t.endpoint, "AKIDSTRANGER", secret);
    let f = expect_code(stranger.delete_volume().volume_id(&vol).send().await).unwrap();
    assert_eq!(
        (f.code.as_deref(), f.status),
        (Some("AuthFailure"), Some(401)),
        "{}",
        f.display
    );
    assert_eq!(
        f.message.as_deref(),
        Some("AWS was not able to validate the provided access credentials")
    );

    // The sim's default test pair is not accepted by a sim configured with another.
    let default_pair = client_as(
        &t.endpoint,
        ec2_sim::DEFAULT_ACCESS_KEY_ID,
        ec2_sim::DEFAULT_SECRET_ACCESS_KEY,
    );
    let f = expect_code(default_pair.describe_volumes().send().await).unwrap();
    assert_eq!(f.code.as_deref(), Some("AuthFailure"), "{}", f.display);

    // The volume is still there, and a client with the right pair can delete it.
    let same = client_as(&t.endpoint, key, secret);
    same.delete_volume().volume_id(&vol).send().await.unwrap();
    wait::gone(&t.client, &vol, WAIT).await.unwrap();
}
