//! RunInstances / DescribeInstances / TerminateInstances, with block device mappings.

use aws_sdk_ec2::types::{
    BlockDeviceMapping, EbsBlockDevice, InstanceStateName, InstanceType, Placement,
    VolumeAttachmentState, VolumeState, VolumeType,
};
use ec2_conformance::{Flavor, wait};

use crate::common::*;

crate::both_endpoints!(
    run_describe_terminate,
    run_with_block_device_mappings,
    instance_errors
);

async fn run_describe_terminate(t: &Target) {
    let c = &t.client;
    let out = c
        .run_instances()
        .image_id("ami-12345678")
        .instance_type(InstanceType::M5Large)
        .min_count(2)
        .max_count(2)
        .placement(Placement::builder().availability_zone(ZONE_B).build())
        .send()
        .await
        .unwrap();
    assert!(out.reservation_id().unwrap().starts_with("r-"));
    let instances = out.instances();
    assert_eq!(instances.len(), 2);
    let ids: Vec<String> = instances
        .iter()
        .map(|i| i.instance_id().unwrap().to_string())
        .collect();
    for i in instances {
        let id = i.instance_id().unwrap();
        assert!(id.starts_with("i-") && id.len() == 19, "{id}");
        assert_eq!(i.image_id(), Some("ami-12345678"));
        assert_eq!(i.instance_type(), Some(&InstanceType::M5Large));
        assert_eq!(
            i.placement().and_then(|p| p.availability_zone()),
            Some(ZONE_B)
        );
        assert_eq!(
            i.state().and_then(|s| s.name()),
            Some(&InstanceStateName::Pending)
        );
        assert_recent("LaunchTime", i.launch_time());
    }

    // Pending becomes running.
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let desc = c
            .describe_instances()
            .set_instance_ids(Some(ids.clone()))
            .send()
            .await
            .unwrap();
        let states: Vec<InstanceStateName> = desc
            .reservations()
            .iter()
            .flat_map(|r| r.instances())
            .filter_map(|i| i.state().and_then(|s| s.name()).cloned())
            .collect();
        assert_eq!(states.len(), 2);
        if states.iter().all(|s| *s == InstanceStateName::Running) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{states:?}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }

    // A data volume on the first one, then terminate it: the volume comes free.
    let vol = available_volume(c, ZONE_B, 4).await;
    c.attach_volume()
        .volume_id(&vol)
        .instance_id(&ids[0])
        .device("/dev/xvdba")
        .send()
        .await
        .unwrap();
    wait::attachment_state(c, &vol, &ids[0], VolumeAttachmentState::Attached, WAIT)
        .await
        .unwrap();
    let out = c
        .terminate_instances()
        .instance_ids(&ids[0])
        .send()
        .await
        .unwrap();
    let change = &out.terminating_instances()[0];
    assert_eq!(change.instance_id(), Some(ids[0].as_str()));
    assert_eq!(
        change.previous_state().and_then(|s| s.name()),
        Some(&InstanceStateName::Running)
    );
    assert_eq!(
        change.current_state().and_then(|s| s.name()),
        Some(&InstanceStateName::ShuttingDown)
    );
    let (v, _) = wait::detached(c, &vol, &ids[0], WAIT).await.unwrap();
    assert_eq!(v.unwrap().state(), Some(&VolumeState::Available));

    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let desc = c
            .describe_instances()
            .instance_ids(&ids[0])
            .send()
            .await
            .unwrap();
        let state = desc.reservations()[0].instances()[0]
            .state()
            .and_then(|s| s.name())
            .cloned();
        if state == Some(InstanceStateName::Terminated) {
            break;
        }
        // shutting-down until then, never anything else.
        assert_eq!(state, Some(InstanceStateName::ShuttingDown));
        assert!(std::time::Instant::now() < deadline, "{state:?}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // The other instance is untouched.
    let desc = c
        .describe_instances()
        .instance_ids(&ids[1])
        .send()
        .await
        .unwrap();
    assert_eq!(
        desc.reservations()[0].instances()[0]
            .state()
            .and_then(|s| s.name()),
        Some(&InstanceStateName::Running)
    );
}

async fn run_with_block_device_mappings(t: &Target) {
    let c = &t.client;
    let out = c
        .run_instances()
        .image_id("ami-12345678")
        .min_count(1)
        .max_count(1)
        .placement(Placement::builder().availability_zone(ZONE_A).build())
        .block_device_mappings(
            BlockDeviceMapping::builder()
                .device_name("/dev/sdf")
                .ebs(
                    EbsBlockDevice::builder()
                        .volume_size(20)
                        .volume_type(VolumeType::Gp3)
                        .delete_on_termination(true)
                        .build(),
                )
                .build(),
        )
        .send()
        .await
        .unwrap();
    let inst = out.instances()[0].instance_id().unwrap().to_string();
    let desc = c
        .describe_instances()
        .instance_ids(&inst)
        .send()
        .await
        .unwrap();
    let i = &desc.reservations()[0].instances()[0];
    let m = i
        .block_device_mappings()
        .iter()
        .find(|m| m.device_name() == Some("/dev/sdf"))
        .unwrap_or_else(|| panic!("no /dev/sdf in {:?}", i.block_device_mappings()));
    let ebs = m.ebs().unwrap();
    assert_eq!(ebs.delete_on_termination(), Some(true));
    let vol = ebs.volume_id().unwrap().to_string();
    let v = wait::describe_volume(c, &vol).await.unwrap().unwrap();
    assert_eq!(v.size(), Some(20));
    assert_eq!(v.volume_type(), Some(&VolumeType::Gp3));
    assert_eq!(v.availability_zone(), Some(ZONE_A));
    let a = &v.attachments()[0];
    assert_eq!(a.instance_id(), Some(inst.as_str()));
    assert_eq!(a.device(), Some("/dev/sdf"));
    match t.flavor {
        Flavor::Aws => assert_eq!(a.delete_on_termination(), Some(true)),
        // moto leaves DeleteOnTermination out of DescribeVolumes attachments.
        Flavor::Moto => assert_eq!(a.delete_on_termination(), None),
    }

    // DeleteOnTermination: the volume goes with the instance.
    c.terminate_instances()
        .instance_ids(&inst)
        .send()
        .await
        .unwrap();
    wait::gone(c, &vol, WAIT).await.unwrap();
}

async fn instance_errors(t: &Target) {
    let c = &t.client;
    let absent = "i-0123456789abcdef0";
    let result = c.terminate_instances().instance_ids(absent).send().await;
    assert_eq!(code_of(result), "InvalidInstanceID.NotFound");
    let vol = available_volume(c, ZONE_A, 4).await;
    let result = c
        .attach_volume()
        .volume_id(&vol)
        .instance_id(absent)
        .device("/dev/xvdba")
        .send()
        .await;
    assert_eq!(code_of(result), "InvalidInstanceID.NotFound");
    let result = c
        .run_instances()
        .image_id("ami-12345678")
        .min_count(1)
        .max_count(1)
        .placement(Placement::builder().availability_zone("us-east-1z").build())
        .send()
        .await;
    assert_eq!(code_of(result), "InvalidParameterValue");
    let result = c
        .run_instances()
        .image_id("ami-12345678")
        .min_count(1)
        .max_count(1)
        .dry_run(true)
        .send()
        .await;
    assert_eq!(code_of(result), "DryRunOperation");
}
