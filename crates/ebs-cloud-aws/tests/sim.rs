//! AwsCloud through the real aws-sdk-ec2 against an in-process ec2-sim.
// The setup helpers are plain fns, not #[test]s; a failure in them is a test failure.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use ebs_cloud::{AttachmentState, Cloud, CloudError, CloudMetrics, DiskOptions};
use ebs_cloud_aws::{AwsCloud, AwsConfig, BatchConfig};
use ec2_sim::{Faults, SimConfig, Simulator, Throttle, Timing};

struct Env {
    sim: Simulator,
    _dir: tempfile::TempDir,
}

async fn sim(timing: Timing, max_attachments: usize) -> Env {
    let dir = tempfile::tempdir().unwrap();
    let config = SimConfig {
        state_dir: dir.path().to_path_buf(),
        timing,
        max_attachments_per_instance: max_attachments,
        ..SimConfig::default()
    };
    let sim = Simulator::start(config, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    Env { sim, _dir: dir }
}

async fn cloud(env: &Env, batching: bool) -> AwsCloud {
    let config = AwsConfig {
        region: Some("us-east-1".into()),
        endpoint: Some(env.sim.endpoint()),
        static_credentials: Some(("AKIDTEST".into(), "secret".into())),
        batching: BatchConfig {
            enabled: batching,
            ..BatchConfig::default()
        },
        poll_initial: Duration::from_millis(20),
        poll_max: Duration::from_millis(200),
        ..AwsConfig::default()
    };
    AwsCloud::new(config, CloudMetrics::new()).await.unwrap()
}

fn gp3(size: i64) -> DiskOptions {
    DiskOptions {
        size_gib: size,
        volume_type: "gp3".into(),
        zone: "us-east-1a".into(),
        ..DiskOptions::default()
    }
}

#[tokio::test]
async fn create_is_idempotent_by_name_and_mismatch_is_reported() {
    let env = sim(Timing::Fast, 26).await;
    let c = cloud(&env, true).await;
    let a = c.create_disk("pvc-one", &gp3(4)).await.unwrap();
    assert_eq!(a.state, "available");
    assert_eq!(a.size_gib, 4);
    assert_eq!(
        a.tags.get("CSIVolumeName").map(String::as_str),
        Some("pvc-one")
    );
    let b = c.create_disk("pvc-one", &gp3(4)).await.unwrap();
    assert_eq!(a.volume_id, b.volume_id);
    let by_name = c.get_disk_by_name("pvc-one").await.unwrap().unwrap();
    assert_eq!(by_name.volume_id, a.volume_id);
    assert!(c.get_disk_by_name("pvc-none").await.unwrap().is_none());

    let err = c.create_disk("pvc-one", &gp3(8)).await.unwrap_err();
    assert!(
        matches!(err, CloudError::IdempotentParameterMismatch { .. }),
        "{err}"
    );
    // Still exactly one volume for the name; the repeats found it by its name tag and sent
    // no second CreateVolume.
    let counts = env.sim.call_counts();
    assert_eq!(counts.get("CreateVolume"), Some(&1));
    assert!(c.get_disk_by_name("pvc-one").await.unwrap().is_some());
}

/// Deletes a volume and waits until no live volume carries `name`.
async fn delete_and_wait(c: &AwsCloud, name: &str, volume_id: &str) {
    assert!(c.delete_disk(volume_id).await.unwrap());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while c.get_disk_by_name(name).await.unwrap().is_some() {
        assert!(std::time::Instant::now() < deadline, "{volume_id} stays");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_name_whose_volume_was_deleted_gets_a_new_volume() {
    // EC2 remembers the client token of a deleted volume: the same token gives the deleted
    // volume back, or IdempotentParameterMismatch when a parameter differs. csi-sanity reuses
    // names that way, so the name's next generation must make a new volume.
    let env = sim(Timing::Fast, 26).await;
    let c = cloud(&env, true).await;
    let a = c.create_disk("pvc-again", &gp3(1)).await.unwrap();
    delete_and_wait(&c, "pvc-again", &a.volume_id).await;
    // Same parameters: generation 0's token answers with the deleted volume.
    let b = c.create_disk("pvc-again", &gp3(1)).await.unwrap();
    assert_ne!(b.volume_id, a.volume_id);
    assert_eq!(b.state, "available");
    // A repeat is the same volume (found by its tag, no CreateVolume).
    let calls = env.sim.call_counts()["CreateVolume"];
    assert_eq!(
        c.create_disk("pvc-again", &gp3(1)).await.unwrap().volume_id,
        b.volume_id
    );
    assert_eq!(env.sim.call_counts()["CreateVolume"], calls);
    delete_and_wait(&c, "pvc-again", &b.volume_id).await;
    // Other parameters: generations 0 and 1 answer IdempotentParameterMismatch, and no live
    // volume carries the name, so they are over; generation 2 makes the volume.
    let d = c.create_disk("pvc-again", &gp3(2)).await.unwrap();
    assert!(![&a.volume_id, &b.volume_id].contains(&&d.volume_id));
    assert_eq!(d.size_gib, 2);
    let by_name = c.get_disk_by_name("pvc-again").await.unwrap().unwrap();
    assert_eq!(by_name.volume_id, d.volume_id);
    // A new process walking the generations again (nothing in memory) ends on the same one.
    let fresh = cloud(&env, true).await;
    assert_eq!(
        fresh
            .create_disk("pvc-again", &gp3(2))
            .await
            .unwrap()
            .volume_id,
        d.volume_id
    );
    // While it lives the name is taken: other parameters are a mismatch, not a new volume.
    let err = fresh.create_disk("pvc-again", &gp3(4)).await.unwrap_err();
    assert!(
        matches!(err, CloudError::IdempotentParameterMismatch { .. }),
        "{err}"
    );
    assert_eq!(
        c.get_disk_by_name("pvc-again")
            .await
            .unwrap()
            .unwrap()
            .volume_id,
        d.volume_id
    );
}

#[tokio::test]
async fn concurrent_creates_of_a_reused_name_in_separate_processes_make_one_volume() {
    // Two drivers (separate AwsClouds: no shared memory, no in-process lock) create the same
    // name at once, after its first volume was deleted: both walk the same generations and
    // land on the one volume the first free token made.
    let env = sim(Timing::Fast, 26).await;
    let first = cloud(&env, true).await;
    let second = cloud(&env, false).await;
    let old = first.create_disk("pvc-race", &gp3(1)).await.unwrap();
    delete_and_wait(&first, "pvc-race", &old.volume_id).await;
    let options = gp3(1);
    for round in 0..3 {
        let (a, b) = tokio::join!(
            first.create_disk("pvc-race", &options),
            second.create_disk("pvc-race", &options)
        );
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!(a.volume_id, b.volume_id, "round {round}");
        assert_ne!(a.volume_id, old.volume_id);
        // Exactly one live volume carries the name (two would be an "Ambiguous" error).
        let by_name = first.get_disk_by_name("pvc-race").await.unwrap().unwrap();
        assert_eq!(by_name.volume_id, a.volume_id);
        delete_and_wait(&first, "pvc-race", &a.volume_id).await;
    }
}

#[tokio::test]
async fn delete_of_absent_volume_is_false_and_in_use_is_reported() {
    let env = sim(Timing::Fast, 26).await;
    let c = cloud(&env, true).await;
    assert!(!c.delete_disk("vol-0123456789abcdef0").await.unwrap());
    assert!(!c.delete_disk("not-a-volume").await.unwrap());
    let d = c.create_disk("pvc-del", &gp3(1)).await.unwrap();
    let i = c.run_instance("node-del", None).await.unwrap();
    c.attach_disk(&d.volume_id, &i.instance_id).await.unwrap();
    let err = c.delete_disk(&d.volume_id).await.unwrap_err();
    assert!(matches!(err, CloudError::VolumeInUse { .. }), "{err}");
    assert!(c.detach_disk(&d.volume_id, &i.instance_id).await.unwrap());
    c.wait_for_attachment_state(
        &d.volume_id,
        &i.instance_id,
        AttachmentState::Detached,
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    assert!(c.delete_disk(&d.volume_id).await.unwrap());
    assert!(!c.detach_disk(&d.volume_id, &i.instance_id).await.unwrap());
}

#[tokio::test]
async fn attach_allocates_distinct_devices_and_detach_waits() {
    let env = sim(Timing::Fast, 26).await;
    let c = cloud(&env, true).await;
    let i = c.run_instance("node-a", None).await.unwrap();
    assert_eq!(i.zone, "us-east-1a");
    let v1 = c.create_disk("pvc-a1", &gp3(1)).await.unwrap();
    let v2 = c.create_disk("pvc-a2", &gp3(1)).await.unwrap();
    let d1 = c.attach_disk(&v1.volume_id, &i.instance_id).await.unwrap();
    let d2 = c.attach_disk(&v2.volume_id, &i.instance_id).await.unwrap();
    assert_ne!(d1, d2);
    assert!(d1.starts_with("/dev/xvd"));
    let a = c
        .wait_for_attachment_state(
            &v1.volume_id,
            &i.instance_id,
            AttachmentState::Attached,
            Duration::from_secs(10),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(a.device, d1);
    // Attaching again returns the same device without a second AttachVolume.
    let before = env.sim.call_counts().get("AttachVolume").copied();
    assert_eq!(
        c.attach_disk(&v1.volume_id, &i.instance_id).await.unwrap(),
        d1
    );
    assert_eq!(env.sim.call_counts().get("AttachVolume").copied(), before);

    assert!(c.detach_disk(&v1.volume_id, &i.instance_id).await.unwrap());
    let gone = c
        .wait_for_attachment_state(
            &v1.volume_id,
            &i.instance_id,
            AttachmentState::Detached,
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    assert!(gone.is_none());
    let inst = c.get_instance(&i.instance_id).await.unwrap();
    assert_eq!(inst.devices.len(), 1);
    assert_eq!(inst.devices[0].device, d2);
    assert!(
        c.get_instance("i-0123456789abcdef0")
            .await
            .unwrap_err()
            .is_not_found()
    );
}

#[tokio::test]
async fn a_new_process_recovers_device_names_from_describe_instances() {
    let env = sim(Timing::Fast, 26).await;
    let first = cloud(&env, true).await;
    let i = first.run_instance("node-r", None).await.unwrap();
    let v1 = first.create_disk("pvc-r1", &gp3(1)).await.unwrap();
    let v2 = first.create_disk("pvc-r2", &gp3(1)).await.unwrap();
    let d1 = first
        .attach_disk(&v1.volume_id, &i.instance_id)
        .await
        .unwrap();
    drop(first);
    // "Restart": a fresh AwsCloud has nothing in memory.
    let second = cloud(&env, true).await;
    let d2 = second
        .attach_disk(&v2.volume_id, &i.instance_id)
        .await
        .unwrap();
    assert_ne!(d1, d2, "the new process must not reuse a taken name");
    assert_eq!(
        second
            .attach_disk(&v1.volume_id, &i.instance_id)
            .await
            .unwrap(),
        d1
    );
    // The same instance token names the same instance.
    assert_eq!(
        second
            .run_instance("node-r", None)
            .await
            .unwrap()
            .instance_id,
        i.instance_id
    );
}

#[tokio::test]
async fn concurrent_attaches_get_distinct_names_and_the_limit_is_reported() {
    let env = sim(Timing::Fast, 12).await;
    let c = Arc::new(cloud(&env, true).await);
    let i = c.run_instance("node-c", None).await.unwrap();
    let mut vols = Vec::new();
    for n in 0..14 {
        vols.push(
            c.create_disk(&format!("pvc-c{n}"), &gp3(1))
                .await
                .unwrap()
                .volume_id,
        );
    }
    let mut tasks = Vec::new();
    for v in &vols[..12] {
        let (c, v) = (c.clone(), v.clone());
        let inst = i.instance_id.clone();
        tasks.push(tokio::spawn(async move { c.attach_disk(&v, &inst).await }));
    }
    let mut devices = BTreeSet::new();
    for t in tasks {
        devices.insert(t.await.unwrap().unwrap());
    }
    assert_eq!(devices.len(), 12);
    let err = c.attach_disk(&vols[12], &i.instance_id).await.unwrap_err();
    assert!(matches!(err, CloudError::AttachmentLimit { .. }), "{err}");
}

#[tokio::test]
async fn batching_merges_concurrent_describes() {
    let env = sim(Timing::Fast, 26).await;
    for batching in [true, false] {
        let c = Arc::new(cloud(&env, batching).await);
        let mut ids = Vec::new();
        for n in 0..20 {
            ids.push(
                c.create_disk(&format!("pvc-b{batching}{n}"), &gp3(1))
                    .await
                    .unwrap()
                    .volume_id,
            );
        }
        ids.push("vol-0000000000000dead".into());
        env.sim.reset_call_counts();
        let mut tasks = Vec::new();
        for id in ids.clone() {
            let c = c.clone();
            tasks.push(tokio::spawn(async move {
                (id.clone(), c.get_disk_by_id(&id).await)
            }));
        }
        for t in tasks {
            let (id, r) = t.await.unwrap();
            if id.ends_with("dead") {
                assert!(r.unwrap_err().is_not_found());
            } else {
                assert_eq!(r.unwrap().volume_id, id);
            }
        }
        let calls = env
            .sim
            .call_counts()
            .get("DescribeVolumes")
            .copied()
            .unwrap_or(0);
        if batching {
            assert_eq!(calls, 1, "21 concurrent describes must be one call");
        } else {
            assert_eq!(calls, 21);
        }
    }
}

#[tokio::test]
async fn throttling_converges_and_is_counted() {
    let env = sim(Timing::Fast, 26).await;
    let c = cloud(&env, true).await;
    env.sim.set_faults(Faults {
        throttle: vec![
            Throttle {
                action: Some("CreateVolume".into()),
                rate: 0.0,
                next: 3,
            },
            Throttle {
                action: Some("DescribeVolumes".into()),
                rate: 0.3,
                next: 0,
            },
        ],
        ..Faults::default()
    });
    let d = c.create_disk("pvc-t", &gp3(1)).await.unwrap();
    assert_eq!(d.state, "available");
    assert_eq!(c.metrics().throttles("CreateVolume"), 3);
    assert_eq!(c.metrics().calls("CreateVolume"), 4);
    env.sim.set_faults(Faults::default());
    assert_eq!(
        c.get_disk_by_name("pvc-t")
            .await
            .unwrap()
            .unwrap()
            .volume_id,
        d.volume_id
    );
}

#[tokio::test]
async fn a_volume_with_an_unusable_kms_key_vanishes_without_a_leak() {
    let env = sim(Timing::Fast, 26).await;
    let c = cloud(&env, true).await;
    let opts = DiskOptions {
        encrypted: true,
        kms_key_id: Some("alias/does-not-exist".into()),
        ..gp3(1)
    };
    let err = c.create_disk("pvc-kms", &opts).await.unwrap_err();
    assert!(matches!(err, CloudError::KmsKeyUnavailable { .. }), "{err}");
    assert!(c.get_disk_by_name("pvc-kms").await.unwrap().is_none());
    // A retry reports the same, and leaves nothing behind (its volume, of the name's next
    // generation, vanishes as well).
    let err = c.create_disk("pvc-kms", &opts).await.unwrap_err();
    assert!(matches!(err, CloudError::KmsKeyUnavailable { .. }), "{err}");
    assert!(c.get_disk_by_name("pvc-kms").await.unwrap().is_none());
    // The default key works.
    let ok = c
        .create_disk(
            "pvc-kms-ok",
            &DiskOptions {
                encrypted: true,
                ..gp3(1)
            },
        )
        .await
        .unwrap();
    assert!(ok.encrypted);
}

#[tokio::test]
async fn snapshots_resize_and_zones() {
    let env = sim(Timing::Fast, 26).await;
    let c = cloud(&env, true).await;
    let zones = c.availability_zones().await.unwrap();
    assert_eq!(zones, vec!["us-east-1a", "us-east-1b", "us-east-1c"]);
    let d = c.create_disk("pvc-s", &gp3(2)).await.unwrap();
    let s = c
        .create_snapshot("snap-one", &d.volume_id, &[])
        .await
        .unwrap();
    let again = c
        .create_snapshot("snap-one", &d.volume_id, &[])
        .await
        .unwrap();
    assert_eq!(s.snapshot_id, again.snapshot_id);
    let other = c.create_disk("pvc-s2", &gp3(2)).await.unwrap();
    let err = c
        .create_snapshot("snap-one", &other.volume_id, &[])
        .await
        .unwrap_err();
    assert!(
        matches!(err, CloudError::IdempotentParameterMismatch { .. }),
        "{err}"
    );
    let by_id = c.get_snapshot_by_id(&s.snapshot_id).await.unwrap();
    assert_eq!(by_id.source_volume_id, d.volume_id);
    let page = c
        .list_snapshots(Some(&d.volume_id), None, None)
        .await
        .unwrap();
    assert_eq!(page.snapshots.len(), 1);
    assert!(
        c.get_snapshot_by_id("snap-0123456789abcdef0")
            .await
            .unwrap_err()
            .is_not_found()
    );
    // Pages smaller than EC2's minimum of 5 still page through everything.
    c.create_snapshot("snap-two", &d.volume_id, &[])
        .await
        .unwrap();
    c.create_snapshot("snap-three", &d.volume_id, &[])
        .await
        .unwrap();
    let first = c
        .list_snapshots(Some(&d.volume_id), Some(2), None)
        .await
        .unwrap();
    assert_eq!(first.snapshots.len(), 2);
    let token = first.next_token.clone().unwrap();
    let second = c
        .list_snapshots(Some(&d.volume_id), Some(2), Some(&token))
        .await
        .unwrap();
    assert_eq!(second.snapshots.len(), 1);
    assert!(second.next_token.is_none());
    let mut seen: Vec<String> = first
        .snapshots
        .iter()
        .chain(&second.snapshots)
        .map(|s| s.snapshot_id.clone())
        .collect();
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 3);
    assert!(
        c.list_snapshots(None, Some(2), Some("skip:x"))
            .await
            .is_err()
    );
    assert!(c.delete_snapshot(&s.snapshot_id).await.unwrap());
    assert!(!c.delete_snapshot(&s.snapshot_id).await.unwrap());

    assert_eq!(c.resize_disk(&d.volume_id, 5).await.unwrap(), 5);
    assert_eq!(c.resize_disk(&d.volume_id, 5).await.unwrap(), 5);
}

#[tokio::test]
async fn modify_disk_is_idempotent_and_tag_disk_adds_and_removes() {
    let env = sim(Timing::Fast, 26).await;
    let c = cloud(&env, true).await;
    let d = c.create_disk("pvc-modify", &gp3(10)).await.unwrap();
    let change = ebs_cloud::DiskModification {
        volume_type: Some("io2".into()),
        iops: Some(3000),
        throughput: None,
    };
    let wait = Duration::from_secs(30);
    assert!(c.modify_disk(&d.volume_id, &change, wait).await.unwrap());
    let after = c.get_disk_by_id(&d.volume_id).await.unwrap();
    assert_eq!(
        (after.volume_type.as_str(), after.iops),
        ("io2", Some(3000))
    );
    // Already in effect: no second ModifyVolume.
    assert!(!c.modify_disk(&d.volume_id, &change, wait).await.unwrap());
    assert_eq!(env.sim.call_counts().get("ModifyVolume").copied(), Some(1));
    let missing = c
        .modify_disk("vol-0123456789abcdef0", &change, wait)
        .await
        .unwrap_err();
    assert!(missing.is_not_found(), "{missing}");

    let add = [("team".to_string(), "storage".to_string())].into();
    c.tag_disk(&d.volume_id, &add, &[]).await.unwrap();
    let tagged = c.get_disk_by_id(&d.volume_id).await.unwrap();
    assert_eq!(tagged.tags.get("team").map(String::as_str), Some("storage"));
    c.tag_disk(&d.volume_id, &Default::default(), &["team".to_string()])
        .await
        .unwrap();
    let untagged = c.get_disk_by_id(&d.volume_id).await.unwrap();
    assert!(!untagged.tags.contains_key("team"));
    let missing = c
        .tag_disk("vol-0123456789abcdef0", &add, &[])
        .await
        .unwrap_err();
    assert!(missing.is_not_found(), "{missing}");
}
