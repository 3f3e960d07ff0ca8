//! RunInstances `BlockDeviceMapping.N.Ebs`: volumes created and attached at launch, validated
//! like CreateVolume / AttachVolume, detached (and deleted when DeleteOnTermination) at
//! TerminateInstances; and the largest volume of each type.

mod common;

use std::time::{Duration, Instant};

use common::{Ec2, Node, start};
use ec2_sim::Timing;

fn run_params<'a>(extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut p = vec![
        ("ImageId", "ami-12345678"),
        ("MinCount", "1"),
        ("MaxCount", "1"),
        ("Placement.AvailabilityZone", "us-east-1b"),
    ];
    p.extend_from_slice(extra);
    p
}

/// The instance's `blockDeviceMapping/item`s, as DescribeInstances reports them.
async fn mappings(ec2: &Ec2, instance: &str) -> Vec<Node> {
    let d = ec2
        .ok("DescribeInstances", &[("InstanceId.1", instance)])
        .await;
    d.all("reservationSet/item/instancesSet/item/blockDeviceMapping/item")
        .into_iter()
        .cloned()
        .collect()
}

async fn wait_gone(ec2: &Ec2, volume: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = ec2.call("DescribeVolumes", &[("VolumeId.1", volume)]).await;
        if r.status == 400 && r.code() == "InvalidVolume.NotFound" {
            return;
        }
        assert_eq!(r.status, 200, "{}", r.body);
        assert!(Instant::now() < deadline, "{volume} never went: {}", r.body);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn launch_volumes_are_created_attached_and_go_with_the_instance() {
    let s = start(Timing::Fast).await;
    let x = s
        .ec2
        .ok(
            "RunInstances",
            &run_params(&[
                ("BlockDeviceMapping.1.DeviceName", "/dev/sdf"),
                ("BlockDeviceMapping.1.Ebs.VolumeSize", "20"),
                ("BlockDeviceMapping.1.Ebs.VolumeType", "gp3"),
                ("BlockDeviceMapping.1.Ebs.Throughput", "250"),
                ("BlockDeviceMapping.2.DeviceName", "/dev/xvdg"),
                ("BlockDeviceMapping.2.Ebs.VolumeSize", "8"),
                ("BlockDeviceMapping.2.Ebs.VolumeType", "io1"),
                ("BlockDeviceMapping.2.Ebs.Iops", "400"),
                ("BlockDeviceMapping.2.Ebs.Encrypted", "true"),
                ("BlockDeviceMapping.2.Ebs.DeleteOnTermination", "false"),
                // An instance-store entry creates no volume.
                ("BlockDeviceMapping.3.DeviceName", "/dev/sdh"),
                ("BlockDeviceMapping.3.VirtualName", "ephemeral0"),
                ("TagSpecification.1.ResourceType", "volume"),
                ("TagSpecification.1.Tag.1.Key", "team"),
                ("TagSpecification.1.Tag.1.Value", "storage"),
            ]),
        )
        .await;
    let inst = x.at("instancesSet/item/instanceId");
    let maps = mappings(&s.ec2, &inst).await;
    assert_eq!(maps.len(), 2, "{maps:?}");
    let by_device = |d: &str| {
        maps.iter()
            .find(|m| m.get("deviceName") == d)
            .unwrap_or_else(|| panic!("no {d} in {maps:?}"))
            .clone()
    };
    let f = by_device("/dev/sdf");
    let g = by_device("/dev/xvdg");
    assert_eq!(f.at("ebs/deleteOnTermination"), "true", "AWS's default");
    assert_eq!(g.at("ebs/deleteOnTermination"), "false");
    let (vf, vg) = (f.at("ebs/volumeId"), g.at("ebs/volumeId"));
    assert!(vf.starts_with("vol-") && vg.starts_with("vol-") && vf != vg);

    let v = s.ec2.wait_attached(&vf).await;
    assert_eq!(v.get("size"), "20");
    assert_eq!(v.get("volumeType"), "gp3");
    assert_eq!(v.get("throughput"), "250");
    assert_eq!(v.get("iops"), "3000");
    assert_eq!(v.get("availabilityZone"), "us-east-1b");
    assert_eq!(v.get("status"), "in-use");
    assert_eq!(v.at("tagSet/item/key"), "team");
    assert_eq!(v.at("attachmentSet/item/instanceId"), inst);
    assert_eq!(v.at("attachmentSet/item/device"), "/dev/sdf");
    assert_eq!(v.at("attachmentSet/item/deleteOnTermination"), "true");
    let v = s.ec2.wait_attached(&vg).await;
    assert_eq!(v.get("iops"), "400");
    assert_eq!(v.get("encrypted"), "true");
    assert_eq!(v.at("attachmentSet/item/deleteOnTermination"), "false");
    let image_f = s.dir.path().join(format!("state/volumes/{vf}.img"));
    assert_eq!(std::fs::metadata(&image_f).unwrap().len(), 20 << 30);

    // Launch volumes hold their attachment points like AttachVolume's do.
    let other = s.ec2.create_volume("us-east-1b", "1", &[]).await;
    s.ec2.wait_status(&other, "available").await;
    let r = s
        .ec2
        .fails(
            "AttachVolume",
            &[
                ("VolumeId", &other),
                ("InstanceId", &inst),
                ("Device", "/dev/xvdf"),
            ],
            400,
            "InvalidParameterValue",
        )
        .await;
    assert!(r.body.contains("already in use"), "{}", r.body);
    // And they cannot be deleted while attached.
    s.ec2
        .fails("DeleteVolume", &[("VolumeId", &vf)], 400, "VolumeInUse")
        .await;

    s.ec2
        .ok("TerminateInstances", &[("InstanceId.1", &inst)])
        .await;
    wait_gone(&s.ec2, &vf).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while image_f.exists() {
        assert!(Instant::now() < deadline, "image of {vf} not removed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // DeleteOnTermination=false: detached and kept.
    let v = s.ec2.wait_status(&vg, "available").await;
    assert!(v.all("attachmentSet/item").is_empty());
    assert!(mappings(&s.ec2, &inst).await.is_empty());
    s.sim.shutdown().await.unwrap();
}

#[tokio::test]
async fn each_instance_gets_its_own_volumes_from_a_snapshot() {
    let s = start(Timing::Instant).await;
    let src = s.ec2.create_volume("us-east-1a", "6", &[]).await;
    let snap = s
        .ec2
        .ok("CreateSnapshot", &[("VolumeId", &src)])
        .await
        .get("snapshotId");
    let x = s
        .ec2
        .ok(
            "RunInstances",
            &[
                ("ImageId", "ami-12345678"),
                ("MinCount", "2"),
                ("MaxCount", "2"),
                ("BlockDeviceMapping.1.DeviceName", "/dev/sdf"),
                ("BlockDeviceMapping.1.Ebs.SnapshotId", &snap),
            ],
        )
        .await;
    let instances: Vec<String> = x
        .all("instancesSet/item")
        .iter()
        .map(|i| i.get("instanceId"))
        .collect();
    assert_eq!(instances.len(), 2);
    let mut volumes = Vec::new();
    for i in &instances {
        let maps = mappings(&s.ec2, i).await;
        assert_eq!(maps.len(), 1);
        let v = s.ec2.volume(&maps[0].at("ebs/volumeId")).await;
        assert_eq!(v.get("snapshotId"), snap);
        assert_eq!(v.get("size"), "6", "a snapshot's size by default");
        assert_eq!(v.get("volumeType"), "gp2", "AWS's default type");
        assert_eq!(v.get("availabilityZone"), "us-east-1a");
        assert_eq!(v.at("attachmentSet/item/instanceId"), *i);
        volumes.push(v.get("volumeId"));
    }
    assert_ne!(volumes[0], volumes[1]);
    s.sim.shutdown().await.unwrap();
}

#[tokio::test]
async fn launch_mappings_are_validated_like_create_and_attach() {
    let s = start(Timing::Instant).await;
    let bdm = |n: &'static str, dev: &'static str, ebs: &[(&'static str, &'static str)]| {
        let mut p: Vec<(String, String)> = vec![(
            format!("BlockDeviceMapping.{n}.DeviceName"),
            dev.to_string(),
        )];
        for (k, v) in ebs {
            p.push((format!("BlockDeviceMapping.{n}.Ebs.{k}"), v.to_string()));
        }
        p
    };
    let cases: Vec<(Vec<(String, String)>, &str)> = vec![
        (
            bdm("1", "xvdf", &[("VolumeSize", "1")]),
            "InvalidParameterValue",
        ),
        (bdm("1", "", &[("VolumeSize", "1")]), "MissingParameter"),
        (
            [
                bdm("1", "/dev/sdf", &[("VolumeSize", "1")]),
                bdm("2", "/dev/xvdf", &[("VolumeSize", "1")]),
            ]
            .concat(),
            "InvalidParameterValue",
        ),
        (
            bdm("1", "/dev/sdf", &[("VolumeSize", "16385")]),
            "InvalidParameterValue",
        ),
        (
            bdm("1", "/dev/sdf", &[("VolumeSize", "0")]),
            "InvalidParameterValue",
        ),
        (
            bdm("1", "/dev/sdf", &[("VolumeSize", "ten")]),
            "InvalidParameterValue",
        ),
        (
            bdm(
                "1",
                "/dev/sdf",
                &[("VolumeSize", "10"), ("VolumeType", "gp9")],
            ),
            "InvalidParameterValue",
        ),
        (
            bdm(
                "1",
                "/dev/sdf",
                &[("VolumeSize", "10"), ("VolumeType", "io1")],
            ),
            "MissingParameter",
        ),
        (
            bdm("1", "/dev/sdf", &[("VolumeSize", "10"), ("Iops", "3000")]),
            "InvalidParameterCombination",
        ),
        (
            bdm(
                "1",
                "/dev/sdf",
                &[
                    ("VolumeSize", "10"),
                    ("VolumeType", "gp3"),
                    ("Iops", "6000"),
                ],
            ),
            "InvalidParameterValue",
        ),
        (
            bdm("1", "/dev/sdf", &[("DeleteOnTermination", "true")]),
            "MissingParameter",
        ),
        (
            bdm("1", "/dev/sdf", &[("SnapshotId", "snap-0123456789abcdef0")]),
            "InvalidSnapshot.NotFound",
        ),
        (
            bdm("1", "/dev/sdf", &[("SnapshotId", "snap-xyz")]),
            "InvalidSnapshotID.Malformed",
        ),
        (
            bdm(
                "1",
                "/dev/sdf",
                &[("VolumeSize", "1"), ("KmsKeyId", "alias/aws/ebs")],
            ),
            "InvalidParameterDependency",
        ),
        (
            bdm(
                "1",
                "/dev/sdf",
                &[("VolumeSize", "1"), ("DeleteOnTermination", "maybe")],
            ),
            "InvalidParameterValue",
        ),
        (
            (1..=27)
                .flat_map(|n| {
                    let dev = format!(
                        "/dev/xvd{}{}",
                        (b'b' + n / 26) as char,
                        (b'a' + n % 26) as char
                    );
                    vec![
                        (format!("BlockDeviceMapping.{n}.DeviceName"), dev),
                        (format!("BlockDeviceMapping.{n}.Ebs.VolumeSize"), "1".into()),
                    ]
                })
                .collect(),
            "AttachmentLimitExceeded",
        ),
    ];
    for (mapping, code) in cases {
        let params: Vec<(String, String)> = run_params(&[])
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .chain(mapping)
            .collect();
        let refs: Vec<(&str, &str)> = params
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let r = s.ec2.fails("RunInstances", &refs, 400, code).await;
        if code != "MissingParameter" && code != "AttachmentLimitExceeded" {
            assert!(
                r.body.contains("BlockDeviceMapping."),
                "names the mapping: {}",
                r.body
            );
        }
    }
    // DryRun validates the mappings and creates nothing.
    s.ec2
        .fails(
            "RunInstances",
            &run_params(&[
                ("BlockDeviceMapping.1.DeviceName", "/dev/sdf"),
                ("BlockDeviceMapping.1.Ebs.VolumeSize", "5"),
                ("DryRun", "true"),
            ]),
            412,
            "DryRunOperation",
        )
        .await;
    let d = s.ec2.ok("DescribeVolumes", &[]).await;
    assert!(d.all("volumeSet/item").is_empty(), "{d:?}");
    let d = s.ec2.ok("DescribeInstances", &[]).await;
    assert!(d.all("reservationSet/item").is_empty(), "{d:?}");
    s.sim.shutdown().await.unwrap();
}

#[tokio::test]
async fn unknown_kms_key_fails_the_launch() {
    let s = start(Timing::Fast).await;
    let x = s
        .ec2
        .ok(
            "RunInstances",
            &run_params(&[
                ("BlockDeviceMapping.1.DeviceName", "/dev/sdf"),
                ("BlockDeviceMapping.1.Ebs.VolumeSize", "5"),
                ("BlockDeviceMapping.1.Ebs.Encrypted", "true"),
                ("BlockDeviceMapping.1.Ebs.KmsKeyId", "alias/does-not-exist"),
            ]),
        )
        .await;
    let inst = x.at("instancesSet/item/instanceId");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let d = s
            .ec2
            .ok("DescribeInstances", &[("InstanceId.1", &inst)])
            .await;
        let state = d.at("reservationSet/item/instancesSet/item/instanceState/name");
        if state == "terminated" {
            break;
        }
        assert_eq!(state, "shutting-down");
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(mappings(&s.ec2, &inst).await.is_empty());
    let d = s.ec2.ok("DescribeVolumes", &[]).await;
    assert!(d.all("volumeSet/item").is_empty());
    s.sim.shutdown().await.unwrap();
}

#[tokio::test]
async fn largest_volume_of_each_type_is_created_with_its_nominal_size() {
    let s = start(Timing::Instant).await;
    let mut ids = Vec::new();
    for (kind, size, iops) in [
        ("gp2", "16384", None),
        ("gp3", "16384", None),
        ("io1", "16384", Some("64000")),
        ("io2", "65536", Some("256000")),
        ("st1", "16384", None),
        ("sc1", "16384", None),
        ("standard", "1024", None),
    ] {
        let mut p = vec![
            ("AvailabilityZone", "us-east-1a"),
            ("Size", size),
            ("VolumeType", kind),
        ];
        if let Some(iops) = iops {
            p.push(("Iops", iops));
        }
        let x = s.ec2.ok("CreateVolume", &p).await;
        assert_eq!(x.get("size"), size, "{kind}");
        let id = x.get("volumeId");
        assert_eq!(s.ec2.volume(&id).await.get("size"), size, "{kind}");
        // The image may be shorter (the filesystem's limit), never longer, and is sparse.
        let image = s.dir.path().join(format!("state/volumes/{id}.img"));
        let len = std::fs::metadata(&image).unwrap().len();
        let nominal: u64 = size.parse::<u64>().unwrap() << 30;
        assert!(len > 0 && len <= nominal, "{kind}: {len}");
        ids.push((id, len));
    }
    // Snapshots and restores of the 64 TiB io2 volume work with its image, whatever its length.
    let (io2, io2_len) = ids[3].clone();
    let snap = s
        .ec2
        .ok("CreateSnapshot", &[("VolumeId", &io2)])
        .await
        .get("snapshotId");
    let restored = s
        .ec2
        .ok(
            "CreateVolume",
            &[
                ("AvailabilityZone", "us-east-1a"),
                ("SnapshotId", &snap),
                ("VolumeType", "io2"),
                ("Iops", "1000"),
            ],
        )
        .await
        .get("volumeId");
    assert_eq!(s.ec2.volume(&restored).await.get("size"), "65536");
    // And a small io2 volume grows to the largest size.
    let small = s
        .ec2
        .create_volume(
            "us-east-1a",
            "10",
            &[("VolumeType", "io2"), ("Iops", "1000")],
        )
        .await;
    s.ec2
        .ok("ModifyVolume", &[("VolumeId", &small), ("Size", "65536")])
        .await;
    let v = s
        .ec2
        .wait_volume(&small, "grown", |v| v.get("size") == "65536")
        .await;
    assert_eq!(v.get("size"), "65536");
    let image = s.dir.path().join(format!("state/volumes/{small}.img"));
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::metadata(&image).unwrap().len() != io2_len {
        assert!(Instant::now() < deadline, "image of {small} not grown");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    s.sim.shutdown().await.unwrap();
}
