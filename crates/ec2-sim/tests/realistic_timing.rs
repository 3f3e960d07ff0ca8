//! Checks that need a state to last: with Timing::Realistic, creating, pending and modifying
//! take seconds, so the calls made meanwhile deterministically see them.

mod common;

use common::start;
use ec2_sim::Timing;

#[tokio::test]
async fn transitional_states_refuse_what_aws_refuses() {
    let s = start(Timing::Realistic).await;
    let i = s.ec2.run_instance("us-east-1a").await;
    let v = s.ec2.create_volume("us-east-1a", "8", &[]).await;
    // creating (1-2 s): no attach, snapshot or modification yet.
    assert_eq!(s.ec2.volume(&v).await.get("status"), "creating");
    s.ec2
        .fails(
            "AttachVolume",
            &[
                ("VolumeId", &v),
                ("InstanceId", &i),
                ("Device", "/dev/xvdba"),
            ],
            400,
            "IncorrectState",
        )
        .await;
    s.ec2
        .fails("CreateSnapshot", &[("VolumeId", &v)], 400, "IncorrectState")
        .await;
    s.ec2
        .fails(
            "ModifyVolume",
            &[("VolumeId", &v), ("Size", "9")],
            400,
            "IncorrectState",
        )
        .await;
    s.ec2.wait_status(&v, "available").await;

    // A pending snapshot (5-15 s) cannot be restored yet.
    let snap = s
        .ec2
        .ok("CreateSnapshot", &[("VolumeId", &v)])
        .await
        .get("snapshotId");
    let d = s
        .ec2
        .ok("DescribeSnapshots", &[("SnapshotId.1", &snap)])
        .await;
    assert_eq!(d.at("snapshotSet/item/status"), "pending");
    assert_ne!(d.at("snapshotSet/item/progress"), "100%");
    s.ec2
        .fails(
            "CreateVolume",
            &[("AvailabilityZone", "us-east-1a"), ("SnapshotId", &snap)],
            400,
            "IncorrectState",
        )
        .await;

    // One modification at a time (modifying lasts 2-5 s).
    s.ec2
        .ok("ModifyVolume", &[("VolumeId", &v), ("Size", "9")])
        .await;
    s.ec2
        .fails(
            "ModifyVolume",
            &[("VolumeId", &v), ("Size", "10")],
            400,
            "IncorrectModificationState",
        )
        .await;
    let m = s
        .ec2
        .ok("DescribeVolumesModifications", &[("VolumeId.1", &v)])
        .await;
    assert_eq!(
        m.at("volumeModificationSet/item/modificationState"),
        "modifying"
    );
    // The size changes only when optimizing begins.
    assert_eq!(s.ec2.volume(&v).await.get("size"), "8");

    // attaching lasts 1-4 s.
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
    assert_eq!(
        s.ec2.volume(&v).await.at("attachmentSet/item/status"),
        "attaching"
    );
}
