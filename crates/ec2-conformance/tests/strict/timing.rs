//! States pass through creating / attaching / detaching / pending / modifying and reach the
//! end state. Realistic timing (seconds per step) makes the intermediate states certain to be
//! seen by a poller; Instant makes them done by the next call.

use std::time::Duration;

use aws_sdk_ec2::client::Waiters;
use aws_sdk_ec2::types::{
    SnapshotState, VolumeAttachmentState, VolumeModificationState, VolumeState, VolumeType,
};
use ec2_conformance::wait::{self, Observed};
use ec2_sim::Timing;

use crate::common::*;

fn vol(state: VolumeState, attachment: Option<VolumeAttachmentState>) -> Observed {
    Observed {
        volume: Some(state),
        attachment,
    }
}

#[tokio::test]
async fn realistic_states_create_attach_detach() {
    let t = sim_with(|c| c.timing = Timing::Realistic);
    let c = &t.client;
    let out = c
        .create_volume()
        .availability_zone(ZONE_A)
        .size(4)
        .volume_type(VolumeType::Gp3)
        .send()
        .await
        .unwrap();
    let id = out.volume_id().unwrap().to_string();
    assert_eq!(out.state(), Some(&VolumeState::Creating));
    let (_, seen) = wait::volume_state(c, &id, VolumeState::Available, WAIT)
        .await
        .unwrap();
    assert_eq!(
        seen,
        [
            vol(VolumeState::Creating, None),
            vol(VolumeState::Available, None)
        ]
    );

    // An instance boots (pending -> running) meanwhile; attaching does not need running.
    let inst = instance(c, ZONE_A).await;
    c.attach_volume()
        .volume_id(&id)
        .instance_id(&inst)
        .device("/dev/xvdba")
        .send()
        .await
        .unwrap();
    let (_, seen) = wait::attachment_state(c, &id, &inst, VolumeAttachmentState::Attached, WAIT)
        .await
        .unwrap();
    assert_eq!(
        seen,
        [
            vol(VolumeState::InUse, Some(VolumeAttachmentState::Attaching)),
            vol(VolumeState::InUse, Some(VolumeAttachmentState::Attached)),
        ]
    );

    c.detach_volume()
        .volume_id(&id)
        .instance_id(&inst)
        .send()
        .await
        .unwrap();
    let (_, seen) = wait::detached(c, &id, &inst, WAIT).await.unwrap();
    assert_eq!(
        seen,
        [
            vol(VolumeState::InUse, Some(VolumeAttachmentState::Detaching)),
            vol(VolumeState::Available, None),
        ]
    );
}

#[tokio::test]
async fn realistic_attach_while_creating_is_incorrect_state() {
    let t = sim_with(|c| c.timing = Timing::Realistic);
    let c = &t.client;
    let inst = instance(c, ZONE_A).await;
    let out = c
        .create_volume()
        .availability_zone(ZONE_A)
        .size(4)
        .send()
        .await
        .unwrap();
    let id = out.volume_id().unwrap();
    // Creation takes at least a second with realistic timing.
    let early = c
        .attach_volume()
        .volume_id(id)
        .instance_id(&inst)
        .device("/dev/xvdba")
        .send()
        .await;
    assert_eq!(code_of(early), "IncorrectState");
    let snapshot = c.create_snapshot().volume_id(id).send().await;
    assert_eq!(code_of(snapshot), "IncorrectState");
}

#[tokio::test]
async fn instant_timing_is_done_by_the_next_call() {
    let t = sim_with(|c| c.timing = Timing::Instant);
    let c = &t.client;
    let out = c
        .create_volume()
        .availability_zone(ZONE_A)
        .size(4)
        .send()
        .await
        .unwrap();
    // The response still says creating, as AWS's does...
    assert_eq!(out.state(), Some(&VolumeState::Creating));
    let id = out.volume_id().unwrap().to_string();
    // ...and the very next call sees the end state.
    let v = wait::describe_volume(c, &id).await.unwrap().unwrap();
    assert_eq!(v.state(), Some(&VolumeState::Available));
    let inst = instance(c, ZONE_A).await;
    let out = c
        .attach_volume()
        .volume_id(&id)
        .instance_id(&inst)
        .device("/dev/xvdba")
        .send()
        .await
        .unwrap();
    assert_eq!(out.state(), Some(&VolumeAttachmentState::Attaching));
    let v = wait::describe_volume(c, &id).await.unwrap().unwrap();
    assert_eq!(
        v.attachments()[0].state(),
        Some(&VolumeAttachmentState::Attached)
    );

    // The SDK's own waiters understand the simulator's answers too. (Their first check is
    // immediate and later ones 15 s apart, hence instant timing here.)
    let second = c
        .create_volume()
        .availability_zone(ZONE_A)
        .size(4)
        .send()
        .await
        .unwrap();
    c.wait_until_volume_available()
        .volume_ids(second.volume_id().unwrap())
        .wait(Duration::from_secs(30))
        .await
        .unwrap();
    c.wait_until_volume_in_use()
        .volume_ids(&id)
        .wait(Duration::from_secs(30))
        .await
        .unwrap();
}

#[tokio::test]
async fn fast_snapshot_and_modification_states() {
    let t = sim();
    let c = &t.client;
    let id = available_volume(c, ZONE_A, 10).await;
    let snap = c.create_snapshot().volume_id(&id).send().await.unwrap();
    assert_eq!(snap.state(), Some(&SnapshotState::Pending));
    let snap_id = snap.snapshot_id().unwrap().to_string();
    let mut states = Vec::new();
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let out = c
            .describe_snapshots()
            .snapshot_ids(&snap_id)
            .send()
            .await
            .unwrap();
        let s = out.snapshots()[0].clone();
        let state = s.state().cloned().unwrap();
        if states.last() != Some(&state) {
            states.push(state.clone());
        }
        if state == SnapshotState::Completed {
            assert_eq!(s.progress(), Some("100%"));
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{states:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(states.last(), Some(&SnapshotState::Completed));
    assert!(
        states
            .iter()
            .all(|s| matches!(s, SnapshotState::Pending | SnapshotState::Completed)),
        "{states:?}"
    );

    let out = c
        .modify_volume()
        .volume_id(&id)
        .size(12)
        .send()
        .await
        .unwrap();
    let m = out.volume_modification().unwrap();
    assert_eq!(
        m.modification_state(),
        Some(&VolumeModificationState::Modifying)
    );
    let mut states = vec![VolumeModificationState::Modifying];
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let out = c
            .describe_volumes_modifications()
            .volume_ids(&id)
            .send()
            .await
            .unwrap();
        let state = out.volumes_modifications()[0]
            .modification_state()
            .cloned()
            .unwrap();
        if states.last() != Some(&state) {
            states.push(state.clone());
        }
        if state == VolumeModificationState::Completed {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{states:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // modifying -> (optimizing) -> completed, never backwards.
    let order = |s: &VolumeModificationState| match s {
        VolumeModificationState::Modifying => 0,
        VolumeModificationState::Optimizing => 1,
        VolumeModificationState::Completed => 2,
        other => panic!("unexpected modification state {other:?}"),
    };
    assert!(
        states.windows(2).all(|w| order(&w[0]) < order(&w[1])),
        "{states:?}"
    );
    let v = wait::describe_volume(c, &id).await.unwrap().unwrap();
    assert_eq!(v.size(), Some(12));
}

#[tokio::test]
async fn one_modification_at_a_time() {
    let t = sim_with(|c| c.timing = Timing::Instant);
    let c = &t.client;
    let id = available_volume(c, ZONE_A, 10).await;
    // Instant: the first modification is complete by the next call, so a second is allowed.
    c.modify_volume()
        .volume_id(&id)
        .size(11)
        .send()
        .await
        .unwrap();
    c.modify_volume()
        .volume_id(&id)
        .size(12)
        .send()
        .await
        .unwrap();

    let t = sim_with(|c| c.timing = Timing::Realistic);
    let c = &t.client;
    let out = c
        .create_volume()
        .availability_zone(ZONE_A)
        .size(10)
        .volume_type(VolumeType::Gp3)
        .send()
        .await
        .unwrap();
    let id = out.volume_id().unwrap().to_string();
    let early = c.modify_volume().volume_id(&id).size(11).send().await;
    assert_eq!(
        code_of(early),
        "IncorrectState",
        "modifying a creating volume"
    );
    wait::volume_state(c, &id, VolumeState::Available, WAIT)
        .await
        .unwrap();
    c.modify_volume()
        .volume_id(&id)
        .size(11)
        .send()
        .await
        .unwrap();
    // The first one takes seconds; a second one meanwhile is refused.
    let second = c.modify_volume().volume_id(&id).size(12).send().await;
    assert_eq!(code_of(second), "IncorrectModificationState");
}
