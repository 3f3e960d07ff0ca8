//! CreateSnapshot / DescribeSnapshots / DeleteSnapshot, and volumes from snapshots.

use aws_sdk_ec2::types::{ResourceType, SnapshotState, TagSpecification, VolumeState};
use ec2_conformance::{Flavor, wait};

use crate::common::*;

crate::both_endpoints!(snapshot_lifecycle, snapshot_errors);

async fn snapshot_state(t: &Target, id: &str) -> Option<SnapshotState> {
    let out = t
        .client
        .describe_snapshots()
        .snapshot_ids(id)
        .send()
        .await
        .unwrap();
    out.snapshots()[0].state().cloned()
}

async fn snapshot_lifecycle(t: &Target) {
    let c = &t.client;
    let vol = available_volume(c, ZONE_A, 12).await;
    let out = c
        .create_snapshot()
        .volume_id(&vol)
        .description("conformance snapshot")
        .tag_specifications(
            TagSpecification::builder()
                .resource_type(ResourceType::Snapshot)
                .tags(tag("purpose", "test"))
                .build(),
        )
        .send()
        .await
        .unwrap();
    let snap = out.snapshot_id().unwrap().to_string();
    assert!(snap.starts_with("snap-") && snap.len() == 22, "{snap}");
    assert_eq!(out.volume_id(), Some(vol.as_str()));
    assert_eq!(out.volume_size(), Some(12));
    assert_eq!(out.description(), Some("conformance snapshot"));
    assert_eq!(tag_pairs(out.tags()), pairs(&[("purpose", "test")]));
    assert_recent("StartTime", out.start_time());
    assert!(out.owner_id().is_some_and(|o| o.len() == 12), "{out:?}");
    match t.flavor {
        Flavor::Aws => assert_eq!(out.state(), Some(&SnapshotState::Pending)),
        // moto completes snapshots at once.
        Flavor::Moto => assert_eq!(out.state(), Some(&SnapshotState::Completed)),
    }

    let deadline = std::time::Instant::now() + WAIT;
    while snapshot_state(t, &snap).await != Some(SnapshotState::Completed) {
        assert!(
            std::time::Instant::now() < deadline,
            "snapshot never completed"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let desc = c
        .describe_snapshots()
        .snapshot_ids(&snap)
        .send()
        .await
        .unwrap();
    let s = &desc.snapshots()[0];
    assert_eq!(s.progress(), Some("100%"));
    assert_eq!(s.volume_id(), Some(vol.as_str()));
    assert_eq!(s.volume_size(), Some(12));
    assert_eq!(s.description(), Some("conformance snapshot"));
    assert_eq!(tag_pairs(s.tags()), pairs(&[("purpose", "test")]));
    // Filtered by the source volume.
    let by_volume = c
        .describe_snapshots()
        .filters(
            aws_sdk_ec2::types::Filter::builder()
                .name("volume-id")
                .values(&vol)
                .build(),
        )
        .send()
        .await
        .unwrap();
    let ids: Vec<&str> = by_volume
        .snapshots()
        .iter()
        .filter_map(|s| s.snapshot_id())
        .collect();
    assert_eq!(ids, [snap.as_str()]);

    // A volume from the snapshot takes the snapshot's size unless told otherwise.
    let restored = c
        .create_volume()
        .availability_zone(ZONE_A)
        .snapshot_id(&snap)
        .send()
        .await
        .unwrap();
    assert_eq!(restored.size(), Some(12));
    assert_eq!(restored.snapshot_id(), Some(snap.as_str()));
    let restored = restored.volume_id().unwrap().to_string();
    wait::volume_state(c, &restored, VolumeState::Available, WAIT)
        .await
        .unwrap();
    let bigger = c
        .create_volume()
        .availability_zone(ZONE_A)
        .snapshot_id(&snap)
        .size(20)
        .send()
        .await
        .unwrap();
    assert_eq!(bigger.size(), Some(20));
    let smaller = c
        .create_volume()
        .availability_zone(ZONE_A)
        .snapshot_id(&snap)
        .size(5)
        .send()
        .await;
    match t.flavor {
        Flavor::Aws => assert_eq!(code_of(smaller), "InvalidParameterValue"),
        Flavor::Moto => assert_eq!(smaller.unwrap().size(), Some(5)),
    }

    c.delete_snapshot().snapshot_id(&snap).send().await.unwrap();
    let gone = c.describe_snapshots().snapshot_ids(&snap).send().await;
    assert_eq!(code_of(gone), "InvalidSnapshot.NotFound");
}

async fn snapshot_errors(t: &Target) {
    let c = &t.client;
    let absent_volume = c
        .create_snapshot()
        .volume_id("vol-0123456789abcdef0")
        .send()
        .await;
    assert_eq!(code_of(absent_volume), "InvalidVolume.NotFound");
    let absent = c
        .describe_snapshots()
        .snapshot_ids("snap-0123456789abcdef0")
        .send()
        .await;
    assert_eq!(code_of(absent), "InvalidSnapshot.NotFound");
    let delete_absent = c
        .delete_snapshot()
        .snapshot_id("snap-0123456789abcdef0")
        .send()
        .await;
    assert_eq!(code_of(delete_absent), "InvalidSnapshot.NotFound");
    let from_absent = c
        .create_volume()
        .availability_zone(ZONE_A)
        .snapshot_id("snap-0123456789abcdef0")
        .send()
        .await;
    assert_eq!(code_of(from_absent), "InvalidSnapshot.NotFound");
    let malformed = c.describe_snapshots().snapshot_ids("snap-xyz").send().await;
    match t.flavor {
        Flavor::Aws => assert_eq!(code_of(malformed), "InvalidSnapshotID.Malformed"),
        Flavor::Moto => assert_eq!(code_of(malformed), "InvalidSnapshot.NotFound"),
    }
}
