//! CreateVolume parameter checks: each volume type's size / IOPS / throughput limits, the
//! parameters a type does not support, and the zone check.

use aws_sdk_ec2::types::VolumeType;
use ec2_conformance::Flavor;

use crate::common::*;

crate::both_endpoints!(
    parameter_limits,
    valid_boundaries,
    largest_sizes,
    unknown_zone
);

/// One CreateVolume request.
#[derive(Clone, Copy, Debug)]
struct Req {
    kind: &'static str,
    size: Option<i32>,
    iops: Option<i32>,
    throughput: Option<i32>,
    multi_attach: bool,
}

const fn req(kind: &'static str, size: i32) -> Req {
    Req {
        kind,
        size: Some(size),
        iops: None,
        throughput: None,
        multi_attach: false,
    }
}

impl Req {
    const fn iops(mut self, iops: i32) -> Self {
        self.iops = Some(iops);
        self
    }
    const fn throughput(mut self, mibps: i32) -> Self {
        self.throughput = Some(mibps);
        self
    }
    const fn multi_attach(mut self) -> Self {
        self.multi_attach = true;
        self
    }

    async fn send(
        self,
        c: &aws_sdk_ec2::Client,
    ) -> Result<
        aws_sdk_ec2::operation::create_volume::CreateVolumeOutput,
        aws_sdk_ec2::error::SdkError<
            aws_sdk_ec2::operation::create_volume::CreateVolumeError,
            aws_sdk_ec2::config::http::HttpResponse,
        >,
    > {
        let mut b = c
            .create_volume()
            .availability_zone(ZONE_A)
            .volume_type(VolumeType::from(self.kind))
            .set_size(self.size)
            .set_iops(self.iops)
            .set_throughput(self.throughput);
        if self.multi_attach {
            b = b.multi_attach_enabled(true);
        }
        b.send().await
    }
}

/// What moto does with a request AWS rejects.
#[derive(Clone, Copy, Debug)]
enum Moto {
    Accepts,
    Rejects(&'static str),
}

async fn parameter_limits(t: &Target) {
    // (request, AWS's code, what moto does)
    let cases: &[(Req, &str, Moto)] = &[
        (req("gp3", 0), "InvalidParameterValue", Moto::Accepts),
        (req("gp3", 16_385), "InvalidParameterValue", Moto::Accepts),
        (req("gp2", 16_385), "InvalidParameterValue", Moto::Accepts),
        (
            req("io1", 3).iops(100),
            "InvalidParameterValue",
            Moto::Accepts,
        ),
        (
            req("io2", 65_537).iops(1000),
            "InvalidParameterValue",
            Moto::Accepts,
        ),
        (req("st1", 124), "InvalidParameterValue", Moto::Accepts),
        (req("sc1", 16_385), "InvalidParameterValue", Moto::Accepts),
        (
            req("standard", 1025),
            "InvalidParameterValue",
            Moto::Accepts,
        ),
        (
            req("io1", 10),
            "MissingParameter",
            Moto::Rejects("InvalidParameterDependency"),
        ),
        // io1: at most 50 IOPS per GiB and 64,000 IOPS; io2: 1,000 per GiB and 256,000.
        (
            req("io1", 10).iops(501),
            "InvalidParameterValue",
            Moto::Accepts,
        ),
        (
            req("io1", 2000).iops(64_001),
            "InvalidParameterValue",
            Moto::Accepts,
        ),
        (
            req("io2", 10).iops(10_001),
            "InvalidParameterValue",
            Moto::Accepts,
        ),
        (
            req("io2", 1000).iops(256_001),
            "InvalidParameterValue",
            Moto::Accepts,
        ),
        (
            req("io1", 10).iops(99),
            "InvalidParameterValue",
            Moto::Accepts,
        ),
        // gp3: 3,000..=16,000 IOPS, 500 IOPS per GiB, 125..=1,000 MiB/s, 0.25 MiB/s per IOPS.
        (
            req("gp3", 100).iops(16_001),
            "InvalidParameterValue",
            Moto::Accepts,
        ),
        (
            req("gp3", 100).iops(2999),
            "InvalidParameterValue",
            Moto::Accepts,
        ),
        (
            req("gp3", 7).iops(4000),
            "InvalidParameterValue",
            Moto::Accepts,
        ),
        (
            req("gp3", 100).iops(16_000).throughput(1001),
            "InvalidParameterValue",
            Moto::Accepts,
        ),
        (
            req("gp3", 100).throughput(124),
            "InvalidParameterValue",
            Moto::Accepts,
        ),
        (
            req("gp3", 100).iops(3000).throughput(1000),
            "InvalidParameterValue",
            Moto::Accepts,
        ),
        // Parameters the type does not take.
        (
            req("gp2", 10).iops(300),
            "InvalidParameterCombination",
            Moto::Rejects("InvalidParameterDependency"),
        ),
        (
            req("gp2", 10).throughput(200),
            "InvalidParameterCombination",
            Moto::Rejects("InvalidParameterDependency"),
        ),
        (
            req("st1", 500).iops(500),
            "InvalidParameterCombination",
            Moto::Rejects("InvalidParameterDependency"),
        ),
        (
            req("gp3", 10).multi_attach(),
            "InvalidParameterCombination",
            Moto::Rejects("InvalidParameterDependency"),
        ),
        (req("gp9", 10), "InvalidParameterValue", Moto::Accepts),
    ];
    let c = &t.client;
    let mut wrong = Vec::new();
    for (request, aws_code, moto) in cases {
        let result = request.send(c).await;
        let got = match result {
            Ok(_) => "accepted".to_string(),
            Err(err) => ec2_conformance::failure(&err)
                .code
                .unwrap_or_else(|| "no code".into()),
        };
        let want = match (t.flavor, moto) {
            (Flavor::Aws, _) => aws_code.to_string(),
            (Flavor::Moto, Moto::Accepts) => "accepted".to_string(),
            (Flavor::Moto, Moto::Rejects(code)) => code.to_string(),
        };
        if got != want {
            wrong.push(format!("{request:?}: expected {want}, got {got}"));
        }
    }
    assert!(wrong.is_empty(), "\n{}", wrong.join("\n"));
}

async fn valid_boundaries(t: &Target) {
    // (request, IOPS AWS reports, throughput AWS reports)
    let cases: &[(Req, Option<i32>, Option<i32>)] = &[
        (req("gp3", 1), Some(3000), Some(125)),
        (req("gp3", 8).iops(4000), Some(4000), Some(125)),
        (
            req("gp3", 100).iops(4000).throughput(1000),
            Some(4000),
            Some(1000),
        ),
        (
            req("gp3", 100).iops(16_000).throughput(1000),
            Some(16_000),
            Some(1000),
        ),
        // gp2 reports its baseline: 3 IOPS per GiB, at least 100.
        (req("gp2", 10), Some(100), None),
        (req("gp2", 1000), Some(3000), None),
        (req("io1", 4).iops(200), Some(200), None),
        (req("io1", 2000).iops(64_000), Some(64_000), None),
        (req("io2", 10).iops(10_000), Some(10_000), None),
        (req("io2", 256).iops(256_000), Some(256_000), None),
        (req("io2", 10).iops(1000).multi_attach(), Some(1000), None),
        (req("st1", 125), None, None),
        (req("sc1", 125), None, None),
        (req("standard", 1024), None, None),
    ];
    let c = &t.client;
    for (request, iops, throughput) in cases {
        let out = request
            .send(c)
            .await
            .unwrap_or_else(|e| panic!("{request:?}: {}", ec2_conformance::failure(&e).display));
        assert_eq!(out.size(), request.size, "{request:?}");
        assert_eq!(out.volume_type(), Some(&VolumeType::from(request.kind)));
        assert_eq!(
            out.multi_attach_enabled().unwrap_or(false),
            request.multi_attach
        );
        match t.flavor {
            Flavor::Aws => {
                assert_eq!(out.iops(), *iops, "{request:?}");
                assert_eq!(out.throughput(), *throughput, "{request:?}");
            }
            Flavor::Moto => {
                // moto echoes what was asked; gp3 gets 3,000 IOPS, gp2 no IOPS, and no
                // throughput unless one was given.
                let moto_iops = match request.kind {
                    "gp3" => Some(request.iops.unwrap_or(3000)),
                    _ => request.iops,
                };
                assert_eq!(out.iops(), moto_iops, "{request:?}");
                assert_eq!(out.throughput(), request.throughput, "{request:?}");
            }
        }
    }
}

/// The largest volume of each type is a valid request on AWS (16 TiB, 64 TiB for io2), so the
/// endpoint must accept it, whatever file system holds its images.
async fn largest_sizes(t: &Target) {
    let c = &t.client;
    let mut wrong = Vec::new();
    for request in [
        req("gp2", 16_384),
        req("gp3", 16_384),
        req("io1", 16_384).iops(64_000),
        req("io2", 65_536).iops(256_000),
        req("st1", 16_384),
        req("sc1", 16_384),
        req("standard", 1024),
    ] {
        match request.send(c).await {
            Ok(out) => assert_eq!(out.size(), request.size),
            Err(err) => {
                let failure = ec2_conformance::failure(&err);
                wrong.push(format!(
                    "{} {} GiB: {} {}",
                    request.kind,
                    request.size.unwrap_or_default(),
                    failure.code.unwrap_or_default(),
                    failure.message.unwrap_or_default()
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "valid sizes rejected:\n{}",
        wrong.join("\n")
    );
}

async fn unknown_zone(t: &Target) {
    let c = &t.client;
    for zone in ["us-east-1z", "eu-west-1a"] {
        let result = c
            .create_volume()
            .availability_zone(zone)
            .size(10)
            .send()
            .await;
        match t.flavor {
            Flavor::Aws => assert_eq!(code_of(result), "InvalidZone.NotFound", "{zone}"),
            // moto creates the volume in a zone that does not exist.
            Flavor::Moto => {
                result.unwrap();
            }
        }
    }
}
