//! AWS rules that need state moto never reaches or does not model: attachment limits,
//! attachment points, instance states, ModifyVolume and tag rules, RunInstances tokens, and
//! state that survives a restart.

use aws_sdk_ec2::types::{InstanceType, Placement, VolumeAttachmentState, VolumeType};
use ec2_conformance::{SimServer, client, wait};

use crate::common::*;

async fn attach(t: &Target, vol: &str, inst: &str, device: &str) -> Result<(), String> {
    t.client
        .attach_volume()
        .volume_id(vol)
        .instance_id(inst)
        .device(device)
        .send()
        .await
        .map(|_| ())
        .map_err(|e| ec2_conformance::failure(&e).code.unwrap_or_default())
}

#[tokio::test]
async fn attachment_limit_per_instance() {
    let t = sim_with(|c| c.max_attachments_per_instance = 2);
    let c = &t.client;
    let inst = instance(c, ZONE_A).await;
    let mut vols = Vec::new();
    for _ in 0..3 {
        vols.push(available_volume(c, ZONE_A, 1).await);
    }
    attach(&t, &vols[0], &inst, "/dev/xvdba").await.unwrap();
    attach(&t, &vols[1], &inst, "/dev/xvdbb").await.unwrap();
    assert_eq!(
        attach(&t, &vols[2], &inst, "/dev/xvdbc").await,
        Err("AttachmentLimitExceeded".into())
    );
    // Another instance has its own slots.
    let other = instance(c, ZONE_A).await;
    attach(&t, &vols[2], &other, "/dev/xvdbc").await.unwrap();
}

#[tokio::test]
async fn multi_attach_limit_and_detach_needs_instance() {
    let t = sim();
    let c = &t.client;
    let out = c
        .create_volume()
        .availability_zone(ZONE_A)
        .size(4)
        .volume_type(VolumeType::Io2)
        .iops(100)
        .multi_attach_enabled(true)
        .send()
        .await
        .unwrap();
    let vol = out.volume_id().unwrap().to_string();
    wait::volume_state(c, &vol, aws_sdk_ec2::types::VolumeState::Available, WAIT)
        .await
        .unwrap();
    let run = c
        .run_instances()
        .image_id("ami-12345678")
        .min_count(17)
        .max_count(17)
        .placement(Placement::builder().availability_zone(ZONE_A).build())
        .send()
        .await
        .unwrap();
    let instances: Vec<String> = run
        .instances()
        .iter()
        .map(|i| i.instance_id().unwrap().to_string())
        .collect();
    assert_eq!(instances.len(), 17);
    for inst in &instances[..16] {
        attach(&t, &vol, inst, "/dev/xvdba").await.unwrap();
    }
    // Multi-Attach: at most 16 instances; and not twice to the same one.
    assert_eq!(
        attach(&t, &vol, &instances[16], "/dev/xvdba").await,
        Err("AttachmentLimitExceeded".into())
    );
    assert_eq!(
        attach(&t, &vol, &instances[0], "/dev/xvdbb").await,
        Err("VolumeInUse".into())
    );
    // Which attachment to detach is ambiguous without an instance.
    let ambiguous = c.detach_volume().volume_id(&vol).send().await;
    assert_eq!(code_of(ambiguous), "InvalidParameterCombination");
    c.detach_volume()
        .volume_id(&vol)
        .instance_id(&instances[3])
        .send()
        .await
        .unwrap();
    wait::detached(c, &vol, &instances[3], WAIT).await.unwrap();
    let v = wait::describe_volume(c, &vol).await.unwrap().unwrap();
    assert_eq!(v.attachments().len(), 15);
}

#[tokio::test]
async fn attachment_points_and_instance_states() {
    let t = sim();
    let c = &t.client;
    let inst = instance(c, ZONE_A).await;
    let a = available_volume(c, ZONE_A, 1).await;
    let b = available_volume(c, ZONE_A, 1).await;
    // /dev/sdf and /dev/xvdf are one attachment point; /dev/xvda is the root volume's.
    attach(&t, &a, &inst, "/dev/sdf").await.unwrap();
    assert_eq!(
        attach(&t, &b, &inst, "/dev/xvdf").await,
        Err("InvalidParameterValue".into())
    );
    assert_eq!(
        attach(&t, &b, &inst, "/dev/xvda").await,
        Err("InvalidParameterValue".into())
    );
    // After the detach the point is free again.
    c.detach_volume()
        .volume_id(&a)
        .instance_id(&inst)
        .send()
        .await
        .unwrap();
    wait::detached(c, &a, &inst, WAIT).await.unwrap();
    attach(&t, &b, &inst, "/dev/xvdf").await.unwrap();

    // A terminated instance takes no attachments.
    c.terminate_instances()
        .instance_ids(&inst)
        .send()
        .await
        .unwrap();
    assert_eq!(
        attach(&t, &a, &inst, "/dev/xvdg").await,
        Err("IncorrectInstanceState".into())
    );
    // Its volumes were detached by the termination.
    let (v, _) = wait::detached(c, &b, &inst, WAIT).await.unwrap();
    assert!(v.unwrap().attachments().is_empty());
}

#[tokio::test]
async fn modify_volume_rules() {
    let t = sim();
    let c = &t.client;
    let vol = available_volume(c, ZONE_A, 10).await;
    let nothing = c.modify_volume().volume_id(&vol).send().await;
    assert_eq!(code_of(nothing), "MissingParameter");
    let same = c.modify_volume().volume_id(&vol).size(10).send().await;
    assert_eq!(code_of(same), "InvalidParameterCombination");
    let too_many_iops = c.modify_volume().volume_id(&vol).iops(6000).send().await;
    assert_eq!(
        code_of(too_many_iops),
        "InvalidParameterValue",
        "6000 IOPS on 10 GiB"
    );
    let never = c
        .describe_volumes_modifications()
        .volume_ids(&vol)
        .send()
        .await;
    assert_eq!(code_of(never), "InvalidVolumeModification.NotFound");
    // A type change: gp3 -> io2 keeps its IOPS.
    let out = c
        .modify_volume()
        .volume_id(&vol)
        .volume_type(VolumeType::Io2)
        .send()
        .await
        .unwrap();
    let m = out.volume_modification().unwrap();
    assert_eq!(m.original_volume_type(), Some(&VolumeType::Gp3));
    assert_eq!(m.target_volume_type(), Some(&VolumeType::Io2));
    assert_eq!(m.target_iops(), Some(3000));
}

#[tokio::test]
async fn tag_rules() {
    let t = sim();
    let c = &t.client;
    let vol = available_volume(c, ZONE_A, 1).await;
    let reserved = c
        .create_tags()
        .resources(&vol)
        .tags(tag("aws:reserved", "x"))
        .send()
        .await;
    assert_eq!(code_of(reserved), "InvalidParameterValue");
    let bad_id = c
        .create_tags()
        .resources("ami-12345678")
        .tags(tag("a", "b"))
        .send()
        .await;
    assert_eq!(code_of(bad_id), "InvalidID");
    let mut many = c.create_tags().resources(&vol);
    for i in 0..51 {
        many = many.tags(tag(&format!("k{i}"), "v"));
    }
    assert_eq!(code_of(many.send().await), "TagLimitExceeded");
    // Instances and snapshots take tags as well.
    let inst = instance(c, ZONE_A).await;
    c.create_tags()
        .resources(&inst)
        .tags(tag("role", "node"))
        .send()
        .await
        .unwrap();
    let desc = c
        .describe_instances()
        .instance_ids(&inst)
        .send()
        .await
        .unwrap();
    assert_eq!(
        tag_pairs(desc.reservations()[0].instances()[0].tags()),
        pairs(&[("role", "node")])
    );
    // DeleteTags without tags removes all of them.
    c.create_tags()
        .resources(&vol)
        .tags(tag("a", "1"))
        .tags(tag("b", "2"))
        .send()
        .await
        .unwrap();
    c.delete_tags().resources(&vol).send().await.unwrap();
    let v = wait::describe_volume(c, &vol).await.unwrap().unwrap();
    assert!(v.tags().is_empty(), "{:?}", v.tags());
}

#[tokio::test]
async fn run_instances_rules() {
    let t = sim();
    let c = &t.client;
    let run = |token: &'static str, count: i32| {
        c.run_instances()
            .image_id("ami-12345678")
            .instance_type(InstanceType::M5Large)
            .min_count(count)
            .max_count(count)
            .client_token(token)
            .send()
    };
    let first = run("node-token", 1).await.unwrap();
    let again = run("node-token", 1).await.unwrap();
    assert_eq!(
        first.instances()[0].instance_id(),
        again.instances()[0].instance_id()
    );
    assert_eq!(
        code_of(run("node-token", 2).await),
        "IdempotentParameterMismatch"
    );
    assert_eq!(code_of(run("too-many", 101).await), "InstanceLimitExceeded");
    // Default placement: the first zone.
    assert_eq!(
        first.instances()[0]
            .placement()
            .and_then(|p| p.availability_zone()),
        Some(ZONE_A)
    );
}

#[tokio::test]
async fn state_survives_a_restart() {
    let state = tempfile::tempdir().unwrap();
    let dir = state.path().join("sim");
    let (vol, inst) = {
        let sim = SimServer::start_with(|c| c.state_dir = dir.clone()).unwrap();
        let c = client(sim.endpoint());
        let vol = available_volume(&c, ZONE_A, 3).await;
        let inst = instance(&c, ZONE_A).await;
        c.attach_volume()
            .volume_id(&vol)
            .instance_id(&inst)
            .device("/dev/xvdba")
            .send()
            .await
            .unwrap();
        wait::attachment_state(&c, &vol, &inst, VolumeAttachmentState::Attached, WAIT)
            .await
            .unwrap();
        c.create_volume()
            .availability_zone(ZONE_A)
            .size(3)
            .client_token("before-restart")
            .send()
            .await
            .unwrap();
        sim.shutdown().unwrap();
        (vol, inst)
    };
    let sim = SimServer::start_with(|c| c.state_dir = dir.clone()).unwrap();
    let c = client(sim.endpoint());
    let v = wait::describe_volume(&c, &vol).await.unwrap().unwrap();
    assert_eq!(v.size(), Some(3));
    assert_eq!(v.attachments()[0].instance_id(), Some(inst.as_str()));
    assert_eq!(
        v.attachments()[0].state(),
        Some(&VolumeAttachmentState::Attached)
    );
    // Client tokens survive too: a changed request under the old token is a mismatch.
    let mismatch = c
        .create_volume()
        .availability_zone(ZONE_A)
        .size(4)
        .client_token("before-restart")
        .send()
        .await;
    assert_eq!(code_of(mismatch), "IdempotentParameterMismatch");
    assert_eq!(
        c.describe_volumes().send().await.unwrap().volumes().len(),
        2
    );
}

#[tokio::test]
async fn volume_from_a_pending_snapshot_is_incorrect_state() {
    // Realistic timing: a snapshot stays pending for seconds.
    let t = sim_with(|c| c.timing = ec2_sim::Timing::Realistic);
    let c = &t.client;
    let vol = available_volume(c, ZONE_A, 2).await;
    let snap = c.create_snapshot().volume_id(&vol).send().await.unwrap();
    let early = c
        .create_volume()
        .availability_zone(ZONE_A)
        .snapshot_id(snap.snapshot_id().unwrap())
        .send()
        .await;
    assert_eq!(code_of(early), "IncorrectState");
}

#[tokio::test]
async fn describe_instances_and_snapshots_filters_and_pages() {
    let t = sim();
    let c = &t.client;
    let run = c
        .run_instances()
        .image_id("ami-12345678")
        .min_count(6)
        .max_count(6)
        .placement(Placement::builder().availability_zone(ZONE_B).build())
        .send()
        .await
        .unwrap();
    let ids: Vec<String> = run
        .instances()
        .iter()
        .map(|i| i.instance_id().unwrap().to_string())
        .collect();
    c.terminate_instances()
        .instance_ids(&ids[0])
        .send()
        .await
        .unwrap();

    let page = c.describe_instances().max_results(5).send().await.unwrap();
    let first: Vec<&str> = page
        .reservations()
        .iter()
        .flat_map(|r| r.instances())
        .filter_map(|i| i.instance_id())
        .collect();
    assert_eq!(first.len(), 5);
    let rest = c
        .describe_instances()
        .max_results(5)
        .next_token(page.next_token().unwrap())
        .send()
        .await
        .unwrap();
    let rest: Vec<&str> = rest
        .reservations()
        .iter()
        .flat_map(|r| r.instances())
        .filter_map(|i| i.instance_id())
        .collect();
    assert_eq!(rest.len(), 1);
    let with_ids = c
        .describe_instances()
        .instance_ids(&ids[1])
        .max_results(5)
        .send()
        .await;
    assert_eq!(code_of(with_ids), "InvalidParameterCombination");

    // One request with both states: with fast timing `shutting-down` lasts ~20 ms, so two
    // separate requests could see the instance in both states (or in neither).
    let leaving = c
        .describe_instances()
        .filters(
            aws_sdk_ec2::types::Filter::builder()
                .name("instance-state-name")
                .values("shutting-down")
                .values("terminated")
                .build(),
        )
        .filters(
            aws_sdk_ec2::types::Filter::builder()
                .name("availability-zone")
                .values(ZONE_B)
                .build(),
        )
        .send()
        .await
        .unwrap();
    let found: Vec<&str> = leaving
        .reservations()
        .iter()
        .flat_map(|r| r.instances())
        .filter_map(|i| i.instance_id())
        .collect();
    assert_eq!(found, [ids[0].as_str()]);

    // DescribeSnapshots: our own by `self`, nobody else's.
    let vol = available_volume(c, ZONE_B, 1).await;
    let snap = c.create_snapshot().volume_id(&vol).send().await.unwrap();
    let mine = c
        .describe_snapshots()
        .owner_ids("self")
        .send()
        .await
        .unwrap();
    assert_eq!(
        mine.snapshots()
            .iter()
            .filter_map(|s| s.snapshot_id())
            .collect::<Vec<_>>(),
        [snap.snapshot_id().unwrap()]
    );
    let others = c
        .describe_snapshots()
        .owner_ids("999999999999")
        .send()
        .await
        .unwrap();
    assert!(others.snapshots().is_empty());
}
