//! CreateVolume / DeleteVolume / DescribeVolumes through raw HTTP: the AWS-strict rules.

mod common;

use common::start;
use ec2_sim::{SimConfig, Timing};

#[tokio::test]
async fn zones_are_described() {
    let s = start(Timing::Instant).await;
    let x = s.ec2.ok("DescribeAvailabilityZones", &[]).await;
    let zones: Vec<String> = x
        .all("availabilityZoneInfo/item")
        .iter()
        .map(|z| z.get("zoneName"))
        .collect();
    assert_eq!(zones, vec!["us-east-1a", "us-east-1b", "us-east-1c"]);
    assert_eq!(x.at("availabilityZoneInfo/item/regionName"), "us-east-1");
    assert_eq!(x.at("availabilityZoneInfo/item/zoneState"), "available");
    let x = s
        .ec2
        .ok("DescribeAvailabilityZones", &[("ZoneName.1", "us-east-1b")])
        .await;
    assert_eq!(x.all("availabilityZoneInfo/item").len(), 1);
    s.ec2
        .fails(
            "DescribeAvailabilityZones",
            &[("ZoneName.1", "us-east-1z")],
            400,
            "InvalidParameterValue",
        )
        .await;
}

#[tokio::test]
async fn create_volume_goes_creating_then_available() {
    let s = start(Timing::Fast).await;
    let x = s
        .ec2
        .ok(
            "CreateVolume",
            &[
                ("AvailabilityZone", "us-east-1a"),
                ("Size", "10"),
                ("VolumeType", "gp3"),
                ("TagSpecification.1.ResourceType", "volume"),
                ("TagSpecification.1.Tag.1.Key", "CSIVolumeName"),
                ("TagSpecification.1.Tag.1.Value", "pvc-1"),
            ],
        )
        .await;
    let id = x.get("volumeId");
    assert!(id.starts_with("vol-") && id.len() == 21, "{id}");
    assert_eq!(x.get("status"), "creating");
    assert!(
        x.child("attachmentSet").is_none(),
        "CreateVolume returns no attachmentSet"
    );
    assert_eq!(x.get("size"), "10");
    assert_eq!(x.get("iops"), "3000");
    assert_eq!(x.get("throughput"), "125");
    assert_eq!(x.get("encrypted"), "false");
    assert_eq!(x.get("multiAttachEnabled"), "false");
    assert!(
        x.get("createTime").ends_with('Z'),
        "{}",
        x.get("createTime")
    );
    assert_eq!(x.at("tagSet/item/key"), "CSIVolumeName");
    assert_eq!(x.at("tagSet/item/value"), "pvc-1");
    let v = s.ec2.wait_status(&id, "available").await;
    assert!(v.child("attachmentSet").is_some());
    assert_eq!(v.get("availabilityZone"), "us-east-1a");
    assert_eq!(v.get("volumeType"), "gp3");
    let image = s.dir.path().join(format!("state/volumes/{id}.img"));
    assert_eq!(std::fs::metadata(&image).unwrap().len(), 10 << 30);
}

#[tokio::test]
async fn client_token_is_idempotent_and_detects_mismatch() {
    let s = start(Timing::Instant).await;
    let p = [
        ("AvailabilityZone", "us-east-1a"),
        ("Size", "5"),
        ("ClientToken", "token-1"),
    ];
    let a = s.ec2.ok("CreateVolume", &p).await.get("volumeId");
    let b = s.ec2.ok("CreateVolume", &p).await.get("volumeId");
    assert_eq!(a, b, "same token, same parameters: same volume");
    let all = s.ec2.ok("DescribeVolumes", &[]).await;
    assert_eq!(all.all("volumeSet/item").len(), 1);
    s.ec2
        .fails(
            "CreateVolume",
            &[
                ("AvailabilityZone", "us-east-1a"),
                ("Size", "6"),
                ("ClientToken", "token-1"),
            ],
            400,
            "IdempotentParameterMismatch",
        )
        .await;
    let c = s
        .ec2
        .ok(
            "CreateVolume",
            &[
                ("AvailabilityZone", "us-east-1a"),
                ("Size", "5"),
                ("ClientToken", "token-2"),
            ],
        )
        .await
        .get("volumeId");
    assert_ne!(a, c);
}

#[tokio::test]
async fn create_volume_validation() {
    let s = start(Timing::Instant).await;
    let cases: &[(&[(&str, &str)], &str)] = &[
        (&[("Size", "10")], "MissingParameter"),
        (
            &[("AvailabilityZone", "us-east-1z"), ("Size", "10")],
            "InvalidZone.NotFound",
        ),
        (&[("AvailabilityZone", "us-east-1a")], "MissingParameter"),
        (
            &[("AvailabilityZone", "us-east-1a"), ("Size", "0")],
            "InvalidParameterValue",
        ),
        (
            &[
                ("AvailabilityZone", "us-east-1a"),
                ("Size", "16385"),
                ("VolumeType", "gp3"),
            ],
            "InvalidParameterValue",
        ),
        (
            &[
                ("AvailabilityZone", "us-east-1a"),
                ("Size", "10"),
                ("VolumeType", "gp9"),
            ],
            "InvalidParameterValue",
        ),
        (
            &[
                ("AvailabilityZone", "us-east-1a"),
                ("Size", "10"),
                ("VolumeType", "io2"),
            ],
            "MissingParameter",
        ),
        (
            &[
                ("AvailabilityZone", "us-east-1a"),
                ("Size", "10"),
                ("VolumeType", "io1"),
                ("Iops", "1000"),
            ],
            "InvalidParameterValue",
        ),
        (
            &[
                ("AvailabilityZone", "us-east-1a"),
                ("Size", "10"),
                ("VolumeType", "gp2"),
                ("Iops", "300"),
            ],
            "InvalidParameterCombination",
        ),
        (
            &[
                ("AvailabilityZone", "us-east-1a"),
                ("Size", "100"),
                ("VolumeType", "gp3"),
                ("Throughput", "1000"),
            ],
            "InvalidParameterValue",
        ),
        (
            &[
                ("AvailabilityZone", "us-east-1a"),
                ("Size", "100"),
                ("VolumeType", "st1"),
            ],
            "InvalidParameterValue",
        ),
        (
            &[
                ("AvailabilityZone", "us-east-1a"),
                ("Size", "10"),
                ("VolumeType", "gp3"),
                ("MultiAttachEnabled", "true"),
            ],
            "InvalidParameterCombination",
        ),
        (
            &[
                ("AvailabilityZone", "us-east-1a"),
                ("Size", "10"),
                ("KmsKeyId", "alias/aws/ebs"),
            ],
            "InvalidParameterDependency",
        ),
        (
            &[
                ("AvailabilityZone", "us-east-1a"),
                ("Size", "10"),
                ("SnapshotId", "snap-nothex"),
            ],
            "InvalidSnapshotID.Malformed",
        ),
        (
            &[
                ("AvailabilityZone", "us-east-1a"),
                ("SnapshotId", "snap-0123456789abcdef0"),
            ],
            "InvalidSnapshot.NotFound",
        ),
        (
            &[
                ("AvailabilityZone", "us-east-1a"),
                ("Size", "10"),
                ("TagSpecification.1.ResourceType", "volume"),
                ("TagSpecification.1.Tag.1.Key", "aws:reserved"),
            ],
            "InvalidParameterValue",
        ),
        (
            &[("AvailabilityZone", "us-east-1a"), ("Size", "ten")],
            "InvalidParameterValue",
        ),
    ];
    for (params, code) in cases {
        let r = s.ec2.fails("CreateVolume", params, 400, code).await;
        assert!(!r.xml.at("Errors/Error/Message").is_empty());
    }
    let none = s.ec2.ok("DescribeVolumes", &[]).await;
    assert!(
        none.all("volumeSet/item").is_empty(),
        "no failed call created a volume"
    );
    // io2 at 1000 IOPS per GiB is allowed.
    s.ec2
        .ok(
            "CreateVolume",
            &[
                ("AvailabilityZone", "us-east-1a"),
                ("Size", "10"),
                ("VolumeType", "io2"),
                ("Iops", "10000"),
                ("MultiAttachEnabled", "true"),
            ],
        )
        .await;
}

#[tokio::test]
async fn dry_run_validates_and_does_nothing() {
    let s = start(Timing::Instant).await;
    s.ec2
        .fails(
            "CreateVolume",
            &[
                ("AvailabilityZone", "us-east-1a"),
                ("Size", "1"),
                ("DryRun", "true"),
            ],
            412,
            "DryRunOperation",
        )
        .await;
    // Invalid parameters are still reported before the dry-run answer.
    s.ec2
        .fails(
            "CreateVolume",
            &[
                ("AvailabilityZone", "us-east-1a"),
                ("Size", "0"),
                ("DryRun", "true"),
            ],
            400,
            "InvalidParameterValue",
        )
        .await;
    let x = s.ec2.ok("DescribeVolumes", &[]).await;
    assert!(x.all("volumeSet/item").is_empty());
}

#[tokio::test]
async fn unknown_kms_key_volume_appears_then_vanishes() {
    // Realistic: creation takes 1-2 s, so "it is there right after the call" is deterministic.
    let s = start(Timing::Realistic).await;
    let x = s
        .ec2
        .ok(
            "CreateVolume",
            &[
                ("AvailabilityZone", "us-east-1a"),
                ("Size", "1"),
                ("Encrypted", "true"),
                (
                    "KmsKeyId",
                    "arn:aws:kms:us-east-1:111122223333:key/does-not-exist",
                ),
            ],
        )
        .await;
    let id = x.get("volumeId");
    assert_eq!(x.get("status"), "creating");
    assert_eq!(x.get("encrypted"), "true");
    // Right after the call it is there...
    s.ec2.ok("DescribeVolumes", &[("VolumeId.1", &id)]).await;
    // ...and shortly after it is gone.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let r = s.ec2.call("DescribeVolumes", &[("VolumeId.1", &id)]).await;
        if r.status == 400 {
            assert_eq!(r.code(), "InvalidVolume.NotFound");
            break;
        }
        assert_eq!(r.xml.at("volumeSet/item/status"), "creating");
        assert!(
            std::time::Instant::now() < deadline,
            "volume never vanished"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(
        !s.dir
            .path()
            .join(format!("state/volumes/{id}.img"))
            .exists()
    );
    // The default key exists.
    let ok = s
        .ec2
        .create_volume("us-east-1a", "1", &[("Encrypted", "true")])
        .await;
    let v = s.ec2.wait_status(&ok, "available").await;
    assert!(v.get("kmsKeyId").contains("alias/aws/ebs"), "{v:?}");
}

#[tokio::test]
async fn describe_volumes_ids_errors_and_pagination() {
    let s = start(Timing::Instant).await;
    let mut ids = Vec::new();
    for _ in 0..12 {
        ids.push(s.ec2.create_volume("us-east-1a", "1", &[]).await);
    }
    ids.sort();
    s.ec2
        .fails(
            "DescribeVolumes",
            &[("VolumeId.1", "vol-xyz")],
            400,
            "InvalidVolumeID.Malformed",
        )
        .await;
    s.ec2
        .fails(
            "DescribeVolumes",
            &[
                ("VolumeId.1", &ids[0]),
                ("VolumeId.2", "vol-0000000000000000f"),
            ],
            400,
            "InvalidVolume.NotFound",
        )
        .await;
    s.ec2
        .fails(
            "DescribeVolumes",
            &[("VolumeId.1", &ids[0]), ("MaxResults", "5")],
            400,
            "InvalidParameterCombination",
        )
        .await;
    s.ec2
        .fails(
            "DescribeVolumes",
            &[("MaxResults", "4")],
            400,
            "InvalidParameterValue",
        )
        .await;
    s.ec2
        .fails(
            "DescribeVolumes",
            &[("NextToken", "garbage")],
            400,
            "InvalidPaginationToken",
        )
        .await;
    let mut seen = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let mut p = vec![("MaxResults", "5")];
        if !token.is_empty() {
            p.push(("NextToken", &token));
        }
        let x = s.ec2.ok("DescribeVolumes", &p).await;
        let page: Vec<String> = x
            .all("volumeSet/item")
            .iter()
            .map(|v| v.get("volumeId"))
            .collect();
        assert!(page.len() <= 5);
        seen.extend(page);
        pages += 1;
        token = x.get("nextToken");
        if token.is_empty() {
            break;
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(seen, ids, "every volume exactly once, in order");
}

#[tokio::test]
async fn describe_volumes_filters() {
    let s = start(Timing::Instant).await;
    let a = s
        .ec2
        .create_volume(
            "us-east-1a",
            "1",
            &[
                ("TagSpecification.1.ResourceType", "volume"),
                ("TagSpecification.1.Tag.1.Key", "env"),
                ("TagSpecification.1.Tag.1.Value", "prod"),
            ],
        )
        .await;
    let b = s.ec2.create_volume("us-east-1b", "2", &[]).await;
    let ids = |x: &common::Node| -> Vec<String> {
        x.all("volumeSet/item")
            .iter()
            .map(|v| v.get("volumeId"))
            .collect()
    };
    let f = |name: &'static str, value: &'static str| {
        vec![("Filter.1.Name", name), ("Filter.1.Value.1", value)]
    };
    assert_eq!(
        ids(&s.ec2.ok("DescribeVolumes", &f("tag:env", "prod")).await),
        vec![a.clone()]
    );
    assert_eq!(
        ids(&s.ec2.ok("DescribeVolumes", &f("tag:env", "p*")).await),
        vec![a.clone()]
    );
    assert_eq!(
        ids(&s.ec2.ok("DescribeVolumes", &f("tag-key", "env")).await),
        vec![a.clone()]
    );
    assert_eq!(
        ids(&s
            .ec2
            .ok("DescribeVolumes", &f("availability-zone", "us-east-1b"))
            .await),
        vec![b.clone()]
    );
    assert_eq!(
        ids(&s.ec2.ok("DescribeVolumes", &f("size", "2")).await),
        vec![b.clone()]
    );
    assert_eq!(
        ids(&s.ec2.ok("DescribeVolumes", &f("volume-id", "x")).await).len(),
        0
    );
    assert_eq!(
        ids(&s.ec2.ok("DescribeVolumes", &f("status", "available")).await).len(),
        2
    );
    // Two filters are ANDed, two values ORed.
    let x = s
        .ec2
        .ok(
            "DescribeVolumes",
            &[
                ("Filter.1.Name", "availability-zone"),
                ("Filter.1.Value.1", "us-east-1a"),
                ("Filter.1.Value.2", "us-east-1b"),
                ("Filter.2.Name", "status"),
                ("Filter.2.Value.1", "available"),
            ],
        )
        .await;
    assert_eq!(ids(&x).len(), 2);
    s.ec2
        .fails(
            "DescribeVolumes",
            &f("colour", "red"),
            400,
            "InvalidParameterValue",
        )
        .await;
}

#[tokio::test]
async fn delete_volume() {
    let s = start(Timing::Fast).await;
    let id = s.ec2.create_volume("us-east-1a", "1", &[]).await;
    s.ec2.wait_status(&id, "available").await;
    let x = s.ec2.ok("DeleteVolume", &[("VolumeId", &id)]).await;
    assert_eq!(x.get("return"), "true");
    let image = s.dir.path().join(format!("state/volumes/{id}.img"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while image.exists() {
        assert!(std::time::Instant::now() < deadline, "image never removed");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    s.ec2
        .fails(
            "DescribeVolumes",
            &[("VolumeId.1", &id)],
            400,
            "InvalidVolume.NotFound",
        )
        .await;
    s.ec2
        .fails(
            "DeleteVolume",
            &[("VolumeId", &id)],
            400,
            "InvalidVolume.NotFound",
        )
        .await;
    s.ec2
        .fails(
            "DeleteVolume",
            &[("VolumeId", "vol-1")],
            400,
            "InvalidVolumeID.Malformed",
        )
        .await;
    s.ec2
        .fails("DeleteVolume", &[], 400, "MissingParameter")
        .await;
}

#[tokio::test]
async fn other_region_and_zones() {
    let s = common::start_with(SimConfig {
        region: "eu-west-1".into(),
        zones: vec!["eu-west-1a".into()],
        timing: Timing::Instant,
        ..SimConfig::default()
    })
    .await;
    let x = s.ec2.ok("DescribeAvailabilityZones", &[]).await;
    assert_eq!(x.at("availabilityZoneInfo/item/zoneName"), "eu-west-1a");
    assert_eq!(x.at("availabilityZoneInfo/item/zoneId"), "euw1-az1");
    s.ec2
        .fails(
            "CreateVolume",
            &[("AvailabilityZone", "us-east-1a"), ("Size", "1")],
            400,
            "InvalidZone.NotFound",
        )
        .await;
}

#[tokio::test]
async fn unknown_action_and_malformed_request() {
    let s = start(Timing::Instant).await;
    s.ec2
        .fails("LaunchRockets", &[], 400, "InvalidAction")
        .await;
    // The query string works as well as a form body.
    let (status, body) = s
        .ec2
        .raw(
            "GET",
            "/?Action=DescribeAvailabilityZones&Version=2016-11-15",
            "",
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("<zoneName>us-east-1a</zoneName>"), "{body}");
    let (status, body) = s.ec2.raw("POST", "/", "Version=2016-11-15").await;
    assert_eq!(status, 400);
    assert!(body.contains("<Code>MissingParameter</Code>"), "{body}");
}

#[tokio::test]
async fn unknown_parameters_are_refused_naming_them() {
    let s = start(Timing::Instant).await;
    let r = s
        .ec2
        .fails(
            "CreateVolume",
            &[
                ("AvailabilityZone", "us-east-1a"),
                ("Size", "1"),
                (
                    "OutpostArn",
                    "arn:aws:outposts:us-east-1:111122223333:outpost/op-1",
                ),
            ],
            400,
            "UnknownParameter",
        )
        .await;
    assert!(r.body.contains("OutpostArn"), "{}", r.body);
    // Nothing was created, and the same request without it works.
    let d = s.ec2.ok("DescribeVolumes", &[]).await;
    assert!(d.all("volumeSet/item").is_empty());
    s.ec2.create_volume("us-east-1a", "1", &[]).await;
    // A parameter of another action, and a misspelt list member.
    s.ec2
        .fails(
            "DescribeVolumes",
            &[("InstanceId.1", "i-0123456789abcdef0")],
            400,
            "UnknownParameter",
        )
        .await;
    let r = s
        .ec2
        .fails(
            "DescribeInstances",
            &[
                ("Filter.1.Name", "instance-id"),
                ("Filter.1.Values.1", "i-1"),
            ],
            400,
            "UnknownParameter",
        )
        .await;
    assert!(r.body.contains("Filter.1.Values.1"), "{}", r.body);
    s.ec2
        .fails(
            "RunInstances",
            &[
                ("ImageId", "ami-12345678"),
                ("MinCount", "1"),
                ("MaxCount", "1"),
                ("SubnetId", "subnet-12345678"),
            ],
            400,
            "UnknownParameter",
        )
        .await;
}
