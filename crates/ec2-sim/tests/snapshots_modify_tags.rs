//! Snapshots (content copies), ModifyVolume (image growth), CreateTags / DeleteTags.
#![allow(clippy::unwrap_used)] // helpers outside #[test] fns, test code all the same

mod common;

use std::io::{Read as _, Seek as _, SeekFrom, Write as _};

use common::start;
use ec2_sim::Timing;

fn write_at(path: &std::path::Path, offset: u64, data: &[u8]) {
    let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.write_all(data).unwrap();
}

fn read_at(path: &std::path::Path, offset: u64, len: usize) -> Vec<u8> {
    let mut f = std::fs::File::open(path).unwrap();
    f.seek(SeekFrom::Start(offset)).unwrap();
    let mut buf = vec![0; len];
    f.read_exact(&mut buf).unwrap();
    buf
}

#[tokio::test]
async fn snapshot_copies_content_and_restores_it() {
    let s = start(Timing::Fast).await;
    let v = s.ec2.create_volume("us-east-1a", "1", &[]).await;
    s.ec2.wait_status(&v, "available").await;
    let image = s.dir.path().join(format!("state/volumes/{v}.img"));
    write_at(&image, 4096, b"before-snapshot");

    let x = s
        .ec2
        .ok(
            "CreateSnapshot",
            &[
                ("VolumeId", &v),
                ("Description", "nightly"),
                ("TagSpecification.1.ResourceType", "snapshot"),
                ("TagSpecification.1.Tag.1.Key", "k"),
                ("TagSpecification.1.Tag.1.Value", "v"),
            ],
        )
        .await;
    let snap = x.get("snapshotId");
    assert!(snap.starts_with("snap-") && snap.len() == 22, "{snap}");
    assert_eq!(x.get("status"), "pending");
    assert_eq!(x.get("volumeSize"), "1");
    assert_eq!(x.get("description"), "nightly");
    // Later writes do not change the snapshot.
    write_at(&image, 4096, b"after--snapshot");

    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let d = s
            .ec2
            .ok("DescribeSnapshots", &[("SnapshotId.1", &snap)])
            .await;
        let item = d.all("snapshotSet/item")[0].clone();
        if item.get("status") == "completed" {
            assert_eq!(item.get("progress"), "100%");
            assert_eq!(item.at("tagSet/item/key"), "k");
            break;
        }
        assert_eq!(item.get("status"), "pending");
        assert!(std::time::Instant::now() < deadline);
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    // Restores must be at least the snapshot's size; the default is its size.
    s.ec2
        .fails(
            "CreateVolume",
            &[
                ("AvailabilityZone", "us-east-1a"),
                ("SnapshotId", &snap),
                ("Size", "0"),
            ],
            400,
            "InvalidParameterValue",
        )
        .await;
    let r = s
        .ec2
        .ok(
            "CreateVolume",
            &[
                ("AvailabilityZone", "us-east-1b"),
                ("SnapshotId", &snap),
                ("Size", "2"),
            ],
        )
        .await;
    assert_eq!(r.get("snapshotId"), snap);
    let restored = r.get("volumeId");
    let rimage = s.dir.path().join(format!("state/volumes/{restored}.img"));
    assert_eq!(read_at(&rimage, 4096, 15), b"before-snapshot");
    assert_eq!(std::fs::metadata(&rimage).unwrap().len(), 2 << 30);

    let f = s
        .ec2
        .ok(
            "DescribeSnapshots",
            &[
                ("Filter.1.Name", "volume-id"),
                ("Filter.1.Value.1", &v),
                ("Owner.1", "self"),
            ],
        )
        .await;
    assert_eq!(f.all("snapshotSet/item").len(), 1);
    s.ec2.ok("DeleteSnapshot", &[("SnapshotId", &snap)]).await;
    s.ec2
        .fails(
            "DescribeSnapshots",
            &[("SnapshotId.1", &snap)],
            400,
            "InvalidSnapshot.NotFound",
        )
        .await;
    s.ec2
        .fails(
            "DeleteSnapshot",
            &[("SnapshotId", "snap-1")],
            400,
            "InvalidSnapshotID.Malformed",
        )
        .await;
}

#[tokio::test]
async fn modify_volume_states_and_growth() {
    let s = start(Timing::Fast).await;
    let v = s.ec2.create_volume("us-east-1a", "1", &[]).await;
    s.ec2.wait_status(&v, "available").await;
    s.ec2
        .fails(
            "ModifyVolume",
            &[("VolumeId", &v), ("Size", "0")],
            400,
            "InvalidParameterValue",
        )
        .await;
    s.ec2
        .fails("ModifyVolume", &[("VolumeId", &v)], 400, "MissingParameter")
        .await;
    s.ec2
        .fails(
            "ModifyVolume",
            &[("VolumeId", &v), ("Size", "1")],
            400,
            "InvalidParameterCombination",
        )
        .await;
    s.ec2
        .fails(
            "ModifyVolume",
            &[("VolumeId", &v), ("VolumeType", "io2")],
            400,
            "InvalidParameterValue",
        )
        .await;
    let x = s
        .ec2
        .ok(
            "ModifyVolume",
            &[("VolumeId", &v), ("Size", "8"), ("Iops", "4000")],
        )
        .await;
    assert_eq!(x.at("volumeModification/modificationState"), "modifying");
    assert_eq!(x.at("volumeModification/targetSize"), "8");
    assert_eq!(x.at("volumeModification/originalSize"), "1");
    assert_eq!(x.at("volumeModification/targetIops"), "4000");
    let mut states = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let d = s
            .ec2
            .ok("DescribeVolumesModifications", &[("VolumeId.1", &v)])
            .await;
        let state = d.at("volumeModificationSet/item/modificationState");
        if states.last() != Some(&state) {
            states.push(state.clone());
        }
        if state == "completed" {
            assert_eq!(d.at("volumeModificationSet/item/progress"), "100");
            break;
        }
        assert!(std::time::Instant::now() < deadline);
        tokio::time::sleep(std::time::Duration::from_millis(3)).await;
    }
    // Observed states follow modifying -> optimizing -> completed (polling may skip some).
    let order = ["modifying", "optimizing", "completed"];
    let ranks: Vec<usize> = states
        .iter()
        .map(|st| order.iter().position(|o| o == st).expect("known state"))
        .collect();
    assert!(ranks.windows(2).all(|w| w[0] < w[1]), "{states:?}");
    let vol = s.ec2.volume(&v).await;
    assert_eq!(vol.get("size"), "8");
    assert_eq!(vol.get("iops"), "4000");
    let image = s.dir.path().join(format!("state/volumes/{v}.img"));
    assert_eq!(std::fs::metadata(&image).unwrap().len(), 8 << 30);
    // Shrinking is refused.
    s.ec2
        .fails(
            "ModifyVolume",
            &[("VolumeId", &v), ("Size", "7")],
            400,
            "InvalidParameterValue",
        )
        .await;
    let other = s.ec2.create_volume("us-east-1a", "1", &[]).await;
    s.ec2
        .fails(
            "DescribeVolumesModifications",
            &[("VolumeId.1", &other)],
            400,
            "InvalidVolumeModification.NotFound",
        )
        .await;
    // Provisioned IOPS carry over from gp3 to io2.
    s.ec2
        .ok("ModifyVolume", &[("VolumeId", &v), ("VolumeType", "io2")])
        .await;
    let d = s
        .ec2
        .ok("DescribeVolumesModifications", &[("VolumeId.1", &v)])
        .await;
    assert_eq!(d.at("volumeModificationSet/item/targetVolumeType"), "io2");
    assert_eq!(d.at("volumeModificationSet/item/targetIops"), "4000");
    assert_eq!(d.at("volumeModificationSet/item/originalVolumeType"), "gp3");
}

#[tokio::test]
async fn create_and_delete_tags() {
    let s = start(Timing::Instant).await;
    let v = s.ec2.create_volume("us-east-1a", "1", &[]).await;
    let i = s.ec2.run_instance("us-east-1a").await;
    s.ec2
        .ok(
            "CreateTags",
            &[
                ("ResourceId.1", &v),
                ("ResourceId.2", &i),
                ("Tag.1.Key", "a"),
                ("Tag.1.Value", "1"),
                ("Tag.2.Key", "b"),
                ("Tag.2.Value", "2"),
            ],
        )
        .await;
    let tags = |n: &common::Node| -> Vec<(String, String)> {
        n.all("tagSet/item")
            .iter()
            .map(|t| (t.get("key"), t.get("value")))
            .collect()
    };
    assert_eq!(
        tags(&s.ec2.volume(&v).await),
        vec![
            ("a".to_string(), "1".to_string()),
            ("b".to_string(), "2".to_string())
        ]
    );
    // Overwrite a value.
    s.ec2
        .ok(
            "CreateTags",
            &[
                ("ResourceId.1", &v),
                ("Tag.1.Key", "a"),
                ("Tag.1.Value", "9"),
            ],
        )
        .await;
    // DeleteTags with a non-matching value keeps the tag; without a value removes it.
    s.ec2
        .ok(
            "DeleteTags",
            &[
                ("ResourceId.1", &v),
                ("Tag.1.Key", "a"),
                ("Tag.1.Value", "1"),
            ],
        )
        .await;
    assert_eq!(tags(&s.ec2.volume(&v).await).len(), 2);
    s.ec2
        .ok("DeleteTags", &[("ResourceId.1", &v), ("Tag.1.Key", "a")])
        .await;
    assert_eq!(
        tags(&s.ec2.volume(&v).await),
        vec![("b".to_string(), "2".to_string())]
    );
    let d = s
        .ec2
        .ok(
            "DescribeInstances",
            &[("Filter.1.Name", "tag:a"), ("Filter.1.Value.1", "1")],
        )
        .await;
    assert_eq!(d.at("reservationSet/item/instancesSet/item/instanceId"), i);
    s.ec2
        .fails(
            "CreateTags",
            &[
                ("ResourceId.1", "vol-0000000000000000f"),
                ("Tag.1.Key", "a"),
            ],
            400,
            "InvalidVolume.NotFound",
        )
        .await;
    s.ec2
        .fails(
            "CreateTags",
            &[("ResourceId.1", "ami-12345678"), ("Tag.1.Key", "a")],
            400,
            "InvalidID",
        )
        .await;
    s.ec2
        .fails(
            "CreateTags",
            &[("ResourceId.1", &v), ("Tag.1.Key", "aws:x")],
            400,
            "InvalidParameterValue",
        )
        .await;
    s.ec2
        .fails(
            "CreateTags",
            &[("ResourceId.1", &v)],
            400,
            "MissingParameter",
        )
        .await;
    let mut many: Vec<(String, String)> = Vec::new();
    for n in 1..=50 {
        many.push((format!("Tag.{n}.Key"), format!("k{n}")));
    }
    let mut p: Vec<(&str, &str)> = vec![("ResourceId.1", v.as_str())];
    p.extend(many.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    s.ec2.fails("CreateTags", &p, 400, "TagLimitExceeded").await;
}
