//! Instances and attachments: AttachVolume / DetachVolume rules, DescribeInstances mappings.

mod common;

use common::start;
use ec2_sim::{SimConfig, Timing};

#[tokio::test]
async fn run_describe_terminate_instances() {
    let s = start(Timing::Fast).await;
    let x = s
        .ec2
        .ok(
            "RunInstances",
            &[
                ("ImageId", "ami-anything"),
                ("MinCount", "2"),
                ("MaxCount", "2"),
                ("InstanceType", "t3.micro"),
                ("Placement.AvailabilityZone", "us-east-1b"),
                ("TagSpecification.1.ResourceType", "instance"),
                ("TagSpecification.1.Tag.1.Key", "Name"),
                ("TagSpecification.1.Tag.1.Value", "node-1"),
            ],
        )
        .await;
    assert!(x.get("reservationId").starts_with("r-"));
    let items = x.all("instancesSet/item");
    assert_eq!(items.len(), 2);
    let id = items[0].get("instanceId");
    assert!(id.starts_with("i-") && id.len() == 19, "{id}");
    assert_eq!(items[0].at("instanceState/name"), "pending");
    assert_eq!(items[0].at("placement/availabilityZone"), "us-east-1b");
    assert_eq!(items[0].get("instanceType"), "t3.micro");

    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let d = s
            .ec2
            .ok("DescribeInstances", &[("InstanceId.1", &id)])
            .await;
        let state = d.at("reservationSet/item/instancesSet/item/instanceState/name");
        if state == "running" {
            assert_eq!(
                d.at("reservationSet/item/instancesSet/item/tagSet/item/value"),
                "node-1"
            );
            break;
        }
        assert_eq!(state, "pending");
        assert!(std::time::Instant::now() < deadline);
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let d = s
        .ec2
        .ok(
            "DescribeInstances",
            &[
                ("Filter.1.Name", "instance-state-name"),
                ("Filter.1.Value.1", "running"),
            ],
        )
        .await;
    assert_eq!(d.all("reservationSet/item").len(), 1, "one reservation");
    assert_eq!(d.all("reservationSet/item/instancesSet/item").len(), 2);

    let t = s
        .ec2
        .ok("TerminateInstances", &[("InstanceId.1", &id)])
        .await;
    assert_eq!(t.at("instancesSet/item/currentState/name"), "shutting-down");
    assert_eq!(t.at("instancesSet/item/previousState/name"), "running");
    s.ec2
        .fails(
            "DescribeInstances",
            &[("InstanceId.1", "i-0000000000000000f")],
            400,
            "InvalidInstanceID.NotFound",
        )
        .await;
    s.ec2
        .fails(
            "TerminateInstances",
            &[("InstanceId.1", "i-zz")],
            400,
            "InvalidInstanceID.Malformed",
        )
        .await;
    s.ec2
        .fails(
            "RunInstances",
            &[
                ("ImageId", "ami-1"),
                ("MinCount", "1"),
                ("MaxCount", "1"),
                ("Placement.AvailabilityZone", "mars-1a"),
            ],
            400,
            "InvalidParameterValue",
        )
        .await;
}

#[tokio::test]
async fn run_instances_client_token() {
    let s = start(Timing::Instant).await;
    let p = [
        ("ImageId", "ami-1"),
        ("MinCount", "1"),
        ("MaxCount", "1"),
        ("ClientToken", "node-a"),
    ];
    let a = s
        .ec2
        .ok("RunInstances", &p)
        .await
        .at("instancesSet/item/instanceId");
    let b = s
        .ec2
        .ok("RunInstances", &p)
        .await
        .at("instancesSet/item/instanceId");
    assert_eq!(a, b);
    s.ec2
        .fails(
            "RunInstances",
            &[
                ("ImageId", "ami-2"),
                ("MinCount", "1"),
                ("MaxCount", "1"),
                ("ClientToken", "node-a"),
            ],
            400,
            "IdempotentParameterMismatch",
        )
        .await;
}

#[tokio::test]
async fn attach_and_detach_lifecycle() {
    let s = start(Timing::Fast).await;
    let i = s.ec2.run_instance("us-east-1a").await;
    let v = s.ec2.create_volume("us-east-1a", "1", &[]).await;
    s.ec2.wait_status(&v, "available").await;
    let x = s
        .ec2
        .ok(
            "AttachVolume",
            &[
                ("VolumeId", &v),
                ("InstanceId", &i),
                ("Device", "/dev/xvdba"),
            ],
        )
        .await;
    assert_eq!(x.get("status"), "attaching");
    assert_eq!(x.get("device"), "/dev/xvdba");
    assert_eq!(x.get("instanceId"), i);
    let now = s.ec2.volume(&v).await;
    assert_eq!(now.get("status"), "in-use");
    let att = s.ec2.wait_attached(&v).await;
    assert_eq!(att.at("attachmentSet/item/instanceId"), i);
    assert_eq!(att.at("attachmentSet/item/deleteOnTermination"), "false");

    // DescribeInstances shows the mapping; DescribeVolumes filters by instance.
    let d = s.ec2.ok("DescribeInstances", &[("InstanceId.1", &i)]).await;
    let bdm = d.all("reservationSet/item/instancesSet/item/blockDeviceMapping/item");
    assert_eq!(bdm.len(), 1);
    assert_eq!(bdm[0].get("deviceName"), "/dev/xvdba");
    assert_eq!(bdm[0].at("ebs/volumeId"), v);
    assert_eq!(bdm[0].at("ebs/status"), "attached");
    let f = s
        .ec2
        .ok(
            "DescribeVolumes",
            &[
                ("Filter.1.Name", "attachment.instance-id"),
                ("Filter.1.Value.1", &i),
            ],
        )
        .await;
    assert_eq!(f.at("volumeSet/item/volumeId"), v);

    s.ec2
        .fails("DeleteVolume", &[("VolumeId", &v)], 400, "VolumeInUse")
        .await;

    let other = s.ec2.run_instance("us-east-1a").await;
    s.ec2
        .fails(
            "DetachVolume",
            &[("VolumeId", &v), ("InstanceId", &other)],
            400,
            "InvalidAttachment.NotFound",
        )
        .await;
    let x = s
        .ec2
        .ok("DetachVolume", &[("VolumeId", &v), ("InstanceId", &i)])
        .await;
    assert_eq!(x.get("status"), "detaching");
    s.ec2.wait_status(&v, "available").await;
    s.ec2
        .fails("DetachVolume", &[("VolumeId", &v)], 400, "IncorrectState")
        .await;
}

fn att<'a>(v: &'a str, i: &'a str, d: &'a str) -> [(&'static str, &'a str); 3] {
    [("VolumeId", v), ("InstanceId", i), ("Device", d)]
}

#[tokio::test]
async fn attach_rules_like_aws() {
    let s = start(Timing::Instant).await;
    let i1 = s.ec2.run_instance("us-east-1a").await;
    let i2 = s.ec2.run_instance("us-east-1a").await;
    let ib = s.ec2.run_instance("us-east-1b").await;
    let v1 = s.ec2.create_volume("us-east-1a", "1", &[]).await;
    let v2 = s.ec2.create_volume("us-east-1a", "1", &[]).await;
    s.ec2.ok("AttachVolume", &att(&v1, &i1, "/dev/xvdba")).await;
    // One attachment per volume unless Multi-Attach.
    s.ec2
        .fails(
            "AttachVolume",
            &att(&v1, &i2, "/dev/xvdba"),
            400,
            "VolumeInUse",
        )
        .await;
    // A device name is used once per instance (sdX and xvdX are the same point).
    s.ec2
        .fails(
            "AttachVolume",
            &att(&v2, &i1, "/dev/xvdba"),
            400,
            "InvalidParameterValue",
        )
        .await;
    s.ec2
        .fails(
            "AttachVolume",
            &att(&v2, &i1, "/dev/xvda"),
            400,
            "InvalidParameterValue",
        )
        .await;
    // Device name syntax.
    for bad in ["xvdf", "/dev/nvme1n1", "/dev/xvdabc", "/dev/sdf16"] {
        s.ec2
            .fails(
                "AttachVolume",
                &att(&v2, &i1, bad),
                400,
                "InvalidParameterValue",
            )
            .await;
    }
    // Zones must match.
    s.ec2
        .fails(
            "AttachVolume",
            &att(&v2, &ib, "/dev/xvdbb"),
            400,
            "InvalidVolume.ZoneMismatch",
        )
        .await;
    s.ec2
        .fails(
            "AttachVolume",
            &att(&v2, "i-0000000000000000f", "/dev/xvdbb"),
            400,
            "InvalidInstanceID.NotFound",
        )
        .await;
    s.ec2
        .fails(
            "AttachVolume",
            &att("vol-x", &i1, "/dev/xvdbb"),
            400,
            "InvalidVolumeID.Malformed",
        )
        .await;
    s.ec2
        .fails(
            "AttachVolume",
            &att(&v2, &i1, "/dev/xvdbb")[..2],
            400,
            "MissingParameter",
        )
        .await;
    s.ec2
        .fails(
            "AttachVolume",
            &[
                ("VolumeId", &v2),
                ("InstanceId", &i1),
                ("Device", "/dev/xvdbb"),
                ("DryRun", "true"),
            ],
            412,
            "DryRunOperation",
        )
        .await;
    s.ec2.ok("AttachVolume", &att(&v2, &i1, "/dev/sdf")).await;
    // Terminated instances take no new volumes; their volumes come free.
    s.ec2
        .ok("TerminateInstances", &[("InstanceId.1", &i1)])
        .await;
    s.ec2.wait_status(&v1, "available").await;
    s.ec2.wait_status(&v2, "available").await;
    let v3 = s.ec2.create_volume("us-east-1a", "1", &[]).await;
    // Instant timing: the instance is already terminated.
    s.ec2
        .fails(
            "AttachVolume",
            &att(&v3, &i1, "/dev/xvdbc"),
            400,
            "IncorrectInstanceState",
        )
        .await;
}

#[tokio::test]
async fn multi_attach_io2() {
    let s = start(Timing::Instant).await;
    let i1 = s.ec2.run_instance("us-east-1a").await;
    let i2 = s.ec2.run_instance("us-east-1a").await;
    let v = s
        .ec2
        .ok(
            "CreateVolume",
            &[
                ("AvailabilityZone", "us-east-1a"),
                ("Size", "4"),
                ("VolumeType", "io2"),
                ("Iops", "100"),
                ("MultiAttachEnabled", "true"),
            ],
        )
        .await
        .get("volumeId");
    s.ec2
        .ok(
            "AttachVolume",
            &[
                ("VolumeId", &v),
                ("InstanceId", &i1),
                ("Device", "/dev/xvdba"),
            ],
        )
        .await;
    s.ec2
        .ok(
            "AttachVolume",
            &[
                ("VolumeId", &v),
                ("InstanceId", &i2),
                ("Device", "/dev/xvdba"),
            ],
        )
        .await;
    s.ec2
        .fails(
            "AttachVolume",
            &[
                ("VolumeId", &v),
                ("InstanceId", &i2),
                ("Device", "/dev/xvdbb"),
            ],
            400,
            "VolumeInUse",
        )
        .await;
    let x = s.ec2.volume(&v).await;
    assert_eq!(x.all("attachmentSet/item").len(), 2);
    // With two attachments, DetachVolume needs the instance.
    s.ec2
        .fails(
            "DetachVolume",
            &[("VolumeId", &v)],
            400,
            "InvalidParameterCombination",
        )
        .await;
    s.ec2
        .ok("DetachVolume", &[("VolumeId", &v), ("InstanceId", &i1)])
        .await;
    let x = s.ec2.volume(&v).await;
    assert_eq!(x.all("attachmentSet/item").len(), 1);
    assert_eq!(x.get("status"), "in-use");
}

#[tokio::test]
async fn attachment_limit_per_instance() {
    let s = common::start_with(SimConfig {
        timing: Timing::Instant,
        max_attachments_per_instance: 2,
        ..SimConfig::default()
    })
    .await;
    let i = s.ec2.run_instance("us-east-1a").await;
    for (n, dev) in ["/dev/xvdba", "/dev/xvdbb", "/dev/xvdbc"]
        .iter()
        .enumerate()
    {
        let v = s.ec2.create_volume("us-east-1a", "1", &[]).await;
        let p = [
            ("VolumeId", v.as_str()),
            ("InstanceId", i.as_str()),
            ("Device", dev),
        ];
        if n < 2 {
            s.ec2.ok("AttachVolume", &p).await;
        } else {
            s.ec2
                .fails("AttachVolume", &p, 400, "AttachmentLimitExceeded")
                .await;
        }
    }
}

/// The attachment history: a volume moved between two instances (the second attach refused
/// with VolumeInUse while the first holds it) is recorded change by change with no double
/// attachment; a Multi-Attach volume's two holders are reported, but not as a double
/// attachment; `GET /_sim/attachments` answers the same record.
#[tokio::test]
async fn attachment_history_records_moves_and_multi_attach() {
    let s = start(Timing::Fast).await;
    let i1 = s.ec2.run_instance("us-east-1a").await;
    let i2 = s.ec2.run_instance("us-east-1a").await;
    let v = s.ec2.create_volume("us-east-1a", "1", &[]).await;
    s.ec2.wait_status(&v, "available").await;
    s.ec2.ok("AttachVolume", &att(&v, &i1, "/dev/xvdba")).await;
    s.ec2
        .fails(
            "AttachVolume",
            &att(&v, &i2, "/dev/xvdba"),
            400,
            "VolumeInUse",
        )
        .await;
    s.ec2.wait_attached(&v).await;
    s.ec2
        .ok("DetachVolume", &[("VolumeId", &v), ("InstanceId", &i1)])
        .await;
    // Refused while the detach is still in progress, too.
    s.ec2
        .fails(
            "AttachVolume",
            &att(&v, &i2, "/dev/xvdba"),
            400,
            "VolumeInUse",
        )
        .await;
    s.ec2.wait_status(&v, "available").await;
    s.ec2.ok("AttachVolume", &att(&v, &i2, "/dev/xvdba")).await;
    s.ec2.wait_attached(&v).await;
    // A retry for the instance that holds it is refused too, but asks for no second holder.
    s.ec2
        .fails(
            "AttachVolume",
            &att(&v, &i2, "/dev/xvdbb"),
            400,
            "VolumeInUse",
        )
        .await;

    let h = s.sim.attachment_history();
    let refused: Vec<(&str, &str, Vec<String>)> = h
        .refused
        .iter()
        .map(|r| {
            (
                r.volume_id.as_str(),
                r.instance_id.as_str(),
                r.held_by.clone(),
            )
        })
        .collect();
    assert_eq!(
        refused,
        vec![
            (v.as_str(), i2.as_str(), vec![i1.clone()]),
            (v.as_str(), i2.as_str(), vec![i1.clone()]),
        ]
    );
    let seen: Vec<(String, &str)> = h
        .of_volume(&v)
        .map(|e| (e.instance_id.clone(), e.state.as_str()))
        .collect();
    assert_eq!(
        seen,
        vec![
            (i1.clone(), "attaching"),
            (i1.clone(), "attached"),
            (i1.clone(), "detaching"),
            (i1.clone(), "detached"),
            (i2.clone(), "attaching"),
            (i2.clone(), "attached"),
        ]
    );
    assert!(
        h.events
            .windows(2)
            .all(|w| w[0].seq < w[1].seq && w[0].at_ms <= w[1].at_ms)
    );
    assert!(h.multi_holders().is_empty(), "{:?}", h.multi_holders());
    assert_eq!(h.dropped, 0);

    let m = s
        .ec2
        .ok(
            "CreateVolume",
            &[
                ("AvailabilityZone", "us-east-1a"),
                ("Size", "4"),
                ("VolumeType", "io2"),
                ("Iops", "100"),
                ("MultiAttachEnabled", "true"),
            ],
        )
        .await
        .get("volumeId");
    s.ec2.wait_status(&m, "available").await;
    s.ec2.ok("AttachVolume", &att(&m, &i1, "/dev/xvdbb")).await;
    s.ec2.ok("AttachVolume", &att(&m, &i2, "/dev/xvdbb")).await;
    let h = s.sim.attachment_history();
    // One entry per change while both hold it (their attaching → attached steps may land in
    // between).
    let multi = h.multi_holders();
    assert!(!multi.is_empty());
    let mut both = vec![i1.clone(), i2.clone()];
    both.sort();
    for moment in &multi {
        assert_eq!(moment.volume_id, m, "{multi:?}");
        assert!(moment.multi_attach, "{multi:?}");
        assert_eq!(moment.instances, both, "{multi:?}");
    }
    assert!(h.double_attachments().is_empty());

    let (status, body) = s.ec2.raw("GET", "/_sim/attachments", "").await;
    assert_eq!(status, 200, "{body}");
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(json["events"].as_array().unwrap().len() >= 8, "{json}");
    assert_eq!(json["events"][0]["state"], "attaching");
    assert_eq!(json["events"][0]["volumeId"], v.as_str());
    assert_eq!(json["doubleAttachments"].as_array().unwrap().len(), 0);
    assert_eq!(json["refused"][0]["heldBy"][0], i1.as_str());
    assert_eq!(json["dropped"], 0);
}
